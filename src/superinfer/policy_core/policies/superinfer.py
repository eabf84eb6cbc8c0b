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
  ``aging_s`` above every tier, oldest first, and keeps it there until its first token: it is
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
  (``tpot * generated - time since first token``, i.e. what keeps its mean TPOT on target),
  the Sarathi-Serve idea (Agrawal et al., OSDI 2024) driven by SLO slack instead of a constant.
  A TTFT-urgent prefill may grow the step further, against the decodes' TPOT credit.
* **Rotation through HBM** (RotaSched in SuperInfer, MLSys 2026, made engine-agnostic): with a
  CPU KV tier, running requests of worse tiers that have had their slice of service are swapped
  out proactively when better-tier work is blocked or HBM runs low, within the link's bytes per
  step, and resume when their tier's turn comes; promoted swapped requests are prefetched.
  Preemption picks the lowest tier and chooses swap or recompute by :mod:`kv_cost`. Without a
  CPU tier (``total_cpu_blocks == 0``) the policy only ever recomputes.
* **Admission control**: at most ``max_waiting_per_tier`` requests wait per tier and replica;
  beyond that the least important one is rejected with a reason.

Per-call work is incremental: the policy keeps per-replica, per-tier heaps updated from the
lifecycle hooks and its own decisions, walks ``state.running`` once, and reads
``state.waiting`` and ``state.swapped`` (one pass, into an index) only in calls that admit or
resume (see :meth:`SuperInferPolicy.schedule`). Every rule
and default is tabulated in ``docs/policies.md``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from superinfer.policy_core.batching import blocks_for_tokens, step_blocks
from superinfer.policy_core.estimators import OutputLengthEstimator, StepTimeModel
from superinfer.policy_core.kv_cost import has_cpu_tier, preempt_mode
from superinfer.policy_core.protocols import BasePolicy
from superinfer.policy_core.types import (
    PreemptMode,
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)

__all__ = ["SuperInferPolicy"]

_WAITING, _RUNNING, _SWAPPED, _GONE = 0, 1, 2, 3
_INF = math.inf


def _decode_blocks(v: RequestView, bs: int) -> int:
    """HBM blocks a running request's next decode token takes, as ``step_blocks(v, 1, state,
    admit=False)`` counts them (the engines' decision check): the FP16 pages its tokens fill minus
    the blocks it holds. For a request whose KV is quantized that overstates its growth (its
    blocks hold more tokens), the same way for the policy and the check."""
    return -(-(v.computed_tokens + 1) // bs) - v.kv_blocks


#: In-tier key offset that puts best-effort requests behind every feasible one (keys are instants,
#: s; 1e9 s is beyond any trace).
_BEST_EFFORT_KEY = 1e9


def _opt(default: Any, text: str) -> Any:
    """A config field with a default and its ``--policy-opt`` help text."""
    return field(default=default, metadata={"help": text})


class _Entry:
    """What the policy remembers about one live request."""

    __slots__ = (
        "rid",
        "slo_name",
        "weight",
        "arrival_s",
        "ttft_s",
        "tpot_s",
        "deadline_s",
        "replica",
        "where",
        "view",
        "stale",
        "tier",
        "reported_tier",
        "version",
        "check_version",
        "key",
        "queued_s",
        "lost_tokens",
        "demote_at",
        "resident_service",
        "best_effort",
        "aged",
        "next_check_s",
    )

    def __init__(self, view: RequestView) -> None:
        slo = view.slo
        self.rid = view.request_id
        self.slo_name = slo.name
        self.weight = slo.weight
        self.arrival_s = view.arrival_s
        self.ttft_s = None if slo.ttft_ms is None else slo.ttft_ms / 1e3
        self.tpot_s = None if slo.tpot_ms is None else slo.tpot_ms / 1e3
        self.deadline_s = None if slo.deadline_s is None else view.arrival_s + slo.deadline_s
        self.replica = view.replica
        self.where = _WAITING
        self.view = view
        self.stale = False
        self.tier = 0
        self.reported_tier = view.tier
        self.version = 0
        self.check_version = 0
        self.key = 0.0
        self.queued_s = view.arrival_s
        self.lost_tokens = 0
        self.demote_at: float = _INF
        self.resident_service = 0
        self.best_effort = False
        self.aged = False
        self.next_check_s = _INF


def _entry_key(e: _Entry) -> float:
    return e.key


class _Replica:
    """Per-replica queues: waiting and swapped heaps per tier, aged and due heaps."""

    def __init__(self, index: int, num_tiers: int) -> None:
        self.index = index
        self.waiting: dict[str, _Entry] = {}
        self.swapped: dict[str, _Entry] = {}
        self.heaps: list[list[tuple[float, int, str, int]]] = [[] for _ in range(num_tiers)]
        self.swap_heaps: list[list[tuple[float, int, str, int]]] = [[] for _ in range(num_tiers)]
        self.shed_heaps: list[list[tuple[int, float, float, int, str, int]]] = [
            [] for _ in range(num_tiers)
        ]
        self.count = [0] * num_tiers  # waiting (not aged) per tier
        self.aged: list[tuple[float, int, str, int]] = []
        self.due: list[tuple[float, int, str, int]] = []
        self.passes = [0.0] * num_tiers
        self.active = [False] * num_tiers
        self.num_stale = 0
        self.prefill_chunk_tokens = 0.0  # last step's prefill allowance (for estimates)
        self.num_decodes = 0
        self.next_running_check_s = _INF
        self.unreported: list[_Entry] = []  # new entries whose tier the engine has not seen
        self.token_budget = 1 << 30  # the replica's step token budget, once a state showed it


@dataclass
class _Step:
    """The decision being built for one call (mutable scratch)."""

    state: StepState
    free: int
    budget: int
    seats: int
    free_cpu: int
    swap_out_bytes: float
    swap_in_bytes: float
    tokens: dict[str, int] = field(default_factory=dict)
    new_blocks: dict[str, int] = field(default_factory=dict)
    admit: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)
    preempt: dict[str, PreemptMode] = field(default_factory=dict)
    reject: dict[str, str] = field(default_factory=dict)
    prefetch: list[str] = field(default_factory=list)
    changed: list[_Entry] = field(default_factory=list)
    queued_views: dict[str, RequestView] | None = None  # built on the first admission attempt
    worst_tier: int = -1  # worst tier among running requests (nothing to preempt below it)


