"""Estimates: remaining output, work left and time to a request's most pressing target, the
in-tier urgency key, and when a request is next checked (aging, certain miss, promotion)."""

from __future__ import annotations

import heapq

from superinfer.policy_core.policies.superinfer.config import SuperInferConfig
from superinfer.policy_core.policies.superinfer.records import (
    _BEST_EFFORT_KEY,
    _INF,
    _SWAPPED,
    _WAITING,
    _Entry,
    _Replica,
)
from superinfer.policy_core.types import RequestView


class _Estimates(SuperInferConfig):
    """Layer 1: predictions from the length estimator and the step-time model (no decisions)."""

    # -- what a subclass (the oracle) may override ----------------------------------------------

    def remaining_output_tokens(self, view: RequestView) -> float:
        """Predicted output tokens still to come for ``view`` (>= 1)."""
        return self.estimator.remaining_tokens(
            view.slo.name, view.generated_tokens, view.max_output_tokens
        )

    def credit_tokens(self, view: RequestView, quantile: float | None = None) -> float:
        """Output tokens ``view`` will still produce with probability ``1 - quantile``
        (``credit_quantile`` when ``None``): what the TTFT boost may count on as future TPOT
        credit."""
        q = self.credit_quantile if quantile is None else quantile
        return self.estimator.remaining_quantile(
            view.slo.name, view.generated_tokens, view.max_output_tokens, q
        )

    # -- estimates and check times --------------------------------------------------------------

    def _typical_step_s(self) -> float:
        return self._step_ewma_s or self.step_time.step_s(0.0, 0.0)

    def _decode_interval_s(self, fallback: float) -> float:
        """The mean time between a decode's tokens, s: the exponential mean of the reports'
        duration over that of their steps that ran decodes (weight ``1 /
        decode_interval_memory``; kept by ``on_step_finished`` under ``ttft_boost_unmixed``).
        Where a prefill step runs alone it holds up every decode, so this exceeds the mean step.
        ``fallback`` before a step with decodes."""
        d, n = self._interval_means
        return d / n if n > 0 else fallback

    def _deadline_aging_s(self, e: _Entry) -> float:
        """The instant before which a deadline-class ``e`` is not aged, s: its arrival plus
        ``aging_deadline_fraction`` of its deadline budget (a 600 s batch deadline at 0.5: 300 s),
        so a deadline request is not lifted above every tier while most of its slack is left
        (deadline-aware promotion still moves it to tier 0 once its estimate reaches its slack);
        ``-inf`` without a deadline or with the fraction 0."""
        f = self.aging_deadline_fraction
        if f > 0.0 and e.deadline_s is not None:
            return e.arrival_s + f * (e.deadline_s - e.arrival_s)
        return -_INF

    def _aging_at(self, e: _Entry) -> float:
        """The instant queued ``e`` is aged, s: ``aging_s`` after it was queued, and no sooner
        than :meth:`_deadline_aging_s`."""
        return max(e.queued_s + self.aging_s, self._deadline_aging_s(e))

    def _aging_due(self, e: _Entry, now: float) -> bool:
        """Whether queued ``e`` is due to be aged at ``now`` (the test :meth:`_aging_at` sets the
        check for, its ``aging_s`` part written as a wait, so that it compares as it always did)."""
        return now - e.queued_s >= self.aging_s and now >= self._deadline_aging_s(e)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _key(self, e: _Entry, v: RequestView) -> float:
        """In-tier order (smaller first): the instant the request's most pressing target is
        due, minus the work left before it for a deadline class (least slack). Best-effort
        requests come after every other, in arrival order."""
        if e.best_effort:
            return _BEST_EFFORT_KEY + e.arrival_s
        if e.aged and self.fcfs_guard:
            return e.arrival_s - _BEST_EFFORT_KEY  # aged: before the rest of its tier, fcfs
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

    def _fastest_prefill_s(self, left: int, rep: _Replica) -> float:
        """The lower bound on prefilling ``left`` tokens, s: alone, in chunks of the whole token
        budget (``_target``'s ``optimistic`` for a TTFT or deadline target)."""
        return self.step_time.prefill_s(left, rep.token_budget, 0.0) if left > 0 else 0.0

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
        fastest = self._fastest_prefill_s(left, rep)
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

    def _check_queued_at(self, rep: _Replica, e: _Entry, when: float) -> None:
        """Check queued ``e`` at ``when`` (none if infinite): any earlier check goes stale."""
        e.next_check_s = when
        e.check_version += 1
        if when < _INF:
            rep.due.push((when, self._next_seq(), e.rid, e.check_version))

    def _schedule_check(
        self,
        rep: _Replica,
        e: _Entry,
        now: float,
        *,
        checked: bool = False,
        target: tuple[float, float, float] | None = None,
    ) -> None:
        """Set when ``e`` is next checked; queued requests go on the replica's due heap.

        The check falls at the first future instant something could happen to it: aging, its
        miss becoming certain, or its estimate reaching its slack (first ``estimate_lookahead``
        early, since estimates move with the load, then at the exact crossing). When such an
        instant has passed without effect (the estimate moved), it is checked again a step
        later (``checked``: a check just ran), or now if none ran yet. A running request with
        any of these pending is checked at least every ``recheck_s``; one with none (a tier-0
        decode) is not checked until it changes tier. ``target``: ``_target(e, e.view, rep)``
        when the caller has just computed it (a check that found nothing to do).
        """
        instants: list[float] = []
        queued = e.where in (_WAITING, _SWAPPED)
        if queued and self.aging and not e.aged:
            instants.append(self._aging_at(e))
        if not e.best_effort and not e.aged:
            if target is None:
                target = self._target(e, e.view, rep)
            deadline, estimate, optimistic = target
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
        if queued:
            self._check_queued_at(rep, e, when)
            return
        e.next_check_s = when
        e.check_version += 1
        if when < _INF:  # the running pass visits it then (running.py)
            heapq.heappush(rep.run_due, (when, e.rid, e.check_version))
