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


class _Promotion(_Admission):
    """Layer 5: aging, best-effort demotion and deadline-aware promotion."""

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