@dataclass
class SuperInferPolicy(BasePolicy):
    """The SLO-aware rotation scheduler; see the module docstring for the mechanisms.

    Every attribute below is a hyperparameter (``superinfer bench --policy-opt key=value``),
    validated on construction.

    Raises:
        ValueError: on construction, naming the first invalid hyperparameter.
    """

    num_tiers: int = _opt(4, "number of tiers K (tier 0 is served most)")
    quantum_base_tokens: int = _opt(8192, "quantum of tier 0, tokens of service before demotion")
    quantum_growth: float = _opt(4.0, "quantum of tier t is quantum_base_tokens * growth**t")
    tier_weight_ratio: float = _opt(
        8.0, "tier t's weight is ratio**(K-1-t): its share of a contended token budget"
    )
    deadline_class_tier: int = _opt(
        2, "initial tier of classes with only a deadline (latency classes start at 0)"
    )
    rotation_unit_tokens: int = _opt(128, "tokens handed to a tier per stride-scheduling turn")
    tpot_safety: float = _opt(
        0.9, "fraction of the smallest TPOT allowance a step may take (TPOT protection)"
    )
    min_prefill_tokens: int = _opt(
        256, "prefill tokens a step may always run, whatever the TPOT allowance"
    )
    ttft_boost: bool = _opt(
        True, "grow prefill chunks for a TTFT-urgent prefill when decodes have TPOT credit"
    )
    ttft_plan_fraction: float = _opt(
        0.6, "the TTFT boost plans a prefill to end within this fraction of its slack"
    )
    credit_quantile: float = _opt(
        0.2, "quantile of a decode's remaining tokens counted as future TPOT credit (boost)"
    )
    promotion: bool = _opt(True, "deadline-aware promotion to tier 0")
    promotion_margin_s: float = _opt(0.0, "promote when estimate > slack - margin, s")
    estimate_lookahead: float = _opt(
        0.5, "waiting requests are re-checked this fraction of their estimate before it is due"
    )
    best_effort_demotion: bool = _opt(
        True,
        "requests that can no longer meet their SLO go behind every request that still can "
        "(see best_effort_tier)",
    )
    best_effort_tier: str = _opt(
        "keep",
        "where best-effort requests go: 'keep' their tier, behind its feasible requests, so a "
        "missed first token still comes before lower-tier work; 'last': the last tier",
    )
    reject_hopeless: bool = _opt(
        False, "reject (instead of demoting) waiting requests that can no longer meet their SLO"
    )
    aging: bool = _opt(True, "lift requests queued longer than aging_s above every tier")
    aging_s: float = _opt(120.0, "queueing time after which a request is aged, s")
    max_waiting_per_tier: int = _opt(
        4096, "bounded queue: waiting requests per tier and replica before shedding"
    )
    rotation: bool = _opt(
        True, "rotation through HBM: proactive swap-out and resume (needs a CPU KV tier)"
    )
    rotation_slice_tokens: int = _opt(
        512, "service a tier-0 request keeps in HBM before it may rotate out (x growth**tier)"
    )
    rotation_watermark: float = _opt(
        0.05, "free HBM fraction below which rotation swaps out proactively"
    )
    swap_budget_fraction: float = _opt(
        1.0, "fraction of the link's bytes per step that rotation may use, each direction"
    )
    kv_watermark: float = _opt(0.01, "free HBM fraction admissions leave for decode growth")
    max_preemptions_per_step: int = _opt(8, "most requests preempted to admit better-tier work")
    recheck_s: float = _opt(1.0, "a running request's deadline is re-checked at least this often")
    max_repeat_steps: int = _opt(1024, "most decode-only steps the engine may repeat unasked")
    estimator_window: int = _opt(4096, "finished requests per class the length estimator keeps")
    estimator_min_samples: int = _opt(32, "finished requests before the estimator is used")
    prior_step_s: float = _opt(0.02, "step-time prior: fixed cost per step, s")
    prior_prefill_token_s: float = _opt(1.5e-4, "step-time prior: s per prefill token")
    prior_decode_seq_s: float = _opt(1e-4, "step-time prior: s per decoding sequence")
    step_time_forgetting: float = _opt(0.995, "forgetting factor of the step-time fit")
    name: str = "superinfer"

    def __post_init__(self) -> None:
        self._validate()
        k = self.num_tiers
        self._quanta = [self.quantum_base_tokens * self.quantum_growth**t for t in range(k)]
        self._quanta[-1] = _INF
        self._weights = [self.tier_weight_ratio ** (k - 1 - t) for t in range(k)]
        self._slices = [self.rotation_slice_tokens * self.quantum_growth**t for t in range(k)]
        self._entries: dict[str, _Entry] = {}
        self._replicas: dict[int, _Replica] = {}
        self._seq = 0
        self._step_ewma_s = 0.0
        self._counters = {
            "saw_cpu_tier": 0,
            "swap_out_bytes": 0,
            "swap_in_bytes": 0,
            "prefetch_bytes": 0,
            "promotions": 0,
            "demotions": 0,
            "best_effort": 0,
            "aged": 0,
            "rejected": 0,
        }
        self.estimator = OutputLengthEstimator(
            window=self.estimator_window, min_samples=self.estimator_min_samples
        )
        self.step_time = StepTimeModel(
            prior_step_s=self.prior_step_s,
            prior_prefill_token_s=self.prior_prefill_token_s,
            prior_decode_seq_s=self.prior_decode_seq_s,
            forgetting=self.step_time_forgetting,
        )

    def _validate(self) -> None:
        n = self.name
        positive_ints = (
            "num_tiers",
            "quantum_base_tokens",
            "rotation_unit_tokens",
            "min_prefill_tokens",
            "max_waiting_per_tier",
            "rotation_slice_tokens",
            "max_repeat_steps",
            "estimator_window",
            "estimator_min_samples",
        )
        for key in positive_ints:
            if getattr(self, key) < 1:
                raise ValueError(f"{n}: {key} must be >= 1, got {getattr(self, key)}")
        for key in ("quantum_growth", "tier_weight_ratio"):
            if not getattr(self, key) >= 1.0:
                raise ValueError(f"{n}: {key} must be >= 1, got {getattr(self, key)}")
        for key in (
            "tpot_safety",
            "swap_budget_fraction",
            "step_time_forgetting",
            "ttft_plan_fraction",
        ):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise ValueError(f"{n}: {key} must be in (0, 1], got {getattr(self, key)}")
        if not 0.0 <= self.credit_quantile <= 1.0:
            raise ValueError(f"{n}: credit_quantile must be in [0, 1], got {self.credit_quantile}")
        for key in ("rotation_watermark", "kv_watermark"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"{n}: {key} must be in [0, 1), got {getattr(self, key)}")
        for key in ("aging_s", "recheck_s", "prior_step_s", "prior_prefill_token_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{n}: {key} must be > 0, got {getattr(self, key)}")
        for key in ("promotion_margin_s", "estimate_lookahead", "prior_decode_seq_s"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"{n}: {key} must be >= 0, got {getattr(self, key)}")
        if self.max_preemptions_per_step < 0:
            raise ValueError(f"{n}: max_preemptions_per_step must be >= 0")
        if self.best_effort_tier not in ("keep", "last"):
            raise ValueError(
                f"{n}: best_effort_tier must be 'keep' or 'last', got {self.best_effort_tier!r}"
            )
        if not 0 <= self.deadline_class_tier < self.num_tiers:
            raise ValueError(
                f"{n}: deadline_class_tier must be in [0, {self.num_tiers}), "
                f"got {self.deadline_class_tier}"
            )

    def stats(self) -> dict[str, int]:
        """Counts of what this policy decided so far, for reports: KV bytes it swapped out,
        resumed and prefetched (blocks x ``kv_block_bytes``), tier moves, rejections, and
        whether any state it saw had a CPU KV tier (``saw_cpu_tier``, 0 or 1)."""
        return dict(self._counters)

    # -- what a subclass (the oracle) may override ----------------------------------------------

    def remaining_output_tokens(self, view: RequestView) -> float:
        """Predicted output tokens still to come for ``view`` (>= 1)."""
        return self.estimator.remaining_tokens(
            view.slo.name, view.generated_tokens, view.max_output_tokens
        )

    def credit_tokens(self, view: RequestView) -> float:
        """Output tokens ``view`` will still produce with probability ``1 - credit_quantile``
        (what the TTFT boost may count on as future TPOT credit)."""
        return self.estimator.remaining_quantile(
            view.slo.name, view.generated_tokens, view.max_output_tokens, self.credit_quantile
        )

    # -- lifecycle ------------------------------------------------------------------------------

    def on_request_arrived(self, request: RequestView, now_s: float) -> None:
        e = self._entries.get(request.request_id)
        if e is not None:  # announced twice: keep the first record
            return
        e = self._entries[request.request_id] = _Entry(request)
        e.tier = self._initial_tier(request)
        e.demote_at = self._quanta[e.tier]
        e.queued_s = now_s
        rep = self._replica(request.replica)
        self._enqueue(rep, e, _WAITING, now_s)
        if e.tier != e.reported_tier:
            rep.unreported.append(e)

    def on_request_finished(self, request: RequestView, now_s: float) -> None:
        self.estimator.observe(request.slo.name, request.generated_tokens)
        self._forget(request.request_id)

    def on_request_aborted(self, request: RequestView, now_s: float, reason: str) -> None:
        self._forget(request.request_id)

    def on_step_finished(self, stats: StepStats) -> None:
        self.step_time.observe(stats)
        if stats.num_steps > 0 and stats.duration_s > 0:
            per_step = stats.duration_s / stats.num_steps
            ewma = self._step_ewma_s
            self._step_ewma_s = per_step if ewma == 0.0 else 0.95 * ewma + 0.05 * per_step

    # -- the decision ---------------------------------------------------------------------------

    def schedule(self, state: StepState) -> ScheduleDecision:
        """Decide one step of ``state.replica``.

        Work per call: one pass over ``state.running``; heap operations for the requests whose
        checks fall due, that are admitted, resumed, preempted or shed; a scan of
        ``state.waiting`` only when the policy's books disagree with it (a request it was not
        told about) or to read the new views of requests it preempted.

        Returns:
            A decision that passes ``check_decision(state, d, swap_supported=...)`` with
            ``swap_supported`` true only if the state shows a CPU tier.
        """
        rep = self._replica(state.replica)
        now = state.now_s
        rep.token_budget = state.token_budget
        self._sync(rep, state)
        cpu = has_cpu_tier(state)
        if cpu:
            self._counters["saw_cpu_tier"] = 1
        link_step = state.link_bytes_per_s * self._typical_step_s() * self.swap_budget_fraction
        step = _Step(
            state=state,
            free=state.free_hbm_blocks,
            budget=state.token_budget,
            seats=state.max_num_seqs - len(state.running),
            free_cpu=state.free_cpu_blocks if cpu else 0,
            swap_out_bytes=link_step if cpu else 0.0,
            swap_in_bytes=link_step if cpu else 0.0,
        )
        self._run_due_checks(rep, step, now)
        decodes, prefills, cap_s, need = self._scan_running(rep, step, now)
        if need > step.free:
            self._relieve_shortage(rep, step, self._running_entries(state), need)
        self._schedule_decodes(rep, step, decodes, need)
        prefill_allow = self._prefill_allowance(step, len(decodes), cap_s)
        if self.ttft_boost and prefill_allow < step.budget:
            prefill_allow = self._ttft_boost(rep, step, decodes, prefills, prefill_allow, now)
        rep.prefill_chunk_tokens = float(prefill_allow)
        rep.num_decodes = len(decodes)
        self._allocate_prefill(rep, step, prefills, min(prefill_allow, step.budget), cpu)
        if cpu and self.rotation:
            self._rotate_proactively(rep, step, self._running_entries(state))
        self._shed(rep, step)
        return self._finish(rep, step, now)

    # -- replica books --------------------------------------------------------------------------

    def _replica(self, index: int) -> _Replica:
        rep = self._replicas.get(index)
        if rep is None:
            rep = self._replicas[index] = _Replica(index, self.num_tiers)
        return rep

    def _initial_tier(self, view: RequestView) -> int:
        slo = view.slo
        if slo.ttft_ms is not None or slo.tpot_ms is not None:
            tier = 0
        elif slo.deadline_s is not None:
            tier = self.deadline_class_tier
        else:
            tier = self.num_tiers - 1
        while tier < self.num_tiers - 1 and view.prompt_tokens > self._quanta[tier]:
            tier += 1  # skip-join: this tier's quantum would be spent in prefill
        return tier

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _enqueue(
        self, rep: _Replica, e: _Entry, where: int, now: float, *, checked: bool = False
    ) -> None:
        """Put ``e`` into ``rep``'s waiting or swapped queue (in its tier, or the aged heap)."""
        e.where = where
        e.replica = rep.index
        e.version += 1
        e.key = self._key(e, e.view)
        seq = self._next_seq()
        if where == _WAITING:
            rep.waiting[e.rid] = e
        else:
            rep.swapped[e.rid] = e
        if e.aged:
            heapq.heappush(rep.aged, (e.queued_s, seq, e.rid, e.version))
        elif where == _WAITING:
            heapq.heappush(rep.heaps[e.tier], (e.key, seq, e.rid, e.version))
            heapq.heappush(
                rep.shed_heaps[e.tier],
                (0 if e.best_effort else 1, e.weight, -e.key, seq, e.rid, e.version),
            )
            rep.count[e.tier] += 1
        else:
            heapq.heappush(rep.swap_heaps[e.tier], (e.key, seq, e.rid, e.version))
        self._schedule_check(rep, e, now, checked=checked)

    def _dequeue(self, rep: _Replica, e: _Entry) -> None:
        """Take ``e`` out of ``rep``'s waiting or swapped queue (heap items go stale)."""
        if e.where == _WAITING:
            if rep.waiting.pop(e.rid, None) is not None and not e.aged:
                rep.count[e.tier] -= 1
        elif e.where == _SWAPPED:
            rep.swapped.pop(e.rid, None)
        if e.stale:
            e.stale = False
            rep.num_stale -= 1
        e.version += 1
        e.check_version += 1
        e.where = _GONE

    def _forget(self, rid: str) -> None:
        e = self._entries.pop(rid, None)
        if e is not None:
            self._dequeue(self._replica(e.replica), e)

    def _adopt(self, rep: _Replica, view: RequestView) -> _Entry:
        """An entry for a request the policy first meets in a state (never announced)."""
        e = self._entries.get(view.request_id)
        if e is None:
            e = self._entries[view.request_id] = _Entry(view)
            e.tier = self._initial_tier(view)
            e.demote_at = self._quanta[e.tier]
        elif e.where in (_WAITING, _SWAPPED):
            self._dequeue(self._replica(e.replica), e)
        e.view = view
        return e

    def _sync(self, rep: _Replica, state: StepState) -> None:
        """Rebuild ``rep``'s waiting/swapped books from the state if they disagree in size."""
        if len(state.waiting) == len(rep.waiting) and len(state.swapped) == len(rep.swapped):
            return
        for views, where, books in (
            (state.waiting, _WAITING, rep.waiting),
            (state.swapped, _SWAPPED, rep.swapped),
        ):
            present = {v.request_id for v in views}
            for rid in [rid for rid in books if rid not in present]:
                self._dequeue(rep, books[rid])  # the engine moved or ended it without telling us
            for v in views:
                known = books.get(v.request_id)
                if known is None:
                    self._enqueue(rep, self._adopt(rep, v), where, state.now_s)
                elif known.stale:
                    e = known
                    e.view, e.stale = v, False
                    rep.num_stale -= 1

    def _fresh_view(self, rep: _Replica, e: _Entry, step: _Step) -> RequestView | None:
        """The state's view of queued ``e``, or ``None`` if the engine's queue no longer has it.

        Queued views change without a hook: a waiting request's prefix-cache hit grows or
        shrinks as the cache changes (so do its computed and pending tokens), and a swapped
        request's KV moves to CPU when the engine's copy completes. So the view is always read
        from the state, through an index of ``state.waiting`` and ``state.swapped`` built once
        per call on the first admission or resume attempt (one pass over both queues).
        """
        if step.queued_views is None:
            state = step.state
            step.queued_views = {v.request_id: v for v in state.waiting}
            step.queued_views.update((v.request_id, v) for v in state.swapped)
        v = step.queued_views.get(e.rid)
        if v is None:
            self._dequeue(rep, e)  # not in the engine's queue any more
        elif e.stale:
            e.stale = False
            rep.num_stale -= 1
        return v

    # -- estimates, checks, promotion -----------------------------------------------------------

    def _typical_step_s(self) -> float:
        return self._step_ewma_s or self.step_time.step_s(0.0, 0.0)

    def _key(self, e: _Entry, v: RequestView) -> float:
        """In-tier order (smaller first): the instant the request's most pressing target is
        due, minus the work left before it for a deadline class (least slack). Best-effort
        requests come after every other, in arrival order."""
        if e.best_effort:
            return _BEST_EFFORT_KEY + e.arrival_s
        if e.ttft_s is not None and v.first_token_s is None:
            return e.arrival_s + e.ttft_s
        if e.tpot_s is not None and v.first_token_s is not None:
            return v.first_token_s + e.tpot_s * v.generated_tokens
        if e.deadline_s is not None:
            return e.deadline_s - self._work_s(v, self._replicas.get(e.replica))
        return e.arrival_s + self.aging_s

    def _prefill_left(self, v: RequestView) -> int:
        return v.pending_tokens - 1 if v.generated_tokens else v.pending_tokens

    def _work_s(self, v: RequestView, rep: _Replica | None) -> float:
        """Estimated time to finish ``v`` at the current load, s."""
        chunk = rep.prefill_chunk_tokens if rep and rep.prefill_chunk_tokens else 2048.0
        decodes = rep.num_decodes if rep else 0
        prefill = self.step_time.prefill_s(self._prefill_left(v), chunk, decodes)
        return prefill + self.remaining_output_tokens(v) * self._typical_step_s()

    def _target(self, e: _Entry, v: RequestView, rep: _Replica) -> tuple[float, float, float]:
        """``(deadline, estimate, optimistic)`` of the most pressing target.

        ``estimate`` is the predicted time to meet it at the current load; ``optimistic`` a lower
        bound on that time (its prefill in chunks of the whole token budget, alone), or
        ``-inf`` when no bound makes a miss certain: a mean TPOT can still recover until the
        last token, so TPOT alone never makes a request hopeless. ``deadline`` is infinite for a
        request without a pending target.
        """
        left = self._prefill_left(v)
        chunk = rep.prefill_chunk_tokens or 2048.0
        prefill = self.step_time.prefill_s(left, chunk, rep.num_decodes)
        fastest = self.step_time.prefill_s(left, rep.token_budget, 0.0) if left > 0 else 0.0
        if e.ttft_s is not None and v.first_token_s is None:
            return e.arrival_s + e.ttft_s, prefill, fastest
        if e.deadline_s is not None:
            rest = self.remaining_output_tokens(v) * self._typical_step_s()
            return e.deadline_s, prefill + rest, fastest + self.step_time.base_s
        if e.tpot_s is not None and v.first_token_s is not None:
            rem = self.remaining_output_tokens(v)
            due = v.first_token_s + e.tpot_s * (v.generated_tokens + rem - 1)
            return due, prefill + rem * self._typical_step_s(), -_INF
        return _INF, 0.0, -_INF

    def _check(self, rep: _Replica, e: _Entry, step: _Step, now: float) -> str:
        """Evaluate aging, hopelessness and promotion for ``e``; returns what happened."""
        v = e.view
        queued = e.where in (_WAITING, _SWAPPED)
        if queued and self.aging and not e.aged and now - e.queued_s >= self.aging_s:
            return "age"
        if e.best_effort or e.aged:
            return ""
        deadline, estimate, optimistic = self._target(e, v, rep)
        if deadline == _INF:
            return ""
        slack = deadline - now
        if optimistic > slack and (self.best_effort_demotion or self.reject_hopeless):
            return "hopeless"
        if self.promotion and e.tier > 0 and estimate > slack - self.promotion_margin_s:
            return "promote"
        return ""

    def _schedule_check(
        self, rep: _Replica, e: _Entry, now: float, *, checked: bool = False
    ) -> None:
        """Set when ``e`` is next checked; queued requests go on the replica's due heap.

        The check falls at the first future instant something could happen to it: aging, its
        miss becoming certain, or its estimate reaching its slack (first ``estimate_lookahead``
        early, since estimates move with the load, then at the exact crossing). When such an
        instant has passed without effect (the estimate moved), it is checked again a step
        later (``checked``: a check just ran), or now if none ran yet. A running request with
        any of these pending is checked at least every ``recheck_s``; one with none (a tier-0
        decode) is not checked until it changes tier.
        """
        instants: list[float] = []
        queued = e.where in (_WAITING, _SWAPPED)
        if queued and self.aging and not e.aged:
            instants.append(e.queued_s + self.aging_s)
        if not e.best_effort and not e.aged:
            deadline, estimate, optimistic = self._target(e, e.view, rep)
            if deadline < _INF:
                if optimistic > -_INF and (self.best_effort_demotion or self.reject_hopeless):
                    instants.append(deadline - optimistic)
                if self.promotion and e.tier > 0:
                    crossing = deadline - self.promotion_margin_s - estimate
                    instants.append(crossing - estimate * self.estimate_lookahead)
                    instants.append(crossing)
        future = [t for t in instants if t > now]
        if not checked and len(future) < len(instants):
            when = now  # something may already be due: check it at this call
        elif future:
            when = min(future)
        elif instants:
            when = now + self._typical_step_s()
        else:
            when = _INF
        if not queued and when < _INF:
            when = min(when, now + self.recheck_s)
        e.next_check_s = when
        e.check_version += 1
        if queued and when < _INF:
            heapq.heappush(rep.due, (when, self._next_seq(), e.rid, e.check_version))

    def _apply_check(self, rep: _Replica, e: _Entry, outcome: str, step: _Step, now: float) -> None:
        queued = e.where in (_WAITING, _SWAPPED)
        where = e.where
        if outcome == "hopeless" and self.reject_hopeless and where == _WAITING:
            self._reject(rep, e, step, "slo_unattainable")
            return
        if queued:
            self._dequeue(rep, e)
        self._counters[
            {"age": "aged", "hopeless": "best_effort", "promote": "promotions"}[outcome]
        ] += 1
        if outcome == "age":
            e.aged = True
            self._set_tier(e, 0)
        elif outcome == "hopeless":
            e.best_effort = True
            self._set_tier(e, self.num_tiers - 1 if self.best_effort_tier == "last" else e.tier)
        elif outcome == "promote":
            self._set_tier(e, 0)
            if where == _SWAPPED:
                step.prefetch.append(e.rid)
        step.changed.append(e)
        if queued:
            self._enqueue(rep, e, where, now, checked=True)
        else:
            self._schedule_check(rep, e, now, checked=True)

    def _set_tier(self, e: _Entry, tier: int) -> None:
        service = max(e.view.computed_tokens - e.view.cached_tokens, 0) + e.lost_tokens
        e.tier = tier
        e.demote_at = service + self._quanta[tier]

    def _run_due_checks(self, rep: _Replica, step: _Step, now: float) -> None:
        due = rep.due
        while due and due[0][0] <= now:
            _, _, rid, version = heapq.heappop(due)
            e = self._entries.get(rid)
            if e is None or e.check_version != version or e.where not in (_WAITING, _SWAPPED):
                continue
            outcome = self._check(rep, e, step, now)
            if outcome:
                self._apply_check(rep, e, outcome, step, now)
            else:
                self._schedule_check(rep, e, now, checked=True)

    # -- running requests -----------------------------------------------------------------------

    def _scan_running(
        self, rep: _Replica, step: _Step, now: float
    ) -> tuple[list[_Entry], list[_Entry], float, int]:
        """One pass over ``state.running``: refresh views, demote, run due checks, and collect
        the decodes, the prefills, the smallest TPOT allowance and the KV blocks the decodes
        need. This loop is most of a call's cost; it keeps per-request work to a few compares."""
        entries = self._entries
        bs = step.state.block_size_tokens
        decodes: list[_Entry] = []
        prefills: list[_Entry] = []
        cap = _INF
        need = 0
        worst = -1
        next_check = _INF
        last = self.num_tiers - 1
        for v in step.state.running:
            e = entries.get(v.request_id)
            if e is None or e.where != _RUNNING:
                e = self._adopt(rep, v)
                self._make_resident(e, v)
            e.view = v
            computed = v.computed_tokens
            if e.aged and v.first_token_s is not None:
                e.aged = False  # aging bounds the wait for the first token: that wait is over
                self._set_tier(e, e.tier)
            # an aged request keeps the top tier until its first token
            if not e.aged and computed - v.cached_tokens + e.lost_tokens >= e.demote_at:
                self._set_tier(e, min(e.tier + 1, last))
                self._counters["demotions"] += 1
                step.changed.append(e)
                e.next_check_s = now  # its promotion rule may apply now
            if now >= e.next_check_s:
                outcome = self._check(rep, e, step, now)
                if outcome:
                    self._apply_check(rep, e, outcome, step, now)
                else:
                    self._schedule_check(rep, e, now, checked=True)
            if e.next_check_s < next_check:
                next_check = e.next_check_s
            if e.tier > worst:
                worst = e.tier
            generated = v.generated_tokens
            if generated and v.prompt_tokens + generated - computed == 1:
                decodes.append(e)
                grow = -(-(computed + 1) // bs) - v.kv_blocks  # = step_blocks(v, 1, admit=False)
                if grow > 0:
                    need += grow
                tpot = e.tpot_s
                first = v.first_token_s
                if tpot is not None and first is not None and not e.best_effort:
                    allowance = tpot * generated - (now - first)
                    if allowance < cap:
                        cap = allowance
            else:
                prefills.append(e)
        step.worst_tier = worst
        rep.next_running_check_s = next_check
        return decodes, prefills, cap, need

    def _running_entries(self, state: StepState) -> list[_Entry]:
        entries = self._entries
        return [entries[v.request_id] for v in state.running if v.request_id in entries]

    def _make_resident(self, e: _Entry, v: RequestView) -> None:
        e.where = _RUNNING
        e.view = v
        e.resident_service = max(v.computed_tokens - v.cached_tokens, 0) + e.lost_tokens
        e.next_check_s = -_INF

    @staticmethod
    def _victim_rank(e: _Entry) -> tuple[bool, bool, int, float]:
        """Larger is preempted first: never an aged request while another is left, then best
        effort, then the worst tier, then the least urgent."""
        return (not e.aged, e.best_effort, e.tier, e.key)

    def _preempt(self, rep: _Replica, step: _Step, e: _Entry, *, rotation: bool) -> bool:
        """Preempt running ``e`` (swap or recompute, by the cost model); False if the link
        budget does not allow a rotation swap."""
        v = e.view
        mode = preempt_mode(v, step.state, self.step_time.prefill_token_s, step.free_cpu)
        cpu_blocks = blocks_for_tokens(v.computed_tokens, step.state.block_size_tokens)
        nbytes = cpu_blocks * step.state.kv_block_bytes
        if rotation and (mode is not PreemptMode.SWAP or nbytes > step.swap_out_bytes):
            return False
        if mode is PreemptMode.SWAP:
            step.free_cpu -= cpu_blocks
            step.swap_out_bytes -= nbytes
            self._counters["swap_out_bytes"] += nbytes
        else:
            e.lost_tokens += max(v.computed_tokens - v.cached_tokens, 0)
        step.preempt[e.rid] = mode
        step.free += v.own_kv_blocks + step.new_blocks.pop(e.rid, 0)
        given = step.tokens.pop(e.rid, 0)
        step.budget += given
        step.seats += 1
        e.stale = True
        rep.num_stale += 1
        e.queued_s = step.state.now_s
        self._enqueue(rep, e, _SWAPPED if mode is PreemptMode.SWAP else _WAITING, e.queued_s)
        return True

    def _relieve_shortage(
        self, rep: _Replica, step: _Step, running: list[_Entry], need: int
    ) -> None:
        """Decodes need more new blocks than are free: preempt from the bottom of the ranking
        (vLLM v1 does the same from the tail of its running queue)."""
        bs = step.state.block_size_tokens
        for e in sorted(running, key=self._victim_rank, reverse=True):
            if need <= step.free:
                return
            v = e.view
            decoding = v.generated_tokens and v.pending_tokens == 1
            if decoding:
                need -= max(_decode_blocks(v, bs), 0)
            self._preempt(rep, step, e, rotation=False)

    def _schedule_decodes(
        self, rep: _Replica, step: _Step, decodes: list[_Entry], need: int
    ) -> None:
        """One token for every decode that was not preempted; each is charged to its tier's
        stride pass, so decodes count against their tier's share of the budget."""
        bs = step.state.block_size_tokens
        passes, weights = rep.passes, self._weights
        if step.preempt or len(decodes) > step.budget:
            decodes = [e for e in decodes if e.rid not in step.preempt][: max(step.budget, 0)]
            need = sum(max(_decode_blocks(e.view, bs), 0) for e in decodes)
        step.tokens.update(dict.fromkeys([e.rid for e in decodes], 1))
        step.budget -= len(decodes)
        if need:
            for e in decodes:
                grow = _decode_blocks(e.view, bs)
                if grow > 0:
                    step.new_blocks[e.rid] = grow
            step.free -= need
        per_tier = [0] * self.num_tiers
        for e in decodes:
            per_tier[e.tier] += 1
        for t, count in enumerate(per_tier):
            if count:
                passes[t] += count / weights[t]

    def _prefill_allowance(self, step: _Step, num_decodes: int, cap_s: float) -> int:
        """Prefill tokens this step may run: all of the budget, or with TPOT-class decodes
        running, what fits in ``tpot_safety`` of their smallest allowance."""
        if cap_s == _INF:
            return step.budget
        model = self.step_time
        room_s = cap_s * self.tpot_safety - model.step_s(0.0, num_decodes)
        tokens = int(room_s / model.prefill_token_s) if room_s > 0 else 0
        return max(self.min_prefill_tokens, tokens)

    def _ttft_boost(
        self,
        rep: _Replica,
        step: _Step,
        decodes: list[_Entry],
        prefills: list[_Entry],
        allow: int,
        now: float,
    ) -> int:
        """Grow the prefill allowance so the most urgent TTFT prefill (running, or at the head of
        a tier) can still meet its deadline, as far as the decodes' TPOT credit allows.

        The chunk it needs is ``ceil(pending / steps)`` with ``steps`` the whole steps that fit
        in its slack after its prefill compute. A decode's credit is its banked allowance plus
        ``(tpot - typical step) * r`` for the ``r`` tokens it will still produce with
        probability ``1 - credit_quantile`` (the estimator's conditional quantile): a longer step
        now is repaid by the faster steps it still has to come.
        """
        urgent = None
        heads = [self._peek(heap, _WAITING) for heap in rep.heaps]
        for e in [*prefills, *heads]:
            if e is None or e.ttft_s is None or e.best_effort or e.view.first_token_s is not None:
                continue
            if e.rid not in step.preempt and (urgent is None or e.key < urgent.key):
                urgent = e
        if urgent is None or urgent.ttft_s is None:
            return allow
        model = self.step_time
        pending = urgent.view.pending_tokens
        per_step = model.base_s + model.decode_seq_s * len(decodes)
        slack = urgent.arrival_s + urgent.ttft_s - now
        room_s = slack * self.ttft_plan_fraction - model.prefill_token_s * pending
        steps = int(room_s / per_step) if room_s > 0 else 0
        if steps < 1:  # not within the plan: then within the whole slack, in as few steps
            steps = int((slack - model.prefill_token_s * pending) / per_step)
        if steps < 1:
            return allow  # out of reach even in one step: best-effort demotion's business
        chunk = -(-pending // steps)
        if chunk <= allow:
            return allow
        credit = _INF
        typical = self._typical_step_s()
        for e in decodes:
            v = e.view
            tpot = e.tpot_s
            if tpot is None or e.best_effort or v.first_token_s is None:
                continue
            later = self.credit_tokens(v)
            c = tpot * v.generated_tokens - (now - v.first_token_s)
            c += max(tpot - typical, 0.0) * (later - 1)
            if c < credit:
                credit = c
        if credit == _INF:
            return max(allow, min(chunk, step.budget))
        room = credit * self.tpot_safety - model.step_s(0.0, len(decodes))
        most = int(room / model.prefill_token_s) if room > 0 else 0
        return max(allow, min(chunk, most, step.budget))

    # -- prefill: weighted rotation across tiers ------------------------------------------------

    def _peek(self, heap: list[tuple[Any, ...]], *wheres: int) -> _Entry | None:
        """The first live item of a lazily-deleted heap (stale items are popped)."""
        entries = self._entries
        while heap:
            item = heap[0]
            e = entries.get(item[-2])
            if e is not None and e.version == item[-1] and e.where in wheres:
                return e
            heapq.heappop(heap)
        return None

    def _allocate_prefill(
        self, rep: _Replica, step: _Step, prefills: list[_Entry], allow: int, cpu: bool
    ) -> None:
        """Hand ``allow`` prefill tokens out: aged requests first, then the tiers by stride
        scheduling on their weights; inside a tier, running prefills continue before swapped
        requests resume and before waiting ones are admitted, each in urgency order."""
        k = self.num_tiers
        ongoing: list[list[_Entry]] = [[] for _ in range(k)]
        for p in prefills:
            if p.rid not in step.preempt:
                ongoing[p.tier].append(p)
        for group in ongoing:
            if len(group) > 1:
                group.sort(key=_entry_key)
        left = allow
        while left > 0:
            aged = self._peek(rep.aged, _WAITING, _SWAPPED)
            if aged is None:
                break
            # An aged request takes the next free seat and blocks before any tier, but makes
            # no room by preemption: under overload every queued request ages, and aged ones
            # preempting running work (which then ages again) collapsed throughput (x1.6 load).
            given = self._place(rep, step, aged, left, cpu, rank_below=self.num_tiers)
            if not given:
                break
            left -= given
        passes, weights, active = rep.passes, self._weights, rep.active
        demand = [self._has_demand(rep, ongoing, t, cpu) for t in range(k)]
        floor = min((passes[t] for t in range(k) if demand[t] and active[t]), default=None)
        for t in range(k):  # a tier that was idle joins at the current virtual time
            if demand[t] and not active[t] and floor is not None:
                passes[t] = max(passes[t], floor)
            active[t] = demand[t]
        blocked = [False] * k
        while left > 0:
            tiers = [t for t in range(k) if demand[t] and not blocked[t]]
            if not tiers:
                break
            t = min(tiers, key=lambda i: (passes[i], i))
            while ongoing[t] and ongoing[t][0].rid in step.preempt:
                ongoing[t].pop(0)  # made room for a better tier earlier in this step
            e = ongoing[t][0] if ongoing[t] else None
            if e is None and cpu:
                e = self._peek(rep.swap_heaps[t], _SWAPPED)
            if e is None:
                e = self._peek(rep.heaps[t], _WAITING)
            if e is None:
                demand[t] = False
                continue
            was_queued = e.where != _RUNNING
            given = self._place(rep, step, e, min(self.rotation_unit_tokens, left), cpu, t)
            if not given:
                blocked[t] = True
                continue
            left -= given
            passes[t] += given / weights[t]
            if self._pending_after(step, e) <= 0:
                if not was_queued:
                    ongoing[t].pop(0)
            elif was_queued:
                ongoing[t].insert(0, e)  # a request admitted mid-prefill keeps the next turn
            demand[t] = self._has_demand(rep, ongoing, t, cpu)
        low = min(passes)
        if low > 1e9:  # keep the virtual times small; only differences matter
            rep.passes = [p - low for p in passes]

    def _has_demand(self, rep: _Replica, ongoing: list[list[_Entry]], t: int, cpu: bool) -> bool:
        if ongoing[t]:
            return True
        if cpu and self._peek(rep.swap_heaps[t], _SWAPPED) is not None:
            return True
        return self._peek(rep.heaps[t], _WAITING) is not None

    def _pending_after(self, step: _Step, e: _Entry) -> int:
        return e.view.pending_tokens - step.tokens.get(e.rid, 0)

    def _place(
        self, rep: _Replica, step: _Step, e: _Entry, unit: int, cpu: bool, rank_below: int
    ) -> int:
        """Give ``e`` up to ``unit`` more tokens this step, admitting or resuming it if it is
        queued; preempts worse-tier running requests to make room. Returns tokens given."""
        state = step.state
        rid = e.rid
        if rid in step.preempt or rid in step.reject:
            return 0  # preempted or shed in this very decision: not in the state's queues
        queued = e.where in (_WAITING, _SWAPPED)
        v = self._fresh_view(rep, e, step) if queued else e.view
        if v is None:
            return 0
        if queued:
            e.view = v
        given = step.tokens.get(rid, 0)
        n = min(unit, v.pending_tokens - given, step.budget)
        if n <= 0:
            return 0
        # KV blocks charged the way the engine's decision check charges them (step_blocks):
        # an admission pays its admission rule's reservation, a swapped request all its blocks.
        admitting = e.where == _WAITING or rid in step.admit
        before = step_blocks(v, given, state, admit=admitting) if given else 0
        extra = max(step_blocks(v, given + n, state, admit=admitting) - before, 0)
        swapping = e.where == _SWAPPED
        nbytes = v.kv_blocks * state.kv_block_bytes if swapping else 0
        if swapping and (not cpu or nbytes > step.swap_in_bytes and step.resume):
            return 0
        # Once anything is admitted this step, every later block taken must leave the headroom
        # the engine reserves for running requests (StepState.reserved_hbm_blocks) intact.
        floor = state.reserved_hbm_blocks if admitting or step.admit else 0
        if queued:
            floor += int(self.kv_watermark * state.total_hbm_blocks)
        if step.seats <= 0 and queued or step.free - extra < floor:
            if not self._make_room(rep, step, e, extra + floor, rank_below):
                return 0
        if queued:
            self._dequeue(rep, e)
            self._make_resident(e, v)
            e.where = _RUNNING
            if swapping:
                step.resume.append(rid)
                step.swap_in_bytes -= nbytes
                self._counters["swap_in_bytes"] += nbytes
            else:
                step.admit.append(rid)
            step.seats -= 1
            self._schedule_check(rep, e, state.now_s)
        step.tokens[rid] = given + n
        step.new_blocks[rid] = step.new_blocks.get(rid, 0) + extra
        step.free -= extra
        step.budget -= n
        return n

    def _make_room(
        self, rep: _Replica, step: _Step, e: _Entry, blocks: int, rank_below: int
    ) -> bool:
        """Preempt running requests of tiers worse than ``rank_below`` (worst first) until
        ``blocks`` are free and a seat is open; -1 allows any tier (aged requests)."""
        if self.max_preemptions_per_step == 0:
            return False
        if 0 <= rank_below and step.worst_tier <= rank_below:
            return False  # nothing runs in a worse tier
        state = step.state
        candidates = [
            x
            for x in (self._entries.get(v.request_id) for v in state.running)
            if x is not None
            and x.where == _RUNNING
            and x is not e
            and x.rid not in step.preempt
            and not x.aged
            and (rank_below < 0 or x.tier > rank_below)
        ]
        candidates.sort(key=self._victim_rank, reverse=True)
        budget = self.max_preemptions_per_step - len(step.preempt)
        plan: list[_Entry] = []
        free, seats = step.free, step.seats
        for x in candidates:
            if free >= blocks and seats > 0:
                break
            if len(plan) >= budget:
                return False
            plan.append(x)
            free += x.view.own_kv_blocks + step.new_blocks.get(x.rid, 0)
            seats += 1
        if free < blocks or seats <= 0:
            return False
        for x in plan:
            self._preempt(rep, step, x, rotation=False)
        return True

    # -- rotation, shedding, the decision -------------------------------------------------------

    def _rotate_proactively(self, rep: _Replica, step: _Step, running: list[_Entry]) -> None:
        """Swap out residents of worse tiers whose slice is used while better-tier work waits
        and HBM is below the watermark, within the link's bytes for this step."""
        state = step.state
        if step.free >= self.rotation_watermark * state.total_hbm_blocks:
            return
        best_waiting = next(
            (
                t
                for t in range(self.num_tiers)
                if self._peek(rep.heaps[t], _WAITING) is not None
                or self._peek(rep.swap_heaps[t], _SWAPPED) is not None
            ),
            None,
        )
        if best_waiting is None:
            return
        for e in sorted(running, key=self._victim_rank, reverse=True):
            if e.tier <= best_waiting or e.rid in step.preempt or e.aged:
                continue
            v = e.view
            service = max(v.computed_tokens - v.cached_tokens, 0) + e.lost_tokens
            if service - e.resident_service < self._slices[e.tier]:
                continue
            if not self._preempt(rep, step, e, rotation=True):
                break

    def _reject(self, rep: _Replica, e: _Entry, step: _Step, reason: str) -> None:
        self._counters["rejected"] += 1
        self._dequeue(rep, e)
        step.reject[e.rid] = reason
        self._entries.pop(e.rid, None)

    def _shed(self, rep: _Replica, step: _Step) -> None:
        """Admission control: a tier over ``max_waiting_per_tier`` sheds its least important
        waiting requests (best effort first, then the lowest SLO weight, then the latest)."""
        for t in range(self.num_tiers):
            heap = rep.shed_heaps[t]
            while rep.count[t] > self.max_waiting_per_tier:
                e = self._peek(heap, _WAITING)
                if e is None:
                    break
                self._reject(rep, e, step, f"shed: tier {t} queue full")

    def _finish(self, rep: _Replica, step: _Step, now: float) -> ScheduleDecision:
        tiers: dict[str, int] = {}
        if rep.unreported:
            step.changed.extend(rep.unreported)
            rep.unreported = []
        for e in step.changed:
            if e.where in (_WAITING, _RUNNING) and e.tier != e.reported_tier:
                if e.rid in self._entries and e.rid not in step.reject:
                    tiers[e.rid] = e.tier
                    e.reported_tier = e.tier
        repeat = 1
        quiet = not (step.admit or step.resume or step.preempt or step.reject)
        if quiet and step.tokens and all(n == 1 for n in step.tokens.values()):
            # Repeat no further than the next check that could change the decision.
            horizon = min(rep.next_running_check_s, rep.due[0][0] if rep.due else _INF)
            per_step = max(self._typical_step_s(), 1e-6)
            steps = (horizon - now) / per_step if horizon < _INF else self.max_repeat_steps
            repeat = int(max(1, min(self.max_repeat_steps, steps)))
        prefetch: list[str] = []
        floor = step.state.reserved_hbm_blocks if step.admit else 0
        for rid in step.prefetch:  # promoted swapped requests, as far as HBM and the link allow
            fetched = self._entries.get(rid)
            if fetched is None or fetched.where != _SWAPPED or rid in step.reject:
                continue
            blocks = fetched.view.kv_blocks
            nbytes = blocks * step.state.kv_block_bytes
            if step.free - blocks < floor or nbytes > step.swap_in_bytes:
                continue
            step.free -= blocks
            step.swap_in_bytes -= nbytes
            prefetch.append(rid)
            self._counters["prefetch_bytes"] += nbytes
        return ScheduleDecision(
            num_tokens=step.tokens,
            admit=tuple(step.admit),
            resume=tuple(step.resume),
            preempt=step.preempt,
            reject=step.reject,
            prefetch=tuple(prefetch),
            tiers=tiers,
            max_repeat_steps=repeat,
        )
