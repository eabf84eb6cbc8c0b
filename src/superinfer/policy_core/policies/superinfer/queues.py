"""Queues and tiers: the initial tier (skip-join), tier changes, and the per-replica waiting and
swapped heaps, kept in step with the engine's queues (lazy deletion, rebuilt only when the
engine's queues disagree in size)."""

from __future__ import annotations

import heapq
from typing import Any

from superinfer.policy_core.policies.superinfer.estimates import _Estimates
from superinfer.policy_core.policies.superinfer.records import (
    _GONE,
    _INF,
    _RUNNING,
    _SWAPPED,
    _WAITING,
    _Entry,
    _Replica,
    _Step,
)
from superinfer.policy_core.types import Queue, RequestView, StepState

#: Items a lazily-deleted queue heap may hold beyond twice its live ones before it is compacted.
_COMPACT_SLACK = 64


class _Queues(_Estimates):
    """Layer 2: the replica books (waiting/swapped heaps per tier, aged heap, due heap)."""

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
            if len(rep.aged) > 2 * (len(rep.waiting) + len(rep.swapped)) + _COMPACT_SLACK:
                self._compact(rep.aged)
        elif where == _WAITING:
            t = e.tier
            heap, shed = rep.heaps[t], rep.shed_heaps[t]
            heapq.heappush(heap, (e.key, seq, e.rid, e.version))
            heapq.heappush(
                shed, (0 if e.best_effort else 1, e.weight, -e.key, seq, e.rid, e.version)
            )
            live = rep.count[t] = rep.count[t] + 1
            if not e.best_effort:
                rep.feasible[t] += 1
            if len(shed) > 2 * live + _COMPACT_SLACK:  # rejected ones stay until shedding starts
                self._compact(shed)
            if len(heap) > 2 * live + _COMPACT_SLACK:
                self._compact(heap)
        else:
            heap = rep.swap_heaps[e.tier]
            heapq.heappush(heap, (e.key, seq, e.rid, e.version))
            if len(heap) > 2 * len(rep.swapped) + _COMPACT_SLACK:
                self._compact(heap)
        self._schedule_check(rep, e, now, checked=checked)

    def _compact(self, heap: list[tuple[Any, ...]]) -> None:
        """Drop the items of a lazily-deleted queue heap that can never be live again (their
        entry is gone or its ``version`` moved on: versions only grow, and a request id is
        engine-unique, ``RequestView.request_id``) and re-heapify, in place. Called when the
        heap holds more than twice its live items plus :data:`_COMPACT_SLACK`, so the cost is
        O(1) amortized per push and a heap stays O(live) long: without it a tier's shed heap
        kept one item per request that ever waited there while nothing was shed (79,526 items,
        the tier's waiting heap 129, after 30 s of ``benchmarks/policy_overhead.py`` at 2,560 /
        40,960), growing for a server's lifetime. Pops are unchanged: every item carries a
        unique sequence number, so the order of the live items does not depend on the heap's
        layout."""
        entries = self._entries
        heap[:] = [
            it for it in heap if (x := entries.get(it[-2])) is not None and x.version == it[-1]
        ]
        heapq.heapify(heap)

    def _dequeue(self, rep: _Replica, e: _Entry) -> None:
        """Take ``e`` out of ``rep``'s waiting or swapped queue (heap items go stale)."""
        if e.where == _WAITING:
            if rep.waiting.pop(e.rid, None) is not None and not e.aged:
                rep.count[e.tier] -= 1
                if not e.best_effort:
                    rep.feasible[e.tier] -= 1
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
            rep = self._replica(e.replica)
            self._fcfs_leave(rep, e)
            self._dequeue(rep, e)

    def _fcfs_join(self, rep: _Replica, e: _Entry) -> None:
        """Count a new ``e``'s prompt tokens for the fcfs guard and, if it has no TTFT target,
        file it to be aged once the prompt tokens gone from ``rep`` (prefilled, found cached,
        or of requests rejected or ended: :meth:`_fcfs_leave`, ``_Admission._place``) reach
        the ones that arrived before it: the point where fcfs, which prefills in arrival
        order, would have started it. O(log n) per request."""
        if self.fcfs_guard:
            e.fcfs_tokens = max(e.view.pending_tokens, 1)
            if e.ttft_s is None:
                heapq.heappush(rep.fcfs_due, (rep.fcfs_arrived, self._next_seq(), e.rid))
            rep.fcfs_arrived += e.fcfs_tokens

    @staticmethod
    def _fcfs_leave(rep: _Replica, e: _Entry) -> None:
        """Count the rest of ``e``'s prompt tokens as gone (it is rejected or ended)."""
        if e.fcfs_tokens:
            rep.fcfs_left += e.fcfs_tokens
            e.fcfs_tokens = 0

    def _adopt(self, rep: _Replica, view: RequestView) -> _Entry:
        """An entry for a request the policy first meets in a state (never announced)."""
        e = self._entries.get(view.request_id)
        if e is None:
            e = self._entries[view.request_id] = _Entry(view)
            e.tier = self._initial_tier(view)
            e.demote_at = self._quanta[e.tier]
            self._fcfs_join(rep, e)
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
        from the state: through the engine's id -> view map (``StepState.views`` and
        ``queue_of``) when it gives one, else through an index of ``state.waiting`` and
        ``state.swapped`` built once per call on the first admission or resume attempt.
        """
        state = step.state
        if state.queue_of is not None and state.views is not None:
            queue = state.queue_of.get(e.rid)
            v = state.views[e.rid] if queue is Queue.WAITING or queue is Queue.SWAPPED else None
        else:
            if step.queued_views is None:
                step.queued_views = {v.request_id: v for v in state.waiting}
                step.queued_views.update((v.request_id, v) for v in state.swapped)
            v = step.queued_views.get(e.rid)
        if v is None:
            self._dequeue(rep, e)  # not in the engine's queue any more
        elif e.stale:
            e.stale = False
            rep.num_stale -= 1
        return v

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

    def _set_tier(self, e: _Entry, tier: int) -> None:
        service = max(e.view.computed_tokens - e.view.cached_tokens, 0) + e.lost_tokens
        e.tier = tier
        e.demote_at = service + self._quanta[tier]

    def _make_resident(self, e: _Entry, v: RequestView) -> None:
        e.where = _RUNNING
        e.view = v
        e.resident_service = max(v.computed_tokens - v.cached_tokens, 0) + e.lost_tokens
        e.next_check_s = -_INF

    def _running_entries(self, state: StepState) -> list[_Entry]:
        """The entries of ``state.running``, in its order, each with the state's view (the
        running pass refreshes only the views it visits: running.py)."""
        entries = self._entries
        out = []
        for v in state.running:
            e = entries.get(v.request_id)
            if e is not None:
                e.view = v
                out.append(e)
        return out
