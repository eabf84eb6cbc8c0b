"""Preemption: the victim ranking, swap or recompute by the cost model (:mod:`kv_cost`), room
made for better-tier work, and relief of a decode KV shortage."""

from __future__ import annotations

from superinfer.policy_core.batching import view_blocks
from superinfer.policy_core.kv_cost import preempt_mode
from superinfer.policy_core.policies.superinfer.queues import _Queues
from superinfer.policy_core.policies.superinfer.records import (
    _RUNNING,
    _SWAPPED,
    _WAITING,
    _decode_blocks,
    _Entry,
    _Replica,
    _Step,
)
from superinfer.policy_core.types import PreemptMode


class _Preemption(_Queues):
    """Layer 3: which running request leaves HBM, and how."""

    @staticmethod
    def _victim_rank(e: _Entry) -> tuple[bool, bool, bool, int, float]:
        """Larger is preempted first: never an aged request while another is left, nor one
        still recomputing what an earlier preemption cost it (no thrash: docs/conformance.md),
        then best effort, then the worst tier, then the least urgent."""
        return (not e.aged, not _Preemption._recovering(e), e.best_effort, e.tier, e.key)

    @staticmethod
    def _recovering(e: _Entry) -> bool:
        """``e`` was preempted and has not yet recomputed its way back to decoding: room for
        better-tier work is never made from it, and a KV shortage takes it last."""
        v = e.view
        return v.num_preemptions > 0 and v.pending_tokens > 1

    def _preempt(self, rep: _Replica, step: _Step, e: _Entry, *, rotation: bool) -> bool:
        """Preempt running ``e`` (swap or recompute, by the cost model); False if the link
        budget does not allow a rotation swap."""
        v = e.view
        mode = preempt_mode(v, step.state, self.step_time.prefill_token_s, step.free_cpu)
        cpu_blocks = view_blocks(v, v.computed_tokens, step.state)
        nbytes = cpu_blocks * step.state.kv_block_bytes
        if rotation and (mode is not PreemptMode.SWAP or nbytes > step.swap_out_bytes):
            return False
        if mode is PreemptMode.SWAP:
            step.free_cpu -= cpu_blocks
            step.swap_out_bytes -= nbytes
            self._counters["swap_out_bytes"] += nbytes
        else:
            e.lost_tokens += max(v.computed_tokens - v.cached_tokens, 0)
        step.preempt[e.rid] = mode
        step.free += v.own_kv_blocks + step.new_blocks.pop(e.rid, 0)
        given = step.tokens.pop(e.rid, 0)
        step.budget += given
        step.seats += 1
        e.stale = True
        rep.num_stale += 1
        e.queued_s = step.state.now_s
        self._enqueue(rep, e, _SWAPPED if mode is PreemptMode.SWAP else _WAITING, e.queued_s)
        return True

    def _make_room(
        self, rep: _Replica, step: _Step, e: _Entry, blocks: int, rank_below: int
    ) -> bool:
        """Preempt running requests of tiers worse than ``rank_below`` (worst first) until
        ``blocks`` are free and a seat is open; -1 allows any tier (aged requests)."""
        if self.max_preemptions_per_step == 0:
            return False
        if 0 <= rank_below and step.worst_tier <= rank_below:
            return False  # nothing runs in a worse tier
        candidates = [
            x
            for x in self._running_entries(step.state)
            if x.where == _RUNNING
            and x is not e
            and x.rid not in step.preempt
            and not x.aged
            and not self._recovering(x)
            and (rank_below < 0 or x.tier > rank_below)
        ]
        candidates.sort(key=self._victim_rank, reverse=True)
        budget = self.max_preemptions_per_step - len(step.preempt)
        plan: list[_Entry] = []
        free, seats = step.free, step.seats
        for x in candidates:
            if free >= blocks and seats > 0:
                break
            if len(plan) >= budget:
                return False
            plan.append(x)
            free += x.view.own_kv_blocks + step.new_blocks.get(x.rid, 0)
            seats += 1
        if free < blocks or seats <= 0:
            return False
        for x in plan:
            self._preempt(rep, step, x, rotation=False)
        return True

    def _relieve_shortage(
        self, rep: _Replica, step: _Step, running: list[_Entry], need: int
    ) -> None:
        """Decodes need more new blocks than are free: preempt from the bottom of the ranking
        (vLLM v1 does the same from the tail of its running queue)."""
        for e in sorted(running, key=self._victim_rank, reverse=True):
            if need <= step.free:
                return
            v = e.view
            decoding = v.generated_tokens and v.pending_tokens == 1
            if decoding:
                need -= max(_decode_blocks(v, step.state), 0)
            self._preempt(rep, step, e, rotation=False)
