"""Rotation: the step's prefill tokens rotated across tiers by stride scheduling on their
weights (Waldspurger and Weihl, MIT/LCS/TM-528, 1995), and rotation through HBM: residents of
worse tiers swapped out proactively, promoted swapped requests prefetched."""

from __future__ import annotations

from superinfer.policy_core.batching import finish_aware, step_blocks
from superinfer.policy_core.policies.superinfer.budget import _StepBudget
from superinfer.policy_core.policies.superinfer.records import (
    _INF,
    _RUNNING,
    _SWAPPED,
    _WAITING,
    _awaits_first_token,
    _Decodes,
    _Entry,
    _Lane,
    _LaneItem,
    _Replica,
    _Step,
)

_NONE: frozenset[str] = frozenset()


class _Rotation(_StepBudget):
    """Layer 7: who gets the prefill tokens, and who rotates out of HBM."""

    def _allocate_prefill(
        self, rep: _Replica, step: _Step, lanes: list[list[_LaneItem]], allow: int, cpu: bool
    ) -> None:
        """Hand ``allow`` prefill tokens out: aged requests first, then the tiers by stride
        scheduling on their weights; inside a tier, running prefills continue before swapped
        requests resume and before waiting ones are admitted, each in urgency order.

        ``lanes`` are the running books' (``_scan_running``), kept sorted across calls, so a
        call reads only the front of each: O(tiers + requests served)."""
        k = self.num_tiers
        # preempted before the rotation: not in its lanes (a copy: the rotation may add more)
        skip = frozenset(step.preempt) if step.preempt else _NONE
        ongoing = [_Lane(lane, self._entries, skip) for lane in lanes]
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
        has_demand = self._has_demand
        tiers = range(k)
        demand = [has_demand(rep, ongoing, t, cpu) for t in tiers]
        if demand != active:  # a tier that was idle joins at the current virtual time
            floor = _INF
            for t in tiers:
                if demand[t] and active[t] and passes[t] < floor:
                    floor = passes[t]
            for t in tiers:
                if demand[t] and not active[t] and passes[t] < floor < _INF:
                    passes[t] = floor
            active[:] = demand
        # ``demand`` from here on: the tiers with demand that are not blocked (a blocked tier
        # gets no more turns this step)
        unit = self.rotation_unit_tokens
        alone_but = self._other_tiers
        while left > 0:
            t = -1  # the tier with demand, not blocked, with the smallest pass (then index)
            for i in tiers:
                if demand[i] and (t < 0 or passes[i] < passes[t]):
                    t = i
            if t < 0:
                break
            lane = ongoing[t]
            e = lane.head()
            while e is not None and e.rid in step.preempt:
                lane.pop()  # made room for a better tier earlier in this step
                e = lane.head()
            if e is None and cpu:
                e = self._peek(rep.swap_heaps[t], _SWAPPED)
            if e is None:
                e = self._peek(rep.heaps[t], _WAITING)
            if e is None:
                demand[t] = False
                continue
            was_queued = e.where != _RUNNING
            given = 0
            if not was_queued:
                for i in alone_but[t]:
                    if demand[i]:
                        break
                else:  # no other tier can take a turn
                    given = self._place_turns(rep, step, e, left, cpu, t)
            if not given:
                given = self._place(rep, step, e, unit if unit < left else left, cpu, t)
                if not given:
                    demand[t] = False  # blocked
                    continue
                passes[t] += given / weights[t]
            left -= given
            if self._pending_after(step, e) <= 0:
                if not was_queued:
                    lane.pop()
            elif was_queued:
                lane.push(e)  # a request admitted mid-prefill keeps the next turn
            demand[t] = self._has_demand(rep, ongoing, t, cpu)
        low = min(passes)
        if low > 1e9:  # keep the virtual times small; only differences matter
            rep.passes = [p - low for p in passes]

    def _protect_first_tokens(self, rep: _Replica, step: _Step, decodes: _Decodes) -> None:
        """The first-token guard, then leaving decodes out for an urgent prefill (each where
        its option is on: ``first_token_guard``, ``yield_decodes``)."""
        if self.first_token_guard:
            self._guard_first_tokens(rep, step, decodes)
        if self.yield_decodes:
            self._yield_decodes(rep, step, decodes)

    def _guard_first_tokens(self, rep: _Replica, step: _Step, decodes: _Decodes) -> int:
        """Trim other prefills' tokens so the step ends before the tightest first-token
        deadline among the TTFT-class prefills it completes; returns the tokens trimmed.

        Stride rotation gives a worse tier its weighted share of every contended step, so a
        chat whose whole prompt fits in the step can still miss its TTFT because a batch
        prompt's chunk shares the step (a 16-token chat beside a 2,016-token chunk waits ~0.4 s
        on an A100 for Llama-3.1-70B TP4; ``conform`` scenario ``head_of_line``). With the
        step's predicted end ``now + step_s(prefill, decodes)`` past that deadline ``d``, the
        prefills of tiers worse than the urgent request's that await no first token, and the
        prefills of its tier or worse that await a first token of their own and would still get
        it in time after the trimmed step (the rest in whole-budget chunks: ``prefill_s``), give
        back ``ceil((end - d) / prefill_token_s)`` tokens (last tier first, the largest chunk
        first inside a tier), only if that many are theirs to give (no trim for a deadline out
        of reach anyway). The second kind is the 4,085-token chat whose last token shared a step
        with a later chat's 1,354-token chunk (``benchmarks/trace_request_steps.py``, conv-494).
        A request admitted or resumed in this step keeps at least one token, so it still runs;
        its KV blocks are re-charged for the shorter chunk and its tier's stride pass refunded.
        """
        model = self.step_time
        now = step.state.now_s
        deadline, urgent_tier = _INF, self.num_tiers
        prefill = 0
        pieces: list[tuple[_Entry, int]] = []
        tokens, entries = step.tokens, self._entries
        for rid in step.prefills:  # not the decodes (one token each, no first token to guard)
            n = tokens.get(rid, 0)
            e = entries.get(rid)
            if e is None or n == 0:
                continue
            v = e.view
            prefill += n
            pieces.append((e, n))
            ttft = e.ttft_s
            if n >= v.pending_tokens and ttft is not None and _awaits_first_token(e):
                d = e.arrival_s + ttft
                if d < deadline:
                    deadline, urgent_tier = d, e.tier
        if deadline == _INF:
            return 0
        late_s = now + model.step_s(prefill, len(decodes)) - deadline
        if late_s <= 0 or model.prefill_token_s <= 0:
            return 0
        excess = -(-late_s // model.prefill_token_s)
        started = set(step.admit) | set(step.resume)
        ends_s = now + model.step_s(prefill - excess, len(decodes))  # the step, trimmed
        budget = step.state.token_budget

        def gives(e: _Entry, n: int) -> bool:
            if not _awaits_first_token(e):
                return e.tier > urgent_tier
            # a later first token that still comes in time after this step, prefilled in
            # whole-budget chunks from its end
            due = e.arrival_s + e.ttft_s  # type: ignore[operator]  # awaits: has a TTFT
            rest = model.prefill_s(e.view.pending_tokens, budget, len(decodes))
            return e.tier >= urgent_tier and n < e.view.pending_tokens and ends_s + rest < due

        donors = [(e, n - (1 if e.rid in started else 0)) for e, n in pieces if gives(e, n)]
        if sum(g for _, g in donors) < excess:
            return 0  # out of reach even so: keep the throughput
        donors.sort(key=lambda d: (-d[0].tier, -d[1]))
        state = step.state
        trimmed = 0
        for e, give in donors:
            if trimmed >= excess:
                break
            cut = int(min(give, excess - trimmed))
            if cut <= 0:
                continue
            rid, n = e.rid, step.tokens[e.rid]
            admitting = rid in step.admit
            v = e.view
            old = step_blocks(v, n, state, admit=admitting)
            new = step_blocks(v, n - cut, state, admit=admitting) if n - cut else 0
            if n - cut:
                step.tokens[rid] = n - cut
            else:
                del step.tokens[rid]
            freed = max(old - new, 0)
            step.new_blocks[rid] = max(step.new_blocks.get(rid, 0) - freed, 0)
            step.free += freed
            step.budget += cut
            rep.passes[e.tier] -= cut / self._weights[e.tier]
            trimmed += cut
        self._counters["first_token_trims"] += 1
        return trimmed

    def _yield_decodes(self, rep: _Replica, step: _Step, decodes: _Decodes) -> int:
        """Leave some decodes out of a budget-bound step so that the TTFT-class prefill with the
        tightest first-token deadline among the step's unfinished prefills ends a step sooner;
        returns the decodes left out.

        With a ``B``-token budget and ``d`` decodes in every step, a prompt of ``p`` tokens needs
        ``ceil(p / (B - d))`` steps where ``ceil(p / B)`` would do: 1,213 of the Azure hour's
        1,475 chats of 4,004-4,191 prompt tokens fit two 2,048-token steps of an idle vLLM
        replica but can take three beside a few decodes, the third in the two traced shared
        with later chats' prefills (``conv-1080``, 4,089 tokens: 2,040 + 2,040 + 9 beside 8
        decodes, TTFT 1,061 ms; ``conv-494``; ``benchmarks/trace_request_steps.py``). When the
        step's budget is used up, the rest after this step needs ``m = ceil(r / (B - d))`` more
        steps if the prefill gets every token the later steps leave (another prefill in this
        step may take some, and then no step is saved); taking
        ``k = min(r - (m - 1) * (B - d), d)`` more tokens now (and the rest of the saving in
        the next steps, which decide alike) saves one, if ``ceil((r - k) / B) < m``. It is done
        unless the first token would be late even so (``prefill_s`` of the rest in
        whole-budget steps past the deadline), and only with ``k`` decodes that can wait a
        step: those without a TPOT target first, then those whose banked TPOT allowance
        (planned TPOT x tokens so far, less the time since their first token) covers twice
        the step, the most first. Each left out gives back its token, its KV blocks and its
        tier's stride charge; the prefill is charged its ``k`` tokens and its tier's stride, and
        their blocks only if they fit above the floors ``_place`` keeps (the engine's reserve
        once anything is admitted, the KV watermark for a request admitted in this step; never
        for an admission the engine checks by SGLang's finish-aware rule).
        """
        state = step.state
        if not state.mixed_batches or not decodes or step.budget > 0:
            return 0
        tokens, entries, model = step.tokens, self._entries, self.step_time
        now, budget = state.now_s, state.token_budget
        urgent: _Entry | None = None
        deadline = _INF
        prefill = 0
        for rid in step.prefills:
            n = tokens.get(rid, 0)
            e = entries.get(rid)
            if e is None or n == 0:
                continue
            prefill += n
            if e.ttft_s is None or e.best_effort or not _awaits_first_token(e):
                continue
            if n < e.view.pending_tokens and e.arrival_s + e.ttft_s < deadline:
                urgent, deadline = e, e.arrival_s + e.ttft_s
        if urgent is None:
            return 0
        # the decodes this step runs (one token each; a prefill's last token is not one)
        running = [e for e in decodes if tokens.get(e.rid) == 1 and e.rid not in step.prefills]
        n_dec = len(running)
        per = budget - n_dec
        rest = urgent.view.pending_tokens - tokens[urgent.rid]
        if per <= 0 or rest <= 0:
            return 0
        later = -(-rest // per)
        k = min(rest - (later - 1) * per, n_dec)  # the rest of the saving from later steps
        if -(-(rest - k) // budget) >= later:
            return 0  # no step saved, even leaving decodes out of the later steps
        end_s = now + model.step_s(prefill + k, n_dec - k)
        if end_s + model.prefill_s(rest - k, budget, n_dec) > deadline:
            return 0  # late even so
        wait_s = 2.0 * model.step_s(prefill + k, n_dec - k)
        free: list[tuple[float, int, _Entry]] = []
        for i, e in enumerate(running):
            banked = self._banked_s(e, now)
            if banked is None:
                free.append((-_INF, i, e))
            elif banked >= wait_s:
                free.append((-banked, i, e))
        if len(free) < k:
            return 0
        v = urgent.view
        n = tokens[urgent.rid]
        admitting = urgent.rid in step.admit
        if admitting and finish_aware(state):
            return 0  # the engine admits it by its own check of the chunk (SGLang 0.3.1+)
        grow = step_blocks(v, n + k, state, admit=admitting) - step_blocks(
            v, n, state, admit=admitting
        )
        free.sort(key=lambda f: (f[0], f[1]))
        left_out = [e for _, _, e in free[:k]]
        freed = sum(step.new_blocks.get(e.rid, 0) for e in left_out)
        # the floors ``_place`` keeps: the engine's reserve once anything is admitted, and the
        # KV watermark for a request admitted in this step
        floor = state.reserved_hbm_blocks if step.admit else 0
        if admitting:
            floor += int(self.kv_watermark * state.total_hbm_blocks)
        if grow > step.free + freed - floor:
            return 0
        weights, passes = self._weights, rep.passes
        for e in left_out:
            del tokens[e.rid]
            step.free += step.new_blocks.pop(e.rid, 0)
            passes[e.tier] -= 1 / weights[e.tier]
        tokens[urgent.rid] = n + k
        if grow > 0:
            step.new_blocks[urgent.rid] = step.new_blocks.get(urgent.rid, 0) + grow
            step.free -= grow
        passes[urgent.tier] += k / weights[urgent.tier]
        self._counters["decodes_yielded"] += k
        return k

    def _place_turns(
        self, rep: _Replica, step: _Step, e: _Entry, left: int, cpu: bool, t: int
    ) -> int:
        """The turns running ``e`` would get in a row, placed at once: with no other tier able
        to take a turn, the stride loop hands the head of tier ``t`` unit after unit until its
        prefill, ``left`` or the step's budget runs out, so one placement of all of it (when it
        fits without making room: the blocks a step takes grow with its tokens, so then every
        unit fits) and the tier's pass advanced unit by unit (the same float sums) decide the
        same. Returns the tokens given, 0 when they do not fit (the caller then goes unit by
        unit, making room as it does)."""
        given = self._place(rep, step, e, left, cpu, t, room=False)
        unit, weight, passes, rest = self.rotation_unit_tokens, self._weights[t], rep.passes, given
        while rest > 0:
            piece = min(unit, rest)
            passes[t] += piece / weight
            rest -= piece
        return given

    def _has_demand(self, rep: _Replica, ongoing: list[_Lane], t: int, cpu: bool) -> bool:
        if ongoing[t].head() is not None:
            return True
        if cpu and self._peek(rep.swap_heaps[t], _SWAPPED) is not None:
            return True
        return self._peek(rep.heaps[t], _WAITING) is not None

    def _pending_after(self, step: _Step, e: _Entry) -> int:
        return e.view.pending_tokens - step.tokens.get(e.rid, 0)

    def _rotate_proactively(self, rep: _Replica, step: _Step) -> None:
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
        running = self._running_entries(state)
        for e in sorted(running, key=self._victim_rank, reverse=True):
            if e.tier <= best_waiting or e.rid in step.preempt or e.aged:
                continue
            v = e.view
            service = max(v.computed_tokens - v.cached_tokens, 0) + e.lost_tokens
            if service - e.resident_service < self._slices[e.tier]:
                continue
            if not self._preempt(rep, step, e, rotation=True):
                break

    def _prefetch_promoted(self, step: _Step) -> list[str]:
        """The swapped requests promoted in this decision that are prefetched: in promotion order,
        as far as HBM (leaving the engine's reserve once anything was admitted) and the link's
        bytes for this step allow."""
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
        return prefetch
