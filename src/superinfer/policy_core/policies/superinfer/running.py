"""The running pass made proportional to what changed (issue 21).

Every running view changes at every step, but a decode's change is predictable, and
``StepState.changes`` names the changes that are not decode advances (``irregular``) and how far
the others went (``min_advance``, ``max_advance``). When every decode advanced by the same ``D``
tokens (*lockstep*), the books advance one clock by ``D`` and visit only arrivals, irregular
changes (a prefill that ran), due checks (``_Replica.run_due``) and decodes whose KV block fills
or quantum runs out at this clock (buckets keyed by that clock value): a decode is looked at once
per KV block. The smallest TPOT allowance reads a heap per planned TPOT (target x
``tpot_plan_share``) of ``first_token_s + tpot * (generated_tokens - clock)``, constant in
lockstep (``budget._StepBudget._tpot_cap``).
Any other state (no usable change set, a missed state, decodes out of step, arrivals not at the
tail, a preemption not carried out) visits every running request and rebuilds the books; the
decision is the full pass's either way (``tests/policy_core/test_changes.py`` compares the two).

A decode that holds exactly the pages of its tokens when it is filed (``kv_blocks ==
ceil(computed_tokens / block_size_tokens)``, no ``kv_packing``) is not put in a bucket: in
lockstep its next token needs a page at every ``bs``-th clock, the clocks where ``(computed -
clock) % bs``, fixed when it is filed (its *class*), equals ``-clock % bs``. So it is kept in
``_RunBooks.classes`` (its class in ``res``), the class due at this clock is the call's set of
decodes needing one page each (``need`` counts them, their ``_Step.new_blocks`` entries are 1),
and it is looked at only when its demotion clock comes (``unit_due``) or a visit takes it out.
With one-token pages (SGLang's default) every such decode is in class 0, due at every clock;
with 16-token pages each class is due at one clock in sixteen. This trusts the engine to hold
exactly the pages of the tokens it has run once it did at a look (SGLang's adapter reports
``ceil(computed / page_size)`` pages, ``adapters/sglang/view.py``; the overhead double allocates
that, the engine doubles and the simulator too beyond an admission reserve), and a decode that
holds more stays in the buckets until it no longer does; an engine that allocates ahead only
later in a decode's life would need the buckets throughout.
"""

from __future__ import annotations

import heapq
import itertools
import math

from superinfer.policy_core.policies.superinfer.promotion import _Promotion
from superinfer.policy_core.policies.superinfer.records import (
    _INF,
    _RUNNING,
    _Decodes,
    _Entry,
    _file_prefill,
    _filed_as_before,
    _LaneItem,
    _Replica,
    _RunBooks,
    _Step,
    _TpotHeap,
    _unfile_prefill,
)
from superinfer.policy_core.types import KVPrecision, RequestView, StepState

_FP16 = KVPrecision.FP16
_NO_CLASS: dict[str, int] = {}  # never written: the class of a clock no decode is due at

_VERSIONS = itertools.count(1)


