"""Drivers of the TensorRT-LLM double for both modes, a contract checker and small test plugins.

Import only inside tests that use the ``trtllm12`` fixture: these helpers import ``tensorrt_llm``
(the double) lazily, in the functions.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from superinfer.adapters.hookspecs import hookimpl
from superinfer.policy_core.types import (
    SLO,
    Placement,
    PlacementDecision,
    PreemptMode,
    PrefixNodeView,
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)

#: Scripted arrivals of one step are this far apart, so arrival order is never a tie.
ARRIVAL_GAP_S = 1e-6

CHAT = SLO("chat", ttft_ms=1000.0, tpot_ms=100.0, priority=0)
BATCH = SLO("batch", deadline_s=600.0, priority=1)


@dataclass(frozen=True)
class Arrival:
    """One scripted request: arrives before engine step ``step``."""

    name: str
    step: int
    slo: SLO
    prompt: tuple[int, ...]
    output_len: int
    max_tokens: int


def make_llm(**kwargs: Any) -> Any:
    """A double ``LLM`` with small defaults and a fake clock (``llm._clock``)."""
    from tensorrt_llm._fake import FakeClock
    from tensorrt_llm.llmapi import LLM, KvCacheConfig

    kwargs.setdefault("max_batch_size", 8)
    kwargs.setdefault("max_num_tokens", 256)
    kwargs.setdefault(
        "kv_cache_config",
        KvCacheConfig(max_tokens=128, tokens_per_block=8, event_buffer_max_size=10_000),
    )
    kwargs.setdefault("_fake_clock", FakeClock())
    return LLM("double", **kwargs)


def output_len_by_prompt(arrivals: Sequence[Arrival]) -> Callable[[list[int], Any], int]:
    lengths = {a.prompt: a.output_len for a in arrivals}
    return lambda prompt, sp: lengths[tuple(prompt)]


def sampling(max_tokens: int) -> Any:
    from tensorrt_llm.llmapi import SamplingParams

    return SamplingParams(max_tokens=max_tokens)


@dataclass
class RunLog:
    """What one scripted run did, by request name.

    Attributes:
        first_scheduled: engine iteration of each request's first context chunk.
        first_token: engine iteration of each request's first output token.
        finished: requests that finished, in finishing order.
        start_order: names in the order of their first context chunk.
        steps: the executor's per-iteration log with names instead of client ids.
    """

    first_scheduled: dict[str, int] = field(default_factory=dict)
    first_token: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    start_order: list[str] = field(default_factory=list)
    steps: list[tuple[int, list[str], list[str], list[str]]] = field(default_factory=list)


def _log(llm: Any, names: Mapping[int, str], log: RunLog) -> None:
    for it, ctx, gen, paused in llm._engine._fake_log:
        log.steps.append(
            (it, [names[c] for c in ctx], [names[c] for c in gen], [names[c] for c in paused])
        )
        for c in ctx:
            if names[c] not in log.first_scheduled:
                log.first_scheduled[names[c]] = it
                log.start_order.append(names[c])


def run_mode_b(llm: Any, arrivals: Sequence[Arrival], table: Any, max_steps: int = 500) -> RunLog:
    """Submit each arrival straight to the engine at its step, registering its SLO class."""
    log = RunLog()
    names: dict[int, str] = {}
    handles: dict[str, Any] = {}
    pending = sorted(arrivals, key=lambda a: a.step)
    for step in range(max_steps):
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            llm._clock.advance(ARRIVAL_GAP_S)
            handle = llm.generate_async(list(a.prompt), sampling(a.max_tokens), streaming=True)
            table.put(handle.request_id, a.slo, llm._clock())
            names[handle.request_id] = a.name
            handles[a.name] = handle
        if not pending and not llm._fake_has_work():
            break
        llm._fake_step()
        for name, handle in handles.items():
            while (out := handle._fake_next()) is not None:
                if out.outputs[0].token_ids and name not in log.first_token:
                    log.first_token[name] = step
                if out.finished:
                    log.finished.append(name)
    _log(llm, names, log)
    return log


def run_mode_a(gate: Any, arrivals: Sequence[Arrival], max_steps: int = 500) -> RunLog:
    """Submit each arrival to the gate at its step; feed every engine output back to the gate."""
    llm = gate.llm
    log = RunLog()
    names: dict[int, str] = {}
    pending = sorted(arrivals, key=lambda a: a.step)
    records: dict[str, Any] = {}
    for step in range(max_steps):
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            llm._clock.advance(ARRIVAL_GAP_S)
            records[a.name] = gate.submit(
                list(a.prompt), sampling(a.max_tokens), slo=a.slo, request_id=a.name
            )
        if not pending and not llm._fake_has_work() and not gate.held:
            break
        llm._fake_step()
        for name, rec in records.items():
            if rec.handle is None:
                continue
            names[rec.handle.request_id] = name
            while (out := rec.handle._fake_next()) is not None:
                if out.outputs[0].token_ids and name not in log.first_token:
                    log.first_token[name] = step
                if out.finished:
                    log.finished.append(name)
                gate.on_output(rec, out)
        gate.poll()
    _log(llm, names, log)
    return log


# -------------------------------------------------------------------------------------------------
# What the real executor assumes of a scheduler (engine notes §5.2)
# -------------------------------------------------------------------------------------------------


class ContractChecker:
    """Sits between the executor and its scheduler and checks every answer.

    Checks: outputs are active requests, no request twice across the lists; at most
    ``max_batch_size`` requests and ``max_num_tokens`` tokens run; context requests are in
    ``CONTEXT_INIT`` and generation ones in ``GENERATION_IN_PROGRESS``; paused requests had started;
    ``can_schedule`` changes nothing a scheduler can see.
    """

    def __init__(self, scheduler: Any, max_batch_size: int, max_num_tokens: int) -> None:
        from tensorrt_llm._torch.pyexecutor.llm_request import LlmRequestState

        self.scheduler = scheduler
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.S = LlmRequestState
        self.num_checked = 0
        self.started: list[set[int]] = []
        self.paused: list[set[int]] = []

    def _started(self, req: Any) -> bool:
        if req.state == self.S.CONTEXT_INIT:
            return req.context_current_position > 0
        return req.state in (self.S.GENERATION_IN_PROGRESS, self.S.GENERATION_TO_COMPLETE)

    @staticmethod
    def _snapshot(requests: Sequence[Any]) -> list[tuple[Any, ...]]:
        return [
            (
                r.py_request_id,
                r.state,
                r.context_current_position,
                r.context_chunk_size,
                r.prompt_len,
                r.max_new_tokens,
                r.get_num_tokens(0),
            )
            for r in requests
        ]

    def schedule_request(self, active: list[Any], inflight: Any) -> Any:
        started = {r.py_request_id for r in active if self._started(r)}
        before = list(active)
        out = self.scheduler.schedule_request(active, inflight)
        assert active == before, "the scheduler reordered the executor's active list in place"
        ids = [
            r.py_request_id
            for r in out.context_requests + out.generation_requests + out.paused_requests
        ]
        assert len(ids) == len(set(ids)), f"a request is in two lists: {ids}"
        active_ids = {r.py_request_id for r in active}
        assert set(ids) <= active_ids, "a scheduled request is not active"
        assert len(out.context_requests) + len(out.generation_requests) <= self.max_batch_size
        tokens = sum(r.context_chunk_size for r in out.context_requests)
        tokens += sum(
            r.sampling_config.beam_width + r.num_draft_tokens for r in out.generation_requests
        )
        assert tokens <= self.max_num_tokens, f"{tokens} tokens > {self.max_num_tokens}"
        assert all(
            r.state == self.S.CONTEXT_INIT and r.context_chunk_size > 0
            for r in out.context_requests
        )
        assert all(r.state == self.S.GENERATION_IN_PROGRESS for r in out.generation_requests)
        assert {r.py_request_id for r in out.paused_requests} <= started, "paused a waiting request"
        self.num_checked += 1
        self.started.append(started)
        self.paused.append({r.py_request_id for r in out.paused_requests})
        return out

    def can_schedule(self, requests: list[Any]) -> bool:
        before = self._snapshot(requests)
        answer = self.scheduler.can_schedule(requests)
        assert self._snapshot(requests) == before, "can_schedule changed a request"
        return answer


# -------------------------------------------------------------------------------------------------
# Test plugins
# -------------------------------------------------------------------------------------------------


class FixedPlacement:
    """Answers ``superinfer_kv_placement`` with one placement per node position (root first)."""

    name = "fixed-placement"

    def __init__(self, placements: Sequence[Placement]) -> None:
        self.placements = list(placements)
        self.calls: list[tuple[tuple[PrefixNodeView, ...], int, int]] = []
        self.sizes: list[tuple[int, int]] = []  # (needed_hbm_blocks, total_hbm_blocks) per call

    @hookimpl
    def superinfer_kv_placement(
        self,
        nodes: tuple[PrefixNodeView, ...],
        now_s: float,
        free_hbm_blocks: int,
        free_cpu_blocks: int,
        needed_hbm_blocks: int,
        total_hbm_blocks: int,
    ) -> PlacementDecision:
        self.calls.append((nodes, free_hbm_blocks, free_cpu_blocks))
        self.sizes.append((needed_hbm_blocks, total_hbm_blocks))
        return PlacementDecision(
            {n.node_id: p for n, p in zip(nodes, self.placements, strict=False)}
        )


class Recorder:
    """Records every lifecycle hook call."""

    name = "recorder"

    def __init__(self) -> None:
        self.arrived: list[RequestView] = []
        self.finished: list[RequestView] = []
        self.aborted: list[tuple[RequestView, str]] = []
        self.steps: list[StepStats] = []
        self.states: list[StepState] = []

    @hookimpl
    def superinfer_request_arrived(self, request: RequestView, now_s: float) -> None:
        self.arrived.append(request)

    @hookimpl
    def superinfer_request_finished(self, request: RequestView, now_s: float) -> None:
        self.finished.append(request)

    @hookimpl
    def superinfer_request_aborted(self, request: RequestView, now_s: float, reason: str) -> None:
        self.aborted.append((request, reason))

    @hookimpl
    def superinfer_step_finished(self, stats: StepStats) -> None:
        self.steps.append(stats)

    @hookimpl(tryfirst=True)
    def superinfer_schedule(self, state: StepState) -> None:
        self.states.append(state)


class RandomPolicy:
    """A valid but arbitrary policy: random order, random admissions and preemptions.

    Exercises every action Mode B can apply (admit, skip, preempt by recompute, reject) under a
    seeded RNG; each decision is built to pass ``check_decision``.
    """

    name = "random"

    def __init__(self, seed: int, reject_rate: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.reject_rate = reject_rate

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        from superinfer.policy_core.batching import blocks_for_tokens

        rng, bs = self.rng, state.block_size_tokens
        running = list(state.running)
        rng.shuffle(running)
        preempt = {r.request_id: PreemptMode.RECOMPUTE for r in running if rng.random() < 0.1}
        free = state.free_hbm_blocks + sum(r.kv_blocks for r in running if r.request_id in preempt)
        budget, seqs = state.token_budget, 0
        num_tokens: dict[str, int] = {}
        for r in running:
            if r.request_id in preempt or rng.random() < 0.2:
                continue
            n = min(r.pending_tokens, budget)
            need = max(0, blocks_for_tokens(r.computed_tokens + n, bs) - r.kv_blocks)
            if n <= 0 or need > free or seqs >= state.max_num_seqs:
                continue
            num_tokens[r.request_id] = n
            budget, free, seqs = budget - n, free - need, seqs + 1
        live = sum(1 for r in running if r.request_id not in preempt)
        waiting = list(state.waiting)
        rng.shuffle(waiting)
        admit, reject = [], {}
        for r in waiting:
            if rng.random() < self.reject_rate:
                reject[r.request_id] = "random_reject"
                continue
            n = min(r.pending_tokens, budget)
            need = blocks_for_tokens(n, bs)
            if n <= 0 or need > free or live >= state.max_num_seqs or rng.random() < 0.3:
                continue
            admit.append(r.request_id)
            num_tokens[r.request_id] = n
            budget, free, live = budget - n, free - need, live + 1
        return ScheduleDecision(
            num_tokens=num_tokens, admit=tuple(admit), preempt=preempt, reject=reject
        )
