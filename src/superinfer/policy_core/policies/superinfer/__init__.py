"""``superinfer``: the SLO-aware rotation scheduler (DESIGN §5).

Requests live in ``num_tiers`` tiers. Tier ``t`` has a quantum of ``quantum_base_tokens *
quantum_growth**t`` tokens of service and a weight ``tier_weight_ratio**(K-1-t)``; each step's
token budget is shared across the tiers that have work by stride scheduling on those weights
(Waldspurger and Weihl, "Stride scheduling", MIT/LCS/TM-528, 1995), so a tier with weight
``w_t`` receives ``w_t / sum(w)`` of the tokens whenever every tier is backlogged. Inside a tier
the most urgent request goes first (earliest TTFT deadline, or least slack for a deadline class).

* **Skip-join** (FastServe, Wu et al., arXiv:2305.05920): a request starts in its class's tier
  (latency classes 0, deadline classes ``deadline_class_tier``, others the last) and skips every
  tier whose quantum its prompt would exhaust in prefill.
* **Demotion** after a request uses its tier's quantum; **aging** lifts any request queued for
  ``aging_s`` (a deadline class: and for ``aging_deadline_fraction`` of its deadline budget
  since arrival, so deadline-aware promotion serves it first) above every tier, oldest first,
  and keeps it there until its first token: it is
  not demoted, rotated out or chosen to make room while any other request can be, so no
  preemption sends it back to wait again, which bounds every wait for a first token.
* **Deadline-aware promotion**: a request is moved to tier 0 when its estimated remaining time
  (prefill left at the current chunk size, plus predicted remaining output tokens times the
  current step time) exceeds its slack minus ``promotion_margin_s``. Remaining output comes from
  :class:`OutputLengthEstimator` (finished requests only), step time from :class:`StepTimeModel`.
* **Best-effort demotion**: a request that can no longer meet its SLO under any schedule goes to
  the last tier, so it stops taking service from requests that still can.
* **TPOT protection**: while requests of a class with a TPOT target decode, each step's prefill
  tokens are sized so the step ends within the smallest TPOT allowance among them
  (``tpot * generated - time since first token``, i.e. what keeps its mean TPOT on target;
  ``tpot`` is the target times ``tpot_plan_share``, 1.0 by default, below 1 a margin),
  the Sarathi-Serve idea (Agrawal et al., OSDI 2024) driven by SLO slack instead of a constant.
  A TTFT-urgent prefill may grow the step further, against the decodes' TPOT credit. On an
  engine whose prefill steps run alone (``StepState.mixed_batches`` false: SGLang's default),
  the prefill step and the decode step after it must both fit the allowance, a prefill step
  under ``min_prefill_tokens`` gives way to a decode step, and the boost
  (``ttft_boost_unmixed``, on by default) runs an urgent prompt whole or not at all.
* **Rotation through HBM** (RotaSched in SuperInfer, MLSys 2026, made engine-agnostic): with a
  CPU KV tier, running requests of worse tiers that have had their slice of service are swapped
  out proactively when better-tier work is blocked or HBM runs low, within the link's bytes per
  step, and resume when their tier's turn comes; promoted swapped requests are prefetched.
  Preemption picks the lowest tier and chooses swap or recompute by :mod:`kv_cost`. Without a
  CPU tier (``total_cpu_blocks == 0``) the policy only ever recomputes.
* **Admission control**: at most ``max_waiting_per_tier`` requests wait per tier and replica;
  beyond that the least important one is rejected with a reason.

Per-call work is incremental: the policy keeps per-replica, per-tier heaps updated from the
lifecycle hooks and its own decisions, visits the running requests the change set says need it
(``running``; all of them without a usable change set), and reads queued views
through the engine's id -> view map (``StepState.views``; without one, ``state.waiting`` and
``state.swapped`` in one pass, into an index, in calls that admit or resume; see
:meth:`SuperInferPolicy.schedule`). Every rule
and default is tabulated in ``docs/policies.md``.

Modules, bottom layer first (each imports only the ones before it; the policy class is the
top of one inheritance chain through them):

* ``records``: what is remembered per request and per replica, the running books and their
  prefill lanes (sorted across calls), and the decision being built;
* ``config``: the hyperparameters (``--policy-opt``), their validation, the initial books;
* ``estimates``: remaining output, work left, the in-tier key, when a request is next checked;
* ``queues``: initial tier (skip-join), tier changes, the waiting and swapped heaps per tier;
* ``preemption``: the victim ranking, swap or recompute, making room, KV shortage relief;
* ``admission``: admitting and resuming into a step; bounded queues and shedding;
* ``promotion``: aging, best-effort demotion (or rejection), deadline-aware promotion;
* ``running``: the running pass (refresh, demotion, due checks, decodes), kept across calls from
  the change set's decode advances;
* ``budget``: one token per decode, TPOT protection and the TTFT boost;
* ``rotation``: stride scheduling of prefill tokens across tiers, rotation through HBM,
  prefetch of promoted swapped requests;
* ``policy``: :class:`SuperInferPolicy`, the lifecycle hooks and ``schedule()``.
"""

# ``_opt`` (the field helper subclasses such as the oracle use) stays importable from here.
from superinfer.policy_core.policies.superinfer.config import SuperInferConfig as SuperInferConfig
from superinfer.policy_core.policies.superinfer.config import _opt as _opt
from superinfer.policy_core.policies.superinfer.policy import SuperInferPolicy

__all__ = ["SuperInferPolicy"]