class _Running(_Promotion):
    """Layer 5b: the running pass, incremental where the change set allows."""

    def _forget(self, rid: str) -> None:
        e = self._entries.get(rid)
        if e is not None:
            rep = self._replicas.get(e.replica)
            if rep is not None and rid in rep.books.order:
                rep.books.gone.append(rid)
        super()._forget(rid)

    def _scan_running(
        self, rep: _Replica, step: _Step, now: float
    ) -> tuple[_Decodes, list[list[_LaneItem]], int]:
        """Visit the running requests that need it (module doc); returns the decodes (in
        ``state.running`` order), the prefills' lanes (per tier, in the order the rotation
        serves them: ``records._Lane``) and the KV blocks the decodes' next tokens need."""
        state = step.state
        books = rep.books
        books.growers = []
        books.need = 0
        visit = self._visit_running
        todo = self._advance_books(rep, books, state)
        visited: list[_Entry] = []
        if todo is None:  # rebuild: visit every running request, as without a change set
            self.__dict__["_run_rebuilds"] = self.__dict__.get("_run_rebuilds", 0) + 1
            books = rep.books = _RunBooks(self.num_tiers)
            books.bs, books.packing = state.block_size_tokens, state.kv_packing
            rep.run_due = []
            for v in state.running:
                visited.append(visit(rep, step, books, v, now))
            rep.run_due = [
                (e.next_check_s, e.rid, e.check_version) for e in visited if e.next_check_s < _INF
            ]
            heapq.heapify(rep.run_due)
        elif todo:
            views, order = state.views, books.order
            assert views is not None  # _advance_books checked
            for rid in sorted(todo, key=order.__getitem__):
                visit(rep, step, books, views[rid], now)
        ch = state.changes
        books.at = None if ch is None or state.views is None else (ch.series, ch.seq)
        due = rep.run_due
        entries = self._entries
        while due:  # the first live item is the soonest check of a running request
            _, rid, cv = due[0]
            e = entries.get(rid)
            if e is not None and e.check_version == cv and rid in books.order:
                break
            heapq.heappop(due)
        rep.next_running_check_s = due[0][0] if due else _INF
        counts = books.run_count
        worst = len(counts) - 1
        while worst >= 0 and not counts[worst]:
            worst -= 1
        step.worst_tier = worst  # the worst tier with a running request, -1 if none
        ids = books.dec_map  # the decodes' ``num_tokens``, in running order
        if ids is None:  # a decode joined far from the tail: every running request is filed
            prefilling = books.prefilling
            ids = books.dec_map = {rid: 1 for rid in books.order if rid not in prefilling}
            books.dec_holes = 0
        elif 2 * books.dec_holes > len(ids):  # compacted: a copy of it is then one memcpy
            ids = books.dec_map = dict.fromkeys(ids, 1)
            books.dec_holes = 0
        paged = books.classes.get(-books.clock % books.bs, _NO_CLASS)
        decodes = _Decodes(ids, list(books.dec_count), books.growers, self._entries, state,
                           paged)  # fmt: skip
        if todo is None:
            decodes._list = [e for e in visited if e.rid in ids]
        return decodes, books.lanes, books.need + len(paged)

    # -- the books --------------------------------------------------------------------------

    def _advance_books(self, rep: _Replica, books: _RunBooks, state: StepState) -> set[str] | None:
        """Bring ``books`` to ``state`` by its change set; returns the ids to visit (the decodes
        looked at on the way are filed, those needing a KV block added to ``books.growers``),
        or ``None`` when the books must be rebuilt from the whole running queue."""
        ch, views, now = state.changes, state.views, state.now_s
        if ch is None or views is None or books.at is None or (ch.series, ch.base_seq) != books.at:
            return None
        rc = ch.running
        left, irregular, order, prefilling = rc.left, rc.irregular, books.order, books.prefilling
        if (books.last_out and not left.issuperset(books.last_out)) or (
            books.gone and not left.issuperset(books.gone)
        ):
            return None  # a preemption not carried out, or an end still running: resynchronize
        if books.res and (state.block_size_tokens != books.bs or state.kv_packing is not None):
            return None  # the pages changed under the decodes kept in page classes
        books.gone.clear()
        routine = len(order) - len(prefilling)
        for rids in (left, irregular):
            for rid in rids:
                if rid not in order:
                    return None
                if rid not in prefilling:
                    routine -= 1
        advanced = len(rc.changed) - len(irregular)
        if advanced == 0:
            step_tokens = 0
        elif advanced == routine and rc.min_advance == rc.max_advance:
            step_tokens = rc.max_advance
        else:
            return None  # the decodes did not advance together
        arrived = rc.arrived
        running = state.running
        n = len(arrived)
        if n and any(v.request_id not in arrived for v in running[len(running) - n :]):
            return None  # arrivals not at the tail: the order must be rebuilt
        if len(running) != len(order) - len(left) + n:
            return None
        for rid in left:
            self._drop_running(books, rid)
        for v in running[len(running) - n :] if n else ():
            order[v.request_id] = next(books.positions)
        books.clock += step_tokens
        # who is visited: arrivals, irregular changes, due checks, decodes at a bucket's clock
        # (a prefill that ran is irregular; one that did not has the view it had)
        todo = set(arrived)
        todo.update(irregular)
        entries = self._entries
        due = rep.run_due
        while due and due[0][0] <= now:
            _, rid, cv = heapq.heappop(due)
            e = entries.get(rid)
            if e is not None and e.check_version == cv and rid in order:
                todo.add(rid)
        clock, buckets, ver = books.clock, books.buckets, books.ver
        # A decode needing a KV block was filed in its next bucket and among the hot ones: if
        # the step ran, the engine allocated the block and the bucket has it; if nothing ran,
        # it still needs the block, and is filed again under a new version (the bucket item
        # goes stale).
        refile = () if step_tokens else books.hot
        books.hot = []
        look: list[tuple[str, int]] = []
        if step_tokens:
            if step_tokens <= len(buckets):
                for t in range(clock - step_tokens + 1, clock + 1):
                    if t in buckets:
                        look.extend(buckets.pop(t))
            else:
                for t in [t for t in buckets if t <= clock]:
                    look.extend(buckets.pop(t))
        books.bs, books.packing = state.block_size_tokens, state.kv_packing
        file_decode = self._file_decode
        for items, again in ((look, False), (refile, True)):
            for rid, version in items:
                if ver.get(rid) != version or rid in todo:
                    continue
                e = entries.get(rid)
                if e is None:  # forgotten while the engine still runs it: the visit adopts it
                    todo.add(rid)
                    continue
                v = e.view = views[rid]
                service = v.computed_tokens - v.cached_tokens + e.lost_tokens
                if e.aged or service >= e.demote_at:
                    todo.add(rid)
                    continue
                if again:
                    version = ver[rid] = next(_VERSIONS)
                file_decode(books, e, v, version, service)
        res, unit_due = books.res, books.unit_due
        while unit_due and unit_due[0][0] <= clock:  # class decodes at their demotion clock
            _, rid, version = heapq.heappop(unit_due)
            if rid in res and ver.get(rid) == version:  # still in the class it was filed in
                todo.add(rid)
        return todo

    @staticmethod
    def _join_decodes(books: _RunBooks, rid: str) -> None:
        """Put ``rid`` in the decodes' map (``books.dec_map``, not ``None``) at its place in
        running order: the ids behind it (none for a join at the tail) are taken off and put
        back, or, when they are more than a fifth of the map, the map is dropped
        (``_scan_running`` rebuilds it)."""
        m, order = books.dec_map, books.order
        assert m is not None  # the caller checked
        pos, most = order[rid], len(m) // 5
        behind: list[str] = []
        for r in reversed(m):
            if order[r] < pos:
                break
            if len(behind) == most:
                books.dec_map = None
                return
            behind.append(r)
        for _ in behind:
            m.popitem()
        m[rid] = 1
        for r in reversed(behind):
            m[r] = 1

    def _drop_running(self, books: _RunBooks, rid: str) -> None:
        books.ver.pop(rid, None)
        if (t := books.tier.pop(rid, None)) is not None:
            self._unfile(books, rid, t)
        del books.order[rid]

    def _unfile(self, books: _RunBooks, rid: str, t: int) -> None:
        """Take ``rid`` out of tier ``t``'s running counts (and the TPOT heap, as a decode)."""
        books.run_count[t] -= 1
        if rid in books.prefilling:
            _unfile_prefill(books, rid, t)
        else:
            books.dec_count[t] -= 1
            if books.dec_map is not None:
                del books.dec_map[rid]
                books.dec_holes += 1
            self._untpot(books, rid)
            if (r := books.res.pop(rid, None)) is not None:
                del books.classes[r][rid]

    def _untpot(self, books: _RunBooks, rid: str) -> None:
        members = books.tkey.pop(rid, None)
        if members is not None:
            members.discard(rid)

    def _file_decode(self, books: _RunBooks, e: _Entry, v: RequestView, ver: int, sv: int) -> None:
        """Put decode ``e`` in its page class if it holds exactly the pages of its tokens
        (module doc), else in the bucket of the clock at which its KV block fills or its
        quantum runs out, or among the hot ones if its next token needs a block now."""
        computed, kb, bs = v.computed_tokens, v.kv_blocks, books.bs
        packing = books.packing
        if packing is None and kb * bs >= computed > (kb - 1) * bs:
            # its next page is taken at every ``bs``-th clock, where its class is due: no look
            # until its quantum runs out
            rid = e.rid
            r = books.res[rid] = (computed - books.clock) % bs
            members = books.classes.get(r)
            if members is None:
                books.classes[r] = {rid: 1}
            else:
                members[rid] = 1
            left = e.demote_at - sv  # > 0 here (sv: its service, tokens)
            if left < _INF:
                heapq.heappush(books.unit_due, (books.clock + math.ceil(left), e.rid, ver))
            return
        if packing is not None and v.kv_precision is _FP16:
            packing = None  # FP16 pages: ceil(tokens / bs)
        if packing is None:
            grow = -(-(computed + 1) // bs) - kb  # = step_blocks(v, 1, admit=False)
        else:
            grow = packing.blocks(computed + 1, v.kv_precision) - kb
        if grow > 0:
            books.growers.append((books.order[e.rid], e, grow))
            books.need += grow
            kb += grow  # what it holds once its next token ran
        if packing is None:
            ahead = kb * bs - computed  # >= 1 here
        else:  # packed pages: looked at again by its group's end (KVPacking.tokens_that_fit)
            ahead = max(1, packing.tokens_that_fit(computed, v.kv_precision, kb))
        left = e.demote_at - sv  # > 0 here (sv: its service, tokens)
        if left < ahead:
            ahead = max(1, math.ceil(left))
        item = (e.rid, ver)
        at = books.clock + ahead
        bucket = books.buckets.get(at)
        if bucket is None:
            books.buckets[at] = [item]
        else:
            bucket.append(item)
        if grow > 0:  # looked at again next call if nothing ran, else at clock + ahead
            books.hot.append(item)

    def _visit_running(
        self,
        rep: _Replica,
        step: _Step,
        books: _RunBooks,
        v: RequestView,
        now: float,
    ) -> _Entry:
        """The full pass's work for one running request (refresh, demotion, due check), then
        its place in the books."""
        e = self._entries.get(v.request_id)
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
            self._set_tier(e, min(e.tier + 1, self.num_tiers - 1))
            self._counters["demotions"] += 1
            step.changed.append(e)
            e.next_check_s = now  # its promotion rule may apply now
        if now >= e.next_check_s:
            outcome, target = self._check_target(rep, e, now)
            if outcome:
                self._apply_check(rep, e, outcome, step, now)
            else:
                self._schedule_check(rep, e, now, checked=True, target=target)
        # its place in the books
        rid = e.rid
        if rid not in books.order:
            books.order[rid] = next(books.positions)
        generated = v.generated_tokens
        decoding = generated and v.prompt_tokens + generated - computed == 1
        if not decoding and _filed_as_before(books, e, e.tier):
            books.ver[rid] = next(_VERSIONS)
            return e  # a prefill that ran a chunk: its lanes and counts stand
        old = books.tier.get(rid)
        if old is not None:
            self._unfile(books, rid, old)
        t = books.tier[rid] = e.tier
        books.run_count[t] += 1
        version = books.ver[rid] = next(_VERSIONS)
        if decoding:
            books.dec_count[t] += 1
            if books.dec_map is not None:
                self._join_decodes(books, rid)
            service = computed - v.cached_tokens + e.lost_tokens
            self._file_decode(books, e, v, version, service)
            tpot, first = e.tpot_s, v.first_token_s
            if tpot is not None and first is not None and not e.best_effort:
                tpot *= self.tpot_plan_share  # the planned TPOT: the heaps' and caps' unit
                g = generated - books.clock
                heap = books.tpot.get(tpot)
                if heap is None:
                    heap = books.tpot[tpot] = _TpotHeap()
                members = heap.members.get((first, g))
                if members is None:
                    members = heap.members[(first, g)] = set()
                    heapq.heappush(heap.heap, (first + tpot * g, first, g))
                members.add(rid)
                books.tkey[rid] = members
        else:
            _file_prefill(books, e, t)
        return e
