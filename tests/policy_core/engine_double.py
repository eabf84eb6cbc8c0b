"""A one-replica engine double for multi-step policy tests, with an optional CPU KV tier.

It applies decisions exactly as ``ScheduleDecision`` documents (reject, preempt, resume, admit,
then the tokens), checks each with ``check_decision`` first, fires every lifecycle hook a real
engine fires, and advances time by a fixed step time. Unlike today's simulator it supports swap
preemption, resume and prefetch, so the rotation decisions can be driven over many steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from superinfer.policy_core.batching import blocks_for_tokens
from superinfer.policy_core.changes import ViewTracker
from superinfer.policy_core.types import (
    SLO,
    KVLocation,
    PreemptMode,
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)
from superinfer.policy_core.validation import check_decision


@dataclass
class Req:
    """One request and its progress."""

    rid: str
    arrival_s: float
    prompt: int
    output: int
    slo: SLO
    max_output: int = 1024
    computed: int = 0
    generated: int = 0
    blocks: int = 0
    where: str = "pending"  # pending, waiting, running, swapped, finished, rejected
    first_token_s: float | None = None
    admitted_s: list[float] = field(default_factory=list)
    queued_s: float = 0.0
    waits_s: list[float] = field(default_factory=list)
    finish_s: float | None = None
    preemptions: int = 0
    tokens_run: int = 0

    def view(self, bs: int) -> RequestView:
        location = {"running": KVLocation.HBM, "swapped": KVLocation.CPU}.get(
            self.where, KVLocation.UNALLOCATED
        )
        return RequestView(
            request_id=self.rid,
            arrival_s=self.arrival_s,
            prompt_tokens=self.prompt,
            max_output_tokens=max(self.max_output, self.output),
            slo=self.slo,
            computed_tokens=self.computed,
            generated_tokens=self.generated,
            first_token_s=self.first_token_s,
            num_preemptions=self.preemptions,
            kv_location=location,
            kv_blocks=self.blocks,
        )


class EngineDouble:
    """Drives ``policy`` over ``requests`` one step at a time.

    Args:
        policy: any object with ``schedule`` and the lifecycle methods of ``BasePolicy``.
        requests: the workload.
        step_s: duration of every step that runs tokens, s, plus ``prefill_token_s`` per
            prefill token it runs.
        total_hbm_blocks, total_cpu_blocks: KV capacity of each tier.
        link_bytes_per_s, kv_block_bytes: the CPU tier's link and block size (0: no swap).
    """

    def __init__(
        self,
        policy: Any,
        requests: Sequence[Req],
        *,
        step_s: float = 0.05,
        prefill_token_s: float = 0.0,
        total_hbm_blocks: int = 10_000,
        total_cpu_blocks: int = 0,
        block_size: int = 16,
        token_budget: int = 2048,
        max_num_seqs: int = 256,
        link_bytes_per_s: float = 0.0,
        kv_block_bytes: int = 0,
    ) -> None:
        self.policy = policy
        self.pending = sorted(requests, key=lambda r: r.arrival_s)
        self.reqs = {r.rid: r for r in requests}
        self.step_s = step_s
        self.prefill_token_s = prefill_token_s
        self.total_hbm, self.total_cpu = total_hbm_blocks, total_cpu_blocks
        self.bs, self.budget, self.max_seqs = block_size, token_budget, max_num_seqs
        self.link, self.block_bytes = link_bytes_per_s, kv_block_bytes
        self.now = 0.0
        self.steps = 0
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.swapped: list[Req] = []
        self.decisions: list[tuple[StepState, ScheduleDecision]] = []
        self.swapped_out_bytes = 0
        self.swapped_in_bytes = 0
        self.prefetched: list[str] = []
        self.stamp = False  # give states views and change sets (ViewTracker), as engines do
        self.tracker = ViewTracker()

    def used(self, where: str) -> int:
        queue = self.running if where == "running" else self.swapped
        return sum(r.blocks for r in queue)

    def state(self) -> StepState:
        state = self._state()
        return self.tracker.stamp(state) if self.stamp else state

    def _state(self) -> StepState:
        bs = self.bs
        return StepState(
            now_s=self.now,
            step_index=self.steps,
            waiting=tuple(r.view(bs) for r in self.waiting),
            running=tuple(r.view(bs) for r in self.running),
            swapped=tuple(r.view(bs) for r in self.swapped),
            free_hbm_blocks=self.total_hbm - self.used("running"),
            total_hbm_blocks=self.total_hbm,
            free_cpu_blocks=self.total_cpu - self.used("swapped"),
            total_cpu_blocks=self.total_cpu,
            block_size_tokens=bs,
            token_budget=self.budget,
            max_num_seqs=self.max_seqs,
            kv_block_bytes=self.block_bytes,
            link_bytes_per_s=self.link,
        )

    def _arrive(self) -> None:
        while self.pending and self.pending[0].arrival_s <= self.now:
            req = self.pending.pop(0)
            req.where, req.queued_s = "waiting", req.arrival_s
            self.waiting.append(req)
            self.policy.on_request_arrived(req.view(self.bs), req.arrival_s)

    def step(self) -> ScheduleDecision | None:
        """Run one scheduling point and the step it decides; None when nothing is left."""
        self._arrive()
        if not (self.waiting or self.running or self.swapped):
            if not self.pending:
                return None
            self.now = self.pending[0].arrival_s
            self._arrive()
        state = self.state()
        swap = self.total_cpu > 0 and self.link > 0 and self.block_bytes > 0
        decision = self.policy.schedule(state)
        check_decision(state, decision, swap_supported=swap)
        self.decisions.append((state, decision))
        self._apply(decision)
        return decision

    def _apply(self, d: ScheduleDecision) -> None:
        by_id = self.reqs
        for rid, reason in d.reject.items():
            req = by_id[rid]
            (self.waiting if req.where == "waiting" else self.swapped).remove(req)
            req.where = "rejected"
            self.policy.on_request_aborted(req.view(self.bs), self.now, reason)
        for rid, mode in d.preempt.items():
            req = by_id[rid]
            self.running.remove(req)
            req.preemptions += 1
            req.queued_s = self.now
            if mode is PreemptMode.SWAP:
                self.swapped_out_bytes += req.blocks * self.block_bytes
                req.where = "swapped"
                self.swapped.append(req)
            else:
                req.computed, req.blocks, req.where = 0, 0, "waiting"
                self.waiting.insert(0, req)
        for rid in d.resume:
            req = by_id[rid]
            self.swapped.remove(req)
            self.swapped_in_bytes += req.blocks * self.block_bytes
            req.where = "running"
            req.admitted_s.append(self.now)
            req.waits_s.append(self.now - req.queued_s)
            self.running.append(req)
        for rid in d.admit:
            req = by_id[rid]
            self.waiting.remove(req)
            req.where = "running"
            req.admitted_s.append(self.now)
            req.waits_s.append(self.now - req.queued_s)
            self.running.append(req)
        self.prefetched.extend(d.prefetch)
        prefill = decode = 0
        finished = []
        prefill_tokens = sum(
            n for rid, n in d.num_tokens.items() if n > 1 or not by_id[rid].generated
        )
        duration = self.step_s + self.prefill_token_s * prefill_tokens
        end = self.now + (duration if d.num_tokens else 0.0)
        for rid, n in d.num_tokens.items():
            req = by_id[rid]
            pending = req.prompt + req.generated - req.computed
            if n == 1 and req.generated:
                decode += 1
            else:
                prefill += n
            req.computed += n
            req.tokens_run += n
            req.blocks = max(req.blocks, blocks_for_tokens(req.computed, self.bs))
            if n == pending:
                req.generated += 1
                if req.first_token_s is None:
                    req.first_token_s = end
                if req.generated >= req.output:
                    finished.append(req)
        self.now = end if d.num_tokens else self.now + self.step_s
        self.steps += 1
        for req in finished:
            self.running.remove(req)
            req.where, req.finish_s, req.blocks = "finished", self.now, 0
            self.policy.on_request_finished(req.view(self.bs), self.now)
        if d.num_tokens:
            self.policy.on_step_finished(
                StepStats(
                    now_s=self.now,
                    step_index=self.steps,
                    duration_s=duration,
                    num_steps=1,
                    num_prefill_tokens=prefill,
                    num_decode_tokens=decode,
                    num_running=len(d.num_tokens),
                    num_waiting=len(self.waiting),
                    used_hbm_blocks=self.used("running"),
                    total_hbm_blocks=self.total_hbm,
                    finished_ids=tuple(r.rid for r in finished),
                )
            )

    def run(self, max_steps: int = 100_000) -> None:
        """Step until every request ended (or ``max_steps``)."""
        for _ in range(max_steps):
            if self.step() is None:
                return
