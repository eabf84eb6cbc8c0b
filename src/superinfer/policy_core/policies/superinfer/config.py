"""The ``superinfer`` policy's hyperparameters, their validation, and the state it starts with.

:class:`SuperInferConfig` is the bottom of the policy's layers (config -> estimates -> queues ->
preemption -> admission -> promotion -> step budget -> rotation -> the policy): every field is a
``--policy-opt`` of :class:`~superinfer.policy_core.policies.superinfer.SuperInferPolicy`, in
the order ``superinfer policies`` lists them.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from superinfer.policy_core.estimators import (
    OutputLengthEstimator,
    StepTimeModel,
    WindowQuantile,
)
from superinfer.policy_core.policies.superinfer.records import (
    _COUNTER_NAMES,
    _INF,
    _Entry,
    _Replica,
)
from superinfer.policy_core.protocols import BasePolicy

__all__ = ["SuperInferConfig"]


#: Python types a hyperparameter of each annotated type accepts (any integer where an int is
#: asked for, numpy's too; any real where a float is; never a bool where a number is: ``True`` is
#: an ``int`` to ``isinstance``).
_ACCEPTS: dict[Any, tuple[type, ...]] = {
    int: (numbers.Integral,),
    float: (numbers.Real,),
    bool: (bool,),
    str: (str,),
}


#: Each numeric hyperparameter's allowed range, checked in this order on construction; the
#: error names the option, the range as written here and the value given.
_RANGES: dict[str, str] = {
    **dict.fromkeys(
        ("num_tiers", "quantum_base_tokens", "rotation_unit_tokens", "min_prefill_tokens",
         "max_waiting_per_tier", "rotation_slice_tokens", "max_repeat_steps", "estimator_window",
         "estimator_min_samples", "quantum_growth", "tier_weight_ratio",
         "decode_interval_memory"),
        ">= 1",
    ),
    **dict.fromkeys(
        ("tpot_safety", "min_prefill_budget_share", "swap_budget_fraction",
         "step_time_forgetting", "ttft_plan_fraction", "tpot_plan_share"),
        "(0, 1]",
    ),
    "credit_step_memory": ">= 0",
    **dict.fromkeys(("credit_quantile", "unmixed_credit_quantile"), "[0, 1]"),
    "rotation_watermark": "[0, 1)", "kv_watermark": "[0, 1)",
    **dict.fromkeys(
        ("aging_s", "recheck_s", "prior_step_s", "prior_prefill_token_s", "ttft_reserve_idle_s"),
        "> 0",
    ),
    "ttft_reserve_quantile": "[0, 1]", "aging_deadline_fraction": "[0, 1)",
    **dict.fromkeys(
        ("promotion_margin_s", "estimate_lookahead", "prior_decode_seq_s", "ttft_reserve_shed_s",
         "max_preemptions_per_step", "ttft_kv_reserve_requests", "ttft_seat_reserve"),
        ">= 0",
    ),
}  # fmt: skip
#: Whether a value is within a range of :data:`_RANGES` (NaN is within none).
_WITHIN: dict[str, Any] = {
    ">= 1": lambda v: v >= 1,
    "(0, 1]": lambda v: 0.0 < v <= 1.0,
    "[0, 1]": lambda v: 0.0 <= v <= 1.0,
    "[0, 1)": lambda v: 0.0 <= v < 1.0,
    "> 0": lambda v: v > 0,
    ">= 0": lambda v: v >= 0,
}


def _opt(default: Any, text: str) -> Any:
    """A config field with a default and its ``--policy-opt`` help text."""
    return field(default=default, metadata={"help": text})


@dataclass
class SuperInferConfig(BasePolicy):
    """Hyperparameters of the rotation scheduler (``superinfer bench --policy-opt key=value``),
    validated on construction, and the books every layer above reads.

    Raises:
        ValueError: on construction, naming the first invalid hyperparameter (out of range,
            or not of its type: a string, or a bool where a number is asked for).
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
        256,
        "prefill tokens a step may always run, whatever the TPOT allowance (an engine without "
        "mixed batches: the smallest prefill step worth running; below it the step decodes)",
    )
    ttft_boost: bool = _opt(
        True,
        "grow prefill chunks for a TTFT-urgent prefill when decodes have TPOT credit (engines "
        "with mixed batches; without them only under ttft_boost_unmixed)",
    )
    ttft_reserve_quantile: float = _opt(
        # 0.8 by default (issue 18, sim:sglang, 900 s of the Azure hour): see docs/policies.md
        0.8,
        "on engines without mixed batches, a prefill step with no TTFT-class prefill pending "
        "leaves the TPOT-class decodes the time to prefill this quantile of recent TTFT-class "
        "prompts, for the next one (0: no reserve)",
    )
    ttft_plan_fraction: float = _opt(
        0.6, "the TTFT boost plans a prefill to end within this fraction of its slack"
    )
    first_token_guard: bool = _opt(
        # on by default since issue 18's rerun (docs/policies.md, results/headline): on the whole
        # Azure hour it adds feasible chat attainment on sim:vllm (x0.6 +0.26, x1.0 +0.16
        # points), sim:trtllm (x0.6 +0.34) and sim:sglang (x0.6 +0.57), batch unchanged
        True,
        "shorten a step's worse-tier prefill tokens so that a TTFT-class prefill finishing in it "
        "gets its first token before its deadline (when trimming can make it)",
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
        # on by default (issue 18, results/overload): across the headline sweep (x0.3-1.6) it
        # keeps chat TTFT p99 near fcfs's at x0.3 and far under it from x0.6, where demotion let
        # hopeless requests queue (206 s at x1.0 in make bench)
        True,
        "reject (instead of demoting) waiting requests that can no longer meet their SLO, "
        "when another waiting request of their tier or a higher one still can",
    )
    aging: bool = _opt(True, "lift requests queued longer than aging_s above every tier")
    aging_s: float = _opt(120.0, "queueing time after which a request is aged, s")
    aging_deadline_fraction: float = _opt(
        # 0.5 by default (issue 18): aging a 600 s batch request at 120 s lifted it above every
        # chat in sim:sglang's prefill bursts; at 0.5, 900 s of the Azure hour at x0.3-1.6 on
        # the three simulated engines, chat attainment rose or held everywhere (sim:sglang x0.6
        # 0.638 -> 0.703) and batch attainment held at 1.000 but at sim:sglang x1.6 (0.977)
        0.5,
        "a deadline-class request is aged no sooner than this fraction of its deadline budget "
        "(deadline - arrival) after arrival; 0 ages every class at aging_s",
    )
    fcfs_guard: bool = _opt(
        False,
        "age a waiting request without a TTFT target once the prompt tokens its replica "
        "prefilled (or found cached, or dropped: rejected, ended) reach those that arrived "
        "before it, the point fcfs would start it; aged ones then prefill first, in arrival order",
    )
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
    ttft_boost_whole: bool = _opt(
        # off until the results built on the default are rerun with it (issue 18, 2026-12-04:
        # x0.3-1.6 of the Azure mix, 900 s, sim:vllm and sim:trtllm: chat attainment +0.06 to
        # +0.16 points in 9 of 12 cells, unchanged in 2, -0.05 in one; results/boost-whole/)
        False,
        "when the decodes' TPOT credit covers the TTFT boost's urgent prefill whole, run it all "
        "in this step (its earliest first token) instead of pacing it to its plan",
    )
    min_prefill_budget_share: float = _opt(
        # 1/8 (issue 18, 2026-12-04): on the real hf engine (256-token steps) the floor of 256 let
        # steps carry full prefill chunks (a median 249 tokens; 200+ beside decodes: 0.90 s) next
        # to decodes with a 500 ms TPOT (results/engines-cpu/README.md); the GPU engines' budgets
        # (2,048 and 8,192 tokens) keep the floor at min_prefill_tokens
        0.125,
        "with mixed batches, the prefill floor (min_prefill_tokens) is at most this share of "
        "the step's token budget",
    )
    ttft_kv_reserve_requests: int = _opt(
        # 4 (issue 18, 2026-12-04): on the real SGLang CPU server (no preemption), batch
        # admissions took the pool's last KV just before chats arrived, which then waited past
        # their TTFT and were rejected (2 of 6 repeats at 0.5 req/s, results/engines-cpu/
        # sglang-knee3); sim:sglang-cpu replays of the SGLang runs at 0.5-1.4 req/s: chat
        # attainment rises with 0-4 (1.4 req/s: 0.667 -> 0.788) at unchanged output tok/s, and
        # 6-8 cost up to 2.1% of it at 0.5 (docs/policies.md); with preemption a chat makes room
        4,
        "where the policy may not preempt (max_preemptions_per_step=0), an admission without a "
        "TTFT target leaves, while any request runs, KV free for this many TTFT-class "
        "requests (each the ttft_reserve_quantile of recent ones' prompt plus output cap; "
        "0: none)",
    )
    tpot_plan_share: float = _opt(
        # 1.0 keeps every decision of the results made before it (GPU engines simulated with a
        # deterministic step time). On the real hf engine (results/hf/knee-hi, 0.4 req/s, 5
        # repeats) 6 chats missed a 500 ms TPOT by 0.35-2.67 ms: allowances planned to the
        # target itself make steps converge to it (steps beside decodes a median 506 ms, p10-p90
        # 354-716), and what a request banks over its life is tpot * (1 / tpot_safety - 1), 56
        # ms at 500 ms, less than one step's noise; the suite runs hf with 0.9 (median 454 ms)
        1.0,
        "share of a request's TPOT target its decodes' allowances are planned to (TPOT "
        "protection and the TTFT boost's credit); below 1 every token keeps the rest of the "
        "target as a margin for step-time noise",
    )
    ttft_seat_reserve: int = _opt(
        # 2 (issue 18, 2026-12-05): on the real SGLang CPU server (8 running requests, no
        # preemption) chats arriving with every seat held (3-4 by batch requests) waited through
        # decode steps past their 1.5 s TTFT (traced in the step logs of results/engines-cpu/
        # sglang-reserve*); sim:sglang-cpu replays of those runs (results/engines-cpu/
        # seat_reserve_sweep.csv): 1.0 req/s chat attainment 0.871 / 0.950 / 0.990 / 0.980 with
        # 0 / 1 / 2 / 3 seats, output tok/s 24.3 / 25.2 / 25.3 / 25.1; sglang-reserve-0.6-s6
        # 0.975 -> 1.000 with any; 1.000 on the other 0.5-0.6 runs with any
        2,
        "where the policy may not preempt (max_preemptions_per_step=0), an admission without a "
        "TTFT target leaves, while any request runs and TTFT-class requests arrive "
        "(ttft_reserve_idle_s), this many of the engine's running-request seats free for "
        "TTFT-class requests (0: none)",
    )
    serial_whole_prefills: bool = _opt(
        # on (issue 18, 2026-12-05): 17 of the 20 chats superinfer missed on the real SGLang CPU
        # server at 0.5-0.6 req/s waited behind chains of batch prefill chunks (2.0-2.6 s for two
        # prompts; results/engines-cpu/README.md); with it on the same arrivals none did
        # (sglang-serial-0.6-s6: 105 of 107 chats met); replays barely move, since sim:sglang-cpu
        # runs the chunks the policy allots (results/engines-cpu/serial_prefill_sweep.csv)
        True,
        "where an admitted prompt runs to its end without the policy (StepState."
        "prefill_runs_whole: SGLang), admit a request without a TTFT target only while no other "
        "such request is still in its prefill and none was admitted in this step, while "
        "TTFT-class requests arrive (ttft_reserve_idle_s): a chat then waits behind one batch "
        "prompt's chunks at most, not a chain of them",
    )
    ttft_reserve_idle_s: float = _opt(
        # 300 s (2026-12-05): the two rules above once held for good after one chat, so a server
        # whose chats stopped kept 2 seats and serial prefills for batch alone; both act on SGLang
        # only, and replays of its 13 runs of results/engines-cpu were byte-identical with it
        300.0,
        "the seat reserve (ttft_seat_reserve) and serial prefills (serial_whole_prefills) hold "
        "only while a TTFT-class request arrived within this many seconds; after that a request "
        "without a TTFT target is admitted as before any chat (inf: for good)",
    )
    credit_step_memory: int = _opt(
        0,
        "step reports over which the TTFT boost averages the step time it expects a decode's "
        "future tokens to take (an exponential mean of weight 1/N per on_step_finished; a "
        "repeated decode-only decision reports once); 0: the policy's step-time average of "
        "about 20 reports, as before",
    )
    yield_decodes: bool = _opt(
        False,
        "leave decodes that can wait a step out of a budget-bound step so that a TTFT-class "
        "prefill that would otherwise miss its first-token deadline ends a step sooner",
    )
    ttft_reserve_mixed: bool = _opt(
        False, "apply the TTFT reserve on engines with mixed batches too (else only without)"
    )
    ttft_reserve_beside_chats: bool = _opt(
        False,
        "with ttft_reserve_mixed: in a step that carries a TTFT-class prefill, prefills without "
        "a TTFT target also stop at the reserve (the TTFT-class one may take the whole allowance)",
    )
    ttft_reserve_shed_s: float = _opt(
        0.0,
        "no TTFT reserve on a replica for this many seconds after the policy rejected a request "
        "there, as while it sheds load (results/ttft-reserve-mixed); 0: none",
    )
    ttft_boost_unmixed: bool = _opt(  # on since cb517f6, 831607b's rule (results/boost-unmixed)
        True,
        "the TTFT boost on engines without mixed batches too, whole or not at all: the urgent "
        "TTFT prefill runs whole in one step when the decodes' credit (their future tokens at "
        "the mean time between a decode's tokens, prefill steps included) covers that step and "
        "the decode step after it (a paced chunk only slices the prompt between decode steps)",
    )
    decode_interval_memory: int = _opt(  # 20 lost at x1.6 on sim:sglang (results/boost-unmixed)
        2000, "ttft_boost_unmixed's memory: step reports its mean decode interval weighs (1/N each)"
    )
    unmixed_credit_quantile: float = _opt(  # 0.2 lost the fleet cell, 0.1 just kept it
        0.05, "credit_quantile of ttft_boost_unmixed (each boost there charges every decode)"
    )
    prefill_floor_yields: bool = _opt(  # on in the engines suite's hf runs (issue 18, 2026-12-07)
        False,
        "with mixed batches, while a step of the decodes alone is shorter than their smallest "
        "planned TPOT, an allowance under the prefill floor gives no prefill (the step decodes, "
        "banking allowance for a floor's worth) instead of the floor",
    )
    name: str = "superinfer"

    def __post_init__(self) -> None:
        self._validate()
        k = self.num_tiers
        self._quanta = [self.quantum_base_tokens * self.quantum_growth**t for t in range(k)]
        self._quanta[-1] = _INF
        self._weights = [self.tier_weight_ratio ** (k - 1 - t) for t in range(k)]
        self._slices = [self.rotation_slice_tokens * self.quantum_growth**t for t in range(k)]
        self._other_tiers = [[i for i in range(k) if i != t] for t in range(k)]  # rotation.py
        self._entries: dict[str, _Entry] = {}
        self._replicas: dict[int, _Replica] = {}
        self._seq = 0
        self._step_ewma_s = 0.0
        self._credit_step_s = 0.0  # credit_step_memory's mean step time, s (0: none yet)
        self._interval_means = (0.0, 0.0)  # per report: s, steps with decodes (estimates.py)
        self._counters = dict.fromkeys(_COUNTER_NAMES, 0)
        self.estimator = OutputLengthEstimator(
            window=self.estimator_window, min_samples=self.estimator_min_samples
        )
        self.step_time = StepTimeModel(
            prior_step_s=self.prior_step_s,
            prior_prefill_token_s=self.prior_prefill_token_s,
            prior_decode_seq_s=self.prior_decode_seq_s,
            forgetting=self.step_time_forgetting,
        )
        #: prompt tokens still to prefill at arrival, of TTFT-class requests (ttft_reserve_quantile)
        self.ttft_prompts = WindowQuantile(self.ttft_reserve_quantile)
        #: prompt plus output cap at arrival, tokens, of TTFT-class requests (ttft_kv_reserve_*)
        self.ttft_footprints = WindowQuantile(self.ttft_reserve_quantile, min_samples=1)
        #: whether the reserve can apply (it needs no preemption); elsewhere nothing is observed
        self._kv_reserve_on = (
            self.ttft_kv_reserve_requests > 0 and self.max_preemptions_per_step == 0
        )
        #: seats an admission without a TTFT target leaves (ttft_seat_reserve), 0 where it may
        #: preempt; applied while a TTFT-class request arrived within ttft_reserve_idle_s
        self._seat_reserve = self.ttft_seat_reserve if self.max_preemptions_per_step == 0 else 0
        self._last_ttft_s: float | None = None  # the latest TTFT-class arrival, s (none yet)
        self._shed_at: dict[int, float] = {}  # replica -> its latest rejection, s (shed_s)

    def _validate(self) -> None:
        n = self.name
        hints = get_type_hints(type(self))
        for spec in fields(self):  # types first: "3" or a bool would pass (or crash) the ranges
            value, kind = getattr(self, spec.name), hints.get(spec.name)
            accepts = _ACCEPTS.get(kind, ())
            number = kind in (int, float)
            if accepts and (not isinstance(value, accepts) or number and isinstance(value, bool)):
                name = getattr(kind, "__name__", kind)
                raise ValueError(f"{n}: {spec.name} must be {name}, got {value!r}")
        for key, bounds in _RANGES.items():
            value = getattr(self, key)
            if not _WITHIN[bounds](value):
                where = f"in {bounds}" if bounds[0] in "([" else bounds
                raise ValueError(f"{n}: {key} must be {where}, got {value}")
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
        resumed and prefetched (blocks x ``kv_block_bytes``), tier moves, rejections, steps the
        TTFT boost grew (``ttft_boosts``), decisions that held a queued request back for want of
        a seat or KV, or by a reserve rule (``held_*``: ``admission.py``), and whether any state
        it saw had a CPU KV tier (``saw_cpu_tier``, 0 or 1); names: ``records._COUNTER_NAMES``."""
        return dict(self._counters)
