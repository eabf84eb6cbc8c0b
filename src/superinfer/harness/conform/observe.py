"""What a conformance run sees inside an engine it drives in-process: every scheduling decision.

:class:`DecisionLog` is a pluggy observer registered beside the policy (``plugins=`` of the
simulator runners, ``harness/engines/sim.py``). It wraps ``superinfer_schedule``: it reads the
state the policy saw and the decision it returned, records admissions, re-admissions and
preemptions with each request's progress, and forces ``max_repeat_steps`` to 1 so that every
step's tokens pass through it (a repeated decode-only decision runs the same steps one by one:
``tests/sim/test_engine.py`` checks that both give the same per-request timestamps). Only the
simulated engines can host it; over HTTP a run sees per-request results alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from dataclasses import dataclass, field

from superinfer.adapters.hookspecs import hookimpl
from superinfer.policy_core.types import (
    PreemptMode,
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)

__all__ = ["Admission", "DecisionLog", "Preemption"]


@dataclass(frozen=True, slots=True)
class Admission:
    """A waiting request moved to running.

    Attributes:
        request_id: the request.
        now_s: the decision's instant, s.
        readmission: it had been preempted before.
        priority: its ``SLO.priority`` (lower is more urgent).
        arrival_s: its arrival, s.
        hit_tokens: prompt tokens the prefix cache held for it at that instant.
    """

    request_id: str
    now_s: float
    readmission: bool
    priority: int
    arrival_s: float
    hit_tokens: int


@dataclass(frozen=True, slots=True)
class Preemption:
    """A running request gave its KV back.

    Attributes:
        request_id: the request.
        now_s: the decision's instant, s.
        computed_tokens: tokens of its sequence that had KV (what a recompute loses).
        prompt_tokens: its prompt length (``computed_tokens`` below it: preempted mid-prefill).
        mode: ``recompute`` or ``swap``.
        priority: its ``SLO.priority``.
        for_priority: the smallest priority among the requests the same decision admitted or
            resumed (``None``: none), to tell a preemption for an urgent request.
    """

    request_id: str
    now_s: float
    computed_tokens: int
    prompt_tokens: int
    mode: str
    priority: int
    for_priority: int | None


@dataclass
class DecisionLog:
    """Observer of one simulated cell (module docstring).

    Attributes:
        admissions: every admission, in decision order.
        preemptions: every preemption, in decision order.
        scheduled: request id -> tokens run for it over the cell (prefill chunks and decodes;
            a decided token the step did not run is taken back at the next decision).
        first_hit: request id -> prompt tokens served from the prefix cache at its first
            admission.
        high_water: request id -> the most ``computed_tokens`` it had at a decision.
        regained_before_preempt: per recompute preemption after the first of a request, whether
            the request had regained the progress it lost at the previous one.
        last_stats: the last step's report (KV in use and queue after the cell's last step).
        decisions: scheduling decisions seen.
    """

    admissions: list[Admission] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    scheduled: dict[str, int] = field(default_factory=dict)
    first_hit: dict[str, int] = field(default_factory=dict)
    high_water: dict[str, int] = field(default_factory=dict)
    regained_before_preempt: list[bool] = field(default_factory=list)
    last_stats: StepStats | None = None
    decisions: int = 0
    _lost_at: dict[str, int] = field(default_factory=dict, repr=False)
    _unsettled: dict[str, tuple[int, int, int]] = field(default_factory=dict, repr=False)

    @hookimpl(wrapper=True)
    def superinfer_schedule(
        self, state: StepState
    ) -> Generator[None, ScheduleDecision | None, ScheduleDecision | None]:
        decision = yield
        if decision is None:
            return None
        self.decisions += 1
        if decision.max_repeat_steps != 1:
            decision = dataclasses.replace(decision, max_repeat_steps=1)
        self._record(state, decision)
        return decision

    @hookimpl
    def superinfer_step_finished(self, stats: StepStats) -> None:
        self.last_stats = stats

    def _record(self, state: StepState, decision: ScheduleDecision) -> None:
        views = {v.request_id: v for v in (*state.waiting, *state.running, *state.swapped)}
        for view in state.running:
            rid = view.request_id
            self.high_water[rid] = max(self.high_water.get(rid, 0), view.computed_tokens)
        entering = [views[r] for r in (*decision.admit, *decision.resume) if r in views]
        urgent = min((v.slo.priority for v in entering), default=None)
        for rid, mode in decision.preempt.items():
            view = views[rid]
            mode_name = mode.value if isinstance(mode, PreemptMode) else str(mode)
            if mode_name == "recompute":
                if rid in self._lost_at:
                    self.regained_before_preempt.append(view.computed_tokens >= self._lost_at[rid])
                self._lost_at[rid] = max(self._lost_at.get(rid, 0), view.computed_tokens)
            self.preemptions.append(
                Preemption(
                    rid,
                    state.now_s,
                    view.computed_tokens,
                    view.prompt_tokens,
                    mode_name,
                    view.slo.priority,
                    urgent,
                )
            )
        for rid in decision.admit:
            view = views[rid]
            again = view.num_preemptions > 0
            if not again:
                self.first_hit[rid] = view.prefix_hit_tokens
            self.admissions.append(
                Admission(
                    rid,
                    state.now_s,
                    again,
                    view.slo.priority,
                    view.arrival_s,
                    view.prefix_hit_tokens,
                )
            )
        for rid in decision.resume:
            view = views[rid]
            self.admissions.append(
                Admission(rid, state.now_s, True, view.slo.priority, view.arrival_s, 0)
            )
        self._settle(views)
        for rid, n in decision.num_tokens.items():
            self.scheduled[rid] = self.scheduled.get(rid, 0) + n
            seen = views.get(rid)
            if seen is not None and rid not in decision.preempt:
                self._unsettled[rid] = (seen.computed_tokens, seen.num_preemptions, n)

    def _settle(self, views: dict[str, RequestView]) -> None:
        """Take back the tokens of the previous decision that its step did not run.

        An engine may run less than it was told: SGLang runs a new prompt's prefill batch
        without the decodes (``sim:sglang``'s ``mixed_batches=False``), so a decode decided for
        that step waits a step. What ran is read from the request's ``computed_tokens`` at the
        next decision (unknown, so counted as run, for a request that finished or was
        preempted in between).
        """
        for rid, (before, preemptions, n) in self._unsettled.items():
            view = views.get(rid)
            if view is not None and view.num_preemptions == preemptions:
                ran = min(max(view.computed_tokens - before, 0), n)
                self.scheduled[rid] -= n - ran
        self._unsettled = {}

    def lost_tokens(self) -> int:
        """Tokens of progress recompute preemptions threw away (their ``computed_tokens``)."""
        return sum(p.computed_tokens for p in self.preemptions if p.mode == "recompute")

    def recomputed_tokens(self, needed: dict[str, int]) -> int:
        """Tokens run beyond what each request needed without preemption.

        Args:
            needed: request id -> tokens it needs without preemption: prompt + output - 1 less
                its first prefix-cache hit (the last output token's KV is never computed).
        """
        return sum(max(0, self.scheduled.get(r, 0) - n) for r, n in needed.items())
