"""Step budget and TPOT protection: one token per decode (the running pass that finds them is
``running.py``), and the prefill allowance that keeps TPOT-class decodes on target, grown for a
TTFT-urgent prefill against the decodes' credit."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from superinfer.policy_core.policies.superinfer.records import (
    _INF,
    _WAITING,
    _awaits_first_token,
    _decode_blocks,
    _Decodes,
    _Entry,
    _LaneItem,
    _Replica,
    _RunBooks,
    _Step,
)
from superinfer.policy_core.policies.superinfer.running import _Running

#: Bound on a token or step count derived from SLO seconds: 2**62, beyond any step budget (ints
#: far below) and any prompt length a result file can hold (int64).
_MAX_COUNT = float(2**62)


def _count(x: float) -> int:
    """``int(x)`` clamped to ``[-2**62, 2**62]``.

    A ratio of seconds over seconds-per-token is ``inf`` for SLOs the validators accept
    (``tpot_ms=1.7e308`` or ``inf``, issue 20), and ``int(inf)`` raises OverflowError. Every
    count clamped here is then capped by the step's token budget or divides a prompt length (a
    chunk of ``ceil(pending / steps)`` is 1 for any ``steps >= pending``), so the clamp changes
    no decision that did not overflow. ``x`` is never NaN: each quotient has a finite positive
    divisor and a dividend that is finite or ``+inf``.
    """
    if x < -_MAX_COUNT:
        return int(-_MAX_COUNT)
    return int(x if x <= _MAX_COUNT else _MAX_COUNT)


class _StepBudget(_Running):
    """Layer 6: how many tokens decodes and prefills get this step."""

    def _schedule_decodes(self, rep: _Replica, step: _Step, decodes: _Decodes, need: int) -> None:
        """One token for every decode that was not preempted; each is charged to its tier's
        stride pass, so decodes count against their tier's share of the budget."""
        passes, weights = rep.passes, self._weights
        if step.preempt or len(decodes) > step.budget:
            chosen = [e for e in decodes if e.rid not in step.preempt][: max(step.budget, 0)]
            need = sum(max(_decode_blocks(e.view, step.state), 0) for e in chosen)
            step.tokens.update(dict.fromkeys([e.rid for e in chosen], 1))
            step.budget -= len(chosen)
            if need:
                for e in chosen:
                    grow = _decode_blocks(e.view, step.state)
                    if grow > 0:
                        step.new_blocks[e.rid] = grow
                step.free -= need
            per_tier = [0] * self.num_tiers
            for e in chosen:
                per_tier[e.tier] += 1
        else:  # every decode runs: no per-request work beyond the KV blocks some need
            if step.tokens:
                step.tokens.update(decodes.ids)  # one token each
            else:  # a copy of the books' map (a dict's copy clones its table)
                step.tokens = decodes.ids.copy()
            step.budget -= len(decodes)
            if need:
                for _, e, grow in decodes.growers:
                    step.new_blocks[e.rid] = grow
                if decodes.unit:  # one page each (the page class due: running.py)
                    step.new_blocks.update(decodes.unit)
                step.free -= need
            per_tier = decodes.per_tier
        for t, count in enumerate(per_tier):
            if count:
                passes[t] += count / weights[t]

    def _tpot_cap(self, books: _RunBooks, step: _Step, now: float) -> float:
        """The decodes' smallest TPOT allowance, s: ``tpot * generated - (now - first_token_s)``
        with ``tpot`` the planned TPOT (the target times ``tpot_plan_share``)
        among the decodes with a TPOT target (not best effort), computed for the few keys at the
        bottom of each of the running books' TPOT heaps (``running.py``); ``inf`` if none. Read
        right after the running pass, before a preemption changes the books. Sets
        ``step.tightest_s``, the smallest planned TPOT among them (``inf`` if none)."""
        cap = tightest = _INF
        state = step.state
        if state.views is not None:
            view_of = state.views.__getitem__
        else:  # a rebuild without the engine's map: every running entry was just refreshed
            entries = self._entries
            view_of = lambda rid: entries[rid].view  # noqa: E731
        for tpot, th in books.tpot.items():
            heap, members = th.heap, th.members
            while heap and not members.get(heap[0][1:]):
                _, first, g = heapq.heappop(heap)
                members.pop((first, g), None)
            if not heap:
                continue
            if tpot < tightest:
                tightest = tpot
            limit = heap[0][0] + 1e-6 + 1e-12 * abs(heap[0][0])
            stack = [0]
            n = len(heap)
            while stack:  # every key within rounding of the smallest (a heap walk)
                i = stack.pop()
                _, first, g = heap[i]  # within the limit: only such nodes are stacked
                ids = members.get((first, g))
                if ids:
                    v = view_of(next(iter(ids)))
                    allowance = tpot * v.generated_tokens - (now - first)
                    if allowance < cap:
                        cap = allowance
                c = 2 * i + 1
                if c < n and heap[c][0] <= limit:
                    stack.append(c)
                if c + 1 < n and heap[c + 1][0] <= limit:
                    stack.append(c + 1)
        step.tightest_s = tightest
        return cap

    def _prefill_allowance(self, step: _Step, num_decodes: int, cap_s: float) -> int:
        """Prefill tokens this step may run: all of the budget, or with TPOT-class decodes
        running, what fits in ``tpot_safety`` of their smallest allowance.

        With mixed batches the decodes run in the same step, so the step (prefill plus decodes)
        must fit; at least ``min_prefill_tokens``, but no more than ``min_prefill_budget_share``
        of the step's token budget, always may (on the real hf engine, a 256-token budget, a
        floor of 256 let steps carry full prefill chunks whatever the decodes' TPOT).
        With ``prefill_floor_yields``, where a step of the decodes alone (the step-time
        model's) is shorter than their smallest planned TPOT (``step.tightest_s``), each such
        step banks allowance, so an allowance under the floor gives no prefill (0, as without
        mixed batches) and the prefill waits until the allowance covers a floor's worth,
        instead of every step carrying the floor past the TPOT target (on the real hf engine a
        step carrying any prefill took 38-96 ms more, besides 1.4-2.3 ms per prefill token, in
        the step-cost fits of results/engines-cpu/hf_prefill_cost.csv). A TTFT-urgent prefill
        still gets the TTFT boost. Without them
        (``StepState.mixed_batches`` false: SGLang's prefill-first batches) a prefill step
        runs alone and the decodes' next token comes after it and one decode step, so both must
        fit, and a prefill step shorter than ``min_prefill_tokens`` is not worth its fixed cost:
        the step decodes instead (0), banking TPOT credit for a later, larger prefill step.
        """
        if cap_s == _INF:
            return step.budget
        model = self.step_time
        mixed = step.state.mixed_batches
        room_s = cap_s * self.tpot_safety - model.step_s(0.0, num_decodes)
        if not mixed:
            room_s -= model.base_s  # the prefill step's own fixed cost
        tokens = _count(room_s / model.prefill_token_s) if room_s > 0 else 0
        if mixed:
            floor = self._prefill_floor(step)
            if tokens < floor and self.prefill_floor_yields:
                if model.step_s(0.0, num_decodes) < step.tightest_s:
                    return 0  # decoding alone banks allowance: a floor's worth comes later
            return max(floor, tokens)
        return tokens if tokens >= self.min_prefill_tokens else 0

    def _prefill_floor(self, step: _Step) -> int:
        """With mixed batches, the prefill tokens a step may always run, tokens:
        ``min_prefill_tokens``, at most ``min_prefill_budget_share`` of the step's budget."""
        share = int(self.min_prefill_budget_share * step.state.token_budget)
        return min(self.min_prefill_tokens, share)

    def _reserve_for_ttft(
        self, rep: _Replica, step: _Step, num_decodes: int, cap_s: float, allow: int
    ) -> int:
        """On an engine without mixed batches (with them too under ``ttft_reserve_mixed``):
        the prefill allowance of a step with no TTFT-class prefill pending, which leaves the
        decodes' smallest TPOT allowance ``cap_s`` the time to prefill the
        ``ttft_reserve_quantile`` of recent TTFT-class prompts (``prefill_token_s`` x that many
        tokens), so the next chat's prefill finds it: where batches mix, as the banked credit the
        TTFT boost may spend on it. There, with ``ttft_reserve_beside_chats`` as well, while a
        TTFT prefill is pending the step keeps ``allow`` but prefills without a TTFT target
        stop where the reserve would have ended it (``_Step.no_ttft_left``, spent by every
        prefill token given before theirs), so a batch prompt riding along with a chat does
        not spend the reserve either. With ``ttft_reserve_shed_s`` no reserve is held for that
        many seconds after the policy rejected a request on the replica (with 10 s, the whole
        Azure hour at 16 loads: sim:trtllm's overload losses gone, sim:vllm's gains halved;
        ``results/ttft-reserve-mixed``; that a shedding replica is short of throughput rather
        than of the next chat's prefill is our reading, not measured).

        Without it a worse tier's prefill (a batch prompt's chunks) spends every second of
        allowance the decodes bank, and an arriving chat's prompt is then sliced into the
        smallest prefill steps the allowance permits, a few hundred tokens each between decode
        steps (sim:sglang, Azure x0.6: chat TTFT p50 ~940 ms while the batch backlog of a
        prompt burst drained). ``allow`` unchanged while a TTFT prefill is pending, before
        ``min_samples`` prompts were seen, or with the quantile 0. With mixed batches, the whole
        Azure hour (``results/ttft-reserve-mixed``): feasible chat attainment +0.1 to +1.3
        points at x0.3-1.0 on sim:vllm and sim:trtllm, but -0.27 on sim:vllm at x1.6 and -0.16
        on sim:trtllm at x1.3, so it is off by default there.
        """
        mixed = step.state.mixed_batches
        if (mixed and not self.ttft_reserve_mixed) or cap_s == _INF:
            return allow
        if self.ttft_reserve_quantile == 0 or not (prompt := self.ttft_prompts.value()):
            return allow
        shed_s = self.ttft_reserve_shed_s  # 0 by default: no lookup
        if shed_s and step.state.now_s - self._shed_at.get(rep.index, -_INF) < shed_s:
            return allow  # the replica rejected a request within shed_s: it sheds load
        pending = self._ttft_pending(rep, step, rep.books.ttft_lanes)
        if pending and not (mixed and self.ttft_reserve_beside_chats):
            return allow
        reserve_s = self.step_time.prefill_token_s * prompt
        reserved = self._prefill_allowance(step, num_decodes, cap_s - reserve_s)
        if pending:  # mixed: the chat takes the whole allowance, a batch prompt stops short
            step.no_ttft_left = reserved
            return allow
        return reserved

    def _ttft_pending(self, rep: _Replica, step: _Step, lanes: list[list[_LaneItem]]) -> bool:
        """Whether a TTFT-class prefill (running and awaiting its first token, or at the head of
        a tier's waiting queue; not best effort) wants this step's prefill tokens."""
        if self._urgent_prefill(step, lanes) is not None:
            return True
        return next(self._waiting_ttft_heads(rep, step), None) is not None

    def _waiting_ttft_heads(self, rep: _Replica, step: _Step) -> Iterator[_Entry]:
        """The heads of the tiers' waiting queues that await a first token of a TTFT class (not
        best effort, not preempted in this step), best tier first."""
        for heap in rep.heaps:
            e = self._peek(heap, _WAITING)
            if e is None or e.ttft_s is None or e.best_effort or e.view.first_token_s is not None:
                continue
            if e.rid not in step.preempt:
                yield e

    def _urgent_prefill(self, step: _Step, lanes: list[list[_LaneItem]]) -> _Entry | None:
        """The running prefill awaiting its first token (TTFT class, not best effort) and not
        preempted with the smallest key, the first in ``state.running`` order among equal keys:
        the best of the first such one of each of the books' ``ttft_lanes`` (sorted by key,
        then that order)."""
        entries, preempt = self._entries, step.preempt
        best: tuple[float, int, str] | None = None
        for lane in lanes:
            for item in lane:
                if item[2] not in preempt and _awaits_first_token(entries[item[2]]):
                    if best is None or item < best:
                        best = item
                    break
        return None if best is None else entries[best[2]]

    def _regrows_in_time(
        self, urgent: _Entry, num_decodes: int, worst_s: float, regrow_s: float,
        typical_s: float, now: float,
    ) -> bool:  # fmt: skip
        """Whether the urgent TTFT prefill (all its pending tokens) can wait, unboosted, for the
        decodes' smallest banked allowance ``worst_s`` (s) to cover its prefill step and the
        decode step after it (``_prefill_allowance``'s rule), and still get its first token
        within its TTFT: the allowance grows by ``regrow_s`` (that decode's planned TPOT less
        the mean time between a decode's tokens ``typical_s``) per token, one token every
        ``typical_s``. ``False`` where it already covers them or never grows (the boost's
        credit then decides)."""
        model = self.step_time
        prefill_s = model.base_s + model.prefill_token_s * urgent.view.pending_tokens
        short_s = (prefill_s + model.step_s(0.0, num_decodes)) / self.tpot_safety - worst_s
        if short_s <= 0.0 or regrow_s <= 0.0:
            return False
        wait_s = short_s / regrow_s * typical_s
        return now + wait_s + prefill_s <= urgent.arrival_s + urgent.ttft_s  # type: ignore[operator]

    def _banked_s(self, e: _Entry, now: float) -> float | None:
        """A decode's banked TPOT allowance at ``now``, s: its planned TPOT (the target times
        ``tpot_plan_share``) times its tokens so far, less the time since its first token;
        ``None`` for one without a TPOT target, best effort, or without a first token (what the
        TTFT boost's credit starts from, and what ``yield_decodes`` asks of a decode that
        waits a step)."""
        v = e.view
        tpot = e.tpot_s
        if tpot is None or e.best_effort or v.first_token_s is None:
            return None
        return tpot * self.tpot_plan_share * v.generated_tokens - (now - v.first_token_s)

    def _grown(self, allow: int, boosted: int) -> int:
        """``boosted``, the TTFT boost's allowance, counted in ``stats()["ttft_boosts"]`` where
        it exceeds ``allow``."""
        self._counters["ttft_boosts"] += boosted > allow
        return boosted

    def _ttft_boost(
        self,
        rep: _Replica,
        step: _Step,
        decodes: _Decodes,
        ttft_lanes: list[list[_LaneItem]],
        allow: int,
        now: float,
    ) -> int:
        """Grow the prefill allowance so the most urgent TTFT prefill (running, or at the head of
        a tier) can still meet its deadline, as far as the decodes' TPOT credit allows.

        The chunk it needs is ``ceil(pending / steps)`` with ``steps`` the whole steps that fit
        in its slack after its prefill compute (all of ``pending`` with ``ttft_boost_whole``
        when the credit covers it). A decode's credit is its banked allowance plus
        ``(tpot - typical step) * r`` (the typical step: the mean of ``credit_step_memory``
        step reports when set, else the policy's recent step-time average), ``tpot`` the
        planned TPOT, for the ``r`` tokens it will
        still produce with probability ``1 - credit_quantile`` (the estimator's conditional
        quantile): a longer step now is repaid by the faster steps it still has to come.

        With ``prefill_floor_yields`` (mixed batches) the chunk is at least the prefill floor
        (:meth:`_prefill_floor`; all of ``pending`` if shorter), and a credit short of that
        gives no boost: the decodes bank it first, as in :meth:`_prefill_allowance`. Paced to
        the plan, chats on the real hf engine prefilled in chunks of 3-17 tokens, each step
        paying a prefill's fixed cost, and got their first token 2.9-3.3 s after arrival
        against a 3.36 s target (results/engines-cpu/hf-floor128-knee, 0.294 req/s, steps.parquet).

        Without mixed batches (``ttft_boost_unmixed``, on by default; off: no boost there) a
        prefill step runs alone and delays every decode, and a chunk paced to the plan only
        slices the prompt between decode steps (on sim:sglang at x0.6 of the Azure hour,
        feasible chat attainment 0.953 -> 0.805): the boost runs all of ``pending`` in this
        step when the credit covers it, the prefill step's own fixed cost and the decode step
        after it (``_prefill_allowance``'s rule), and otherwise leaves ``allow`` as it is.
        There a decode's future tokens come a decode step plus the prefill steps between
        apart, so they are counted at the mean time between a decode's tokens
        (``_decode_interval_s``), not at the mean step: with the mean step, x1.3 of the Azure
        hour on sim:sglang lost 4.4 points of feasible chat attainment and chat TPOT p99 went
        to 105 ms (the mean step undercounts a token's wait by the prefill steps between;
        results/boost-unmixed). There it borrows only where waiting would miss
        (:meth:`_regrows_in_time`) and counts future tokens at ``unmixed_credit_quantile``:
        in a fleet plan's cell of 2 sim:sglang replicas on H100, boosting whenever the
        allowance fell short (3,833 boosts, a median 42 ms each) left 346 chats just over their
        TPOT, most charged again a few tokens before their end (results/boost-unmixed).
        """
        urgent = self._urgent_prefill(step, ttft_lanes)
        for e in self._waiting_ttft_heads(rep, step):
            if urgent is None or e.key < urgent.key:
                urgent = e
        if urgent is None or urgent.ttft_s is None:
            return allow
        model = self.step_time
        pending = urgent.view.pending_tokens
        per_step = model.base_s + model.decode_seq_s * len(decodes)
        slack = urgent.arrival_s + urgent.ttft_s - now
        room_s = slack * self.ttft_plan_fraction - model.prefill_token_s * pending
        steps = _count(room_s / per_step) if room_s > 0 else 0
        if steps < 1:  # not within the plan: then within the whole slack, in as few steps
            steps = _count((slack - model.prefill_token_s * pending) / per_step)
        if steps < 1:
            return allow  # out of reach even in one step: best-effort demotion's business
        chunk = -(-pending // steps)
        mixed = step.state.mixed_batches
        least = 0  # prefill_floor_yields: a floor's worth (or all of pending) or no boost
        if mixed and self.prefill_floor_yields:
            least = min(self._prefill_floor(step), pending)
            chunk = max(chunk, least)
        if chunk <= allow:
            return allow
        credit = worst = _INF
        typical = self._credit_step_s or self._typical_step_s()
        quantile = None
        if not mixed:  # a decode's next tokens wait for the prefill steps as well
            typical = self._decode_interval_s(typical)
            quantile = self.unmixed_credit_quantile
        regrow_s = 0.0
        for e in decodes:
            c = self._banked_s(e, now)
            if c is None:
                continue
            tpot = e.tpot_s * self.tpot_plan_share  # type: ignore[operator]  # banked: has one
            if not mixed and c < worst:  # _regrows_in_time's input; read only there
                worst, regrow_s = c, tpot - typical
            later = self.credit_tokens(e.view, quantile)
            c += max(tpot - typical, 0.0) * (later - 1)
            if c < credit:
                credit = c
        if credit == _INF:
            return self._grown(allow, max(allow, min(chunk if mixed else pending, step.budget)))
        if not mixed and self._regrows_in_time(urgent, len(decodes), worst, regrow_s, typical, now):
            return allow  # no borrowing: the allowance grows back before the deadline
        room = credit * self.tpot_safety - model.step_s(0.0, len(decodes))
        if not mixed:
            room -= model.base_s  # the prefill step's own fixed cost
        most = _count(room / model.prefill_token_s) if room > 0 else 0
        if not mixed and most < pending:  # whole or not at all
            return allow
        if not mixed:
            return self._grown(allow, max(allow, min(pending, step.budget)))
        if self.ttft_boost_whole and most >= pending:
            chunk = pending  # the credit covers it whole: no pacing to the plan
        if most < least:
            return allow  # the decodes bank credit for a floor's worth (_prefill_allowance)
        return self._grown(allow, max(allow, min(chunk, most, step.budget)))
