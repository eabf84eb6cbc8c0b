"""Promotion: the checks that age a request, mark it best effort (or reject it) once its SLO is
out of reach, or promote it to tier 0 when its estimate reaches its slack."""

from __future__ import annotations

import heapq

from superinfer.policy_core.policies.superinfer.admission import _Admission
from superinfer.policy_core.policies.superinfer.records import (
    _INF,
    _SWAPPED,
    _WAITING,
    _Entry,
    _Replica,
    _Step,
)

#: The rejection reason of a waiting request found hopeless (``reject_hopeless``).
_HOPELESS = "slo_unattainable"

#: The counter each check outcome adds to.
_COUNTER = {
    "age": "aged",
    "fcfs": "fcfs_aged",
    "hopeless": "best_effort",
    "promote": "promotions",
}


class _Promotion(_Admission):
    """Layer 5: aging, best-effort demotion and deadline-aware promotion."""

    def _check_target(
        self, rep: _Replica, e: _Entry, now: float
    ) -> tuple[str, tuple[float, float, float] | None]:
        """Evaluate aging, hopelessness and promotion for ``e``: what happened (``""`` for
        nothing), and the ``_target`` computed on the way (``None`` if none), which
        :meth:`_schedule_check` reuses when nothing happened: nothing it reads (the view, the
        replica's load, the estimators) changes in between. A request awaiting its first token
        is found hopeless on ``_target``'s lower bound alone, before its estimate at the
        current load is computed (most due checks of an overloaded queue end there)."""
        v = e.view
        queued = e.where in (_WAITING, _SWAPPED)
        if queued and self.aging and not e.aged and self._aging_due(e, now):
            return "age", None
        if e.best_effort or e.aged:
            return "", None
        hopeless_ends = self.best_effort_demotion or self.reject_hopeless
        if e.ttft_s is not None and v.first_token_s is None and hopeless_ends:
            if self._fastest_prefill_s(self._prefill_left(v), rep) > e.arrival_s + e.ttft_s - now:
                return "hopeless", None
        target = self._target(e, v, rep)
        deadline, estimate, optimistic = target
        if deadline == _INF:
            return "", target
        slack = deadline - now
        if optimistic > slack and hopeless_ends:
            return "hopeless", target
        if self.promotion and e.tier > 0 and estimate > slack - self.promotion_margin_s:
            return "promote", target
        return "", target

    def _apply_check(self, rep: _Replica, e: _Entry, outcome: str, step: _Step, now: float) -> None:
        queued = e.where in (_WAITING, _SWAPPED)
        where = e.where
        if outcome == "hopeless" and self.reject_hopeless and where == _WAITING:
            self._reject(rep, e, step, _HOPELESS)
            return
        if queued:
            self._dequeue(rep, e)
        self._counters[_COUNTER[outcome]] += 1
        if outcome in ("age", "fcfs"):
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

    def _run_due_checks(self, rep: _Replica, step: _Step, now: float) -> None:
        fcfs = rep.fcfs_due
        while fcfs and fcfs[0][0] <= rep.fcfs_left:
            e = self._entries.get(heapq.heappop(fcfs)[2])
            if e is not None and e.where in (_WAITING, _SWAPPED) and not e.aged:
                self._apply_check(rep, e, "fcfs", step, now)
        due = rep.due
        hopeless: list[_Entry] = []
        while (top := due.first()) is not None and top[0] <= now:
            _, _, rid, version = due.pop()
            e = self._entries.get(rid)
            if e is None or e.check_version != version or e.where not in (_WAITING, _SWAPPED):
                continue
            outcome, target = self._check_target(rep, e, now)
            if outcome == "hopeless" and self.reject_hopeless and e.where == _WAITING:
                hopeless.append(e)
            elif outcome:
                self._apply_check(rep, e, outcome, step, now)
            else:
                self._schedule_check(rep, e, now, checked=True, target=target)
        if hopeless:
            self._reject_under_pressure(rep, hopeless, step, now)

    def _reject_under_pressure(
        self, rep: _Replica, hopeless: list[_Entry], step: _Step, now: float
    ) -> None:
        """Reject the waiting requests found hopeless at this call, but only under pressure:
        where a request of their tier or a higher one, waiting or running, can still meet its
        SLO (a hopeless request served would take the step time or the seat that one needs).
        Shedding is the answer to load, not to an engine step longer than a request's target:
        a hopeless request without such a peer keeps its place (first in its tier: its target
        is the earliest) and is checked again a typical step later (before its aging instant,
        which that check still applies), so it is rejected once pressure appears (conformance
        ``head_of_line``: the shorts arriving while a long batch prompt's step runs are
        served, late, instead of all rejected).

        ``rep.feasible[t]`` still counts every request of ``hopeless`` (none is marked yet), so
        they are subtracted first. O(tiers + len(hopeless)), plus one pass over the running
        set (stopping at a tier-0 peer) on a call where some tier has no waiting peer.
        """
        pending = [0] * self.num_tiers
        for e in hopeless:
            pending[e.tier] += 1
        peers, at_or_above = 0, []
        for t in range(self.num_tiers):
            peers += rep.feasible[t] - pending[t]
            at_or_above.append(peers)
        running_best = self.num_tiers  # the best tier of a running request that is not lost
        if any(at_or_above[e.tier] == 0 for e in hopeless):
            entries = self._entries
            for v in step.state.running:
                r = entries.get(v.request_id)
                if r is not None and not r.best_effort and r.tier < running_best:
                    running_best = r.tier
                    if running_best == 0:
                        break
        for e in hopeless:
            if at_or_above[e.tier] > 0 or running_best <= e.tier:
                self._reject(rep, e, step, _HOPELESS)  # what _apply_check does for "hopeless"
            else:
                self._counters["hopeless_kept"] += 1
                self._check_queued_at(rep, e, now + self._typical_step_s())
