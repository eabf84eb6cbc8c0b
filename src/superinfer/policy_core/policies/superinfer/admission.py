"""Admission and shedding: a queued request admitted (or a swapped one resumed) into a step as
far as seats, KV blocks and the link allow, and the bounded per-tier queues that shed the least
important waiting requests."""

from __future__ import annotations

from superinfer.policy_core.batching import blocks_for_tokens, step_blocks
from superinfer.policy_core.policies.superinfer.preemption import _Preemption
from superinfer.policy_core.policies.superinfer.records import (
    _RUNNING,
    _SWAPPED,
    _WAITING,
    _Entry,
    _Replica,
    _Step,
)


class _Admission(_Preemption):
    """Layer 4: tokens for one request in the step being built, and rejections."""

    def _place(
        self,
        rep: _Replica,
        step: _Step,
        e: _Entry,
        unit: int,
        cpu: bool,
        rank_below: int,
        *,
        room: bool = True,
    ) -> int:
        """Give ``e`` up to ``unit`` more tokens this step, admitting or resuming it if it is
        queued; preempts worse-tier running requests to make room (not with ``room`` false:
        then it gives nothing when the tokens do not fit as things are). Returns tokens given."""
        state = step.state
        rid = e.rid
        if rid in step.preempt or rid in step.reject:
            return 0  # preempted or shed in this very decision: not in the state's queues
        queued = e.where in (_WAITING, _SWAPPED)
        v = self._fresh_view(rep, e, step) if queued else e.view
        if v is None:
            return 0
        serial = False  # a batch prompt SGLang will run whole (serial_whole_prefills)
        if queued:
            e.view = v
            if step.seats <= 0 and 0 <= rank_below and step.worst_tier <= rank_below:
                step.held.add("held_seats")
                return 0  # no free seat, and no worse tier runs to make one (_make_room)
            # the seat reserve and serial prefills apply to a request without a TTFT target while
            # TTFT-class ones arrive (one within ttft_reserve_idle_s), and neither holds back an
            # aged one: aging is what bounds a batch request's wait
            last = self._last_ttft_s
            batch = (
                e.ttft_s is None
                and last is not None
                and state.now_s - last <= self.ttft_reserve_idle_s
            )
            serial = batch and state.prefill_runs_whole and self.serial_whole_prefills
            if batch and not e.aged:
                if self._seat_reserve and step.seats <= self._seat_reserve and state.running:
                    step.held.add("held_seat_reserve")
                    return 0  # the seats left are TTFT-class requests' (ttft_seat_reserve)
                if serial and self._whole_prefill_running(step):
                    step.held.add("held_serial_prefill")
                    return 0  # one batch prompt's chunks at a time
        given = step.tokens.get(rid, 0)
        n = v.pending_tokens - given  # min(unit, pending - given, budget), inline
        if unit < n:
            n = unit
        if step.budget < n:
            n = step.budget
        cap = step.no_ttft_left  # the TTFT reserve where batches mix: all tokens count against it
        if cap is not None and e.ttft_s is None and cap < n:
            n = cap
        if n <= 0:
            return 0
        # KV blocks charged the way the engine's decision check charges them (step_blocks):
        # an admission pays its admission rule's reservation, a swapped request all its blocks.
        admitting = e.where == _WAITING or rid in step.admit
        before = step_blocks(v, given, state, admit=admitting) if given else 0
        extra = step_blocks(v, given + n, state, admit=admitting) - before
        if extra < 0:
            extra = 0
        swapping = e.where == _SWAPPED
        nbytes = v.kv_blocks * state.kv_block_bytes if swapping else 0
        if swapping and (not cpu or nbytes > step.swap_in_bytes and step.resume):
            return 0
        # Once anything is admitted this step, every later block taken must leave the headroom
        # the engine reserves for running requests (StepState.reserved_hbm_blocks) intact.
        floor = state.reserved_hbm_blocks if admitting or step.admit else 0
        if queued:
            floor += int(self.kv_watermark * state.total_hbm_blocks)
            if e.ttft_s is None and state.running and self._kv_reserve_on:
                # its whole prompt counts: later chunks, charged as running, would eat the reserve
                reserve = floor + self._ttft_kv_reserve(state.block_size_tokens)
                left = step.free - step_blocks(v, v.pending_tokens, state, admit=True)
                if left < reserve:
                    # held_kv here: the whole prompt is short of the free KV above the floor,
                    # though without the reserve a first chunk might have been admitted below
                    step.held.add("held_kv_reserve" if left >= floor else "held_kv")
                    return 0
        if step.seats <= 0 and queued or step.free - extra < floor:
            if not room or not self._make_room(rep, step, e, extra + floor, rank_below):
                if queued:
                    step.held.add("held_seats" if step.seats <= 0 else "held_kv")
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
                if serial:
                    step.whole_prefill = True
            step.seats -= 1
            self._schedule_check(rep, e, state.now_s)
        step.tokens[rid] = given + n
        step.prefills[rid] = None
        if e.fcfs_tokens:  # fcfs guard: prompt tokens served (or found cached) leave the queue
            done = min(max(e.fcfs_tokens - v.pending_tokens, 0) + n, e.fcfs_tokens)
            e.fcfs_tokens -= done
            rep.fcfs_left += done
        step.new_blocks[rid] = step.new_blocks.get(rid, 0) + extra
        step.free -= extra
        step.budget -= n
        if cap is not None:
            step.no_ttft_left = cap - n
        return n

    def _whole_prefill_running(self, step: _Step) -> bool:
        """Whether a request without a TTFT target that this policy admitted is still in its
        prefill, or one was admitted in this step (``serial_whole_prefills``). Still in its
        prefill: running without a first token (the SGLang view lists its chunked request so),
        or in no queue of the state (an engine that hides a request between its chunks, as the
        SGLang view did before 789b641); one the engine left in its waiting queue (not
        taken yet) is not; only requests of this state's replica count. Looked at once per
        call: O(requests the policy holds). An entry whose finish the engine never reported
        would count for good (the SGLang plugin reports a request's end from its output stream
        and SGLang's abort paths, ``adapters/sglang/plugin.py`` ``_end``)."""
        if step.whole_prefill is None:
            state = step.state
            views = state.view_map()
            running = {v.request_id for v in state.running}
            step.whole_prefill = any(
                e.ttft_s is None
                and e.where == _RUNNING
                and e.replica == state.replica
                and (
                    (v := views.get(e.rid)) is None or e.rid in running and v.first_token_s is None
                )
                for e in self._entries.values()
            )
        return step.whole_prefill

    def _ttft_kv_reserve(self, block_size_tokens: int) -> int:
        """KV blocks an admission without a TTFT target leaves free where the policy cannot
        preempt to make room later: ``ttft_kv_reserve_requests`` TTFT-class requests of the
        ``ttft_reserve_quantile`` of recent ones' prompt plus output cap (the whole footprint
        SGLang's ``PrefillAdder`` charges an ``ignore_eos`` request), each rounded up to whole
        blocks; 0 before any TTFT-class request arrived."""
        tokens = self.ttft_footprints.value()
        if tokens is None:
            return 0
        return self.ttft_kv_reserve_requests * blocks_for_tokens(int(tokens), block_size_tokens)

    def _reject(self, rep: _Replica, e: _Entry, step: _Step, reason: str) -> None:
        self._counters["rejected"] += 1
        if self.ttft_reserve_shed_s:
            self._shed_at[rep.index] = step.state.now_s
        self._fcfs_leave(rep, e)
        self._dequeue(rep, e)
        step.reject[e.rid] = reason
        self._entries.pop(e.rid, None)

    def _shed(self, rep: _Replica, step: _Step) -> None:
        """Admission control: a tier over ``max_waiting_per_tier`` sheds its least important
        waiting requests (best effort first, then the lowest SLO weight, then the latest).

        A request preempted in this very decision is still in the state's running queue, where
        an engine cannot reject it (``check_decision``): when it is the least important, the
        tier sheds nothing more now, and it is shed at the next call, from the waiting queue.
        """
        if max(rep.count) <= self.max_waiting_per_tier:
            return  # no tier over its bound (the common case: one comparison per tier, in C)
        for t in range(self.num_tiers):
            heap = rep.shed_heaps[t]
            while rep.count[t] > self.max_waiting_per_tier:
                e = self._peek(heap, _WAITING)
                if e is None or e.rid in step.preempt:
                    break
                self._reject(rep, e, step, f"shed: tier {t} queue full")
