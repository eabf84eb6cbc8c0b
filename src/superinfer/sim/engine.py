"""Discrete-event simulator: replicas of one engine profile, each a continuous-batching loop.

One heap of events drives every replica. Events at the same instant run in a fixed order:
step ends, then arrivals, then scheduling points, then by insertion sequence, so a request that
arrives exactly when a step ends is visible to the next scheduling decision. Nothing in here
decides: at every scheduling point the replica asks the plugins (``superinfer_schedule``),
checks the answer and applies it.

A decode-only decision may allow the engine to repeat it (``ScheduleDecision.max_repeat_steps``,
vLLM's multi-step scheduling). The engine then runs ``k`` steps as one event, ``k`` bounded by
the first finish and by the free KV blocks; an arrival during the run cuts it at the end of the
step in flight. Decode step time is linear in the KV tokens read (``RooflineStepTime
.decode_coefficients``), so ``k`` steps take ``k a + b (k C0 + B k (k - 1) / 2)`` for ``B``
sequences reading ``C0`` KV tokens in the first step.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from superinfer.policy_core.batching import blocks_for_tokens
from superinfer.policy_core.types import ScheduleDecision, StepState, StepStats
from superinfer.policy_core.validation import PolicyError, check_decision
from superinfer.sim.hardware import GPUSpec, ModelSpec
from superinfer.sim.profiles import EngineProfile
from superinfer.sim.request import RequestSpec, RequestStatus, SimRequest
from superinfer.sim.step_time import BatchShape, RooflineStepTime

__all__ = ["Replica", "SimConfig", "SimResult", "Simulator", "kv_capacity_blocks"]

# Event kinds, in the order they run at equal times.
_STEP_END, _ARRIVAL, _SCHEDULE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What to simulate.

    Attributes:
        profile: the engine's mechanics.
        model: the model served.
        gpu: the GPU type.
        tp: tensor-parallel degree (GPUs per replica).
        replicas: number of replicas; arrivals are routed round robin.
        horizon_s: stop simulating at this instant; requests still live then fail with reason
            ``"simulation_horizon"``. ``None`` runs until every request ends.
        num_gpu_blocks_override: KV blocks per replica instead of the ones memory allows (as
            vLLM's ``--num-gpu-blocks-override``); for what-if runs and tests.
        timeline_interval_s: a replica's KV use and queue lengths are sampled at the end of its
            first step at least this long after the previous sample.
    """

    profile: EngineProfile
    model: ModelSpec
    gpu: GPUSpec
    tp: int = 1
    replicas: int = 1
    horizon_s: float | None = None
    num_gpu_blocks_override: int | None = None
    timeline_interval_s: float = 1.0


def kv_capacity_blocks(profile: EngineProfile, model: ModelSpec, gpu: GPUSpec, tp: int) -> int:
    """KV blocks one replica holds in HBM.

    Per GPU: ``memory * gpu_memory_utilization - weights / tp - activation reserve``, divided by
    the KV bytes of one block on one GPU (FP16, the block's tokens across all layers, ``kv/tp``
    heads), as vLLM sizes its pool (``vllm/v1/worker/gpu_worker.py determine_available_memory``).

    Raises:
        ValueError: the weights leave no room for KV.
    """
    free_bytes = (
        gpu.memory_bytes * profile.gpu_memory_utilization
        - model.weight_bytes() / tp
        - profile.activation_reserve_bytes
    )
    block_bytes = model.kv_bytes_per_token() / tp * profile.block_size_tokens
    blocks = int(free_bytes // block_bytes)
    if blocks <= 0:
        raise ValueError(f"{model.name} at TP{tp} leaves no KV memory on {gpu.name}")
    return blocks


@dataclass(slots=True)
class _Run:
    """The step (or run of repeated decode steps) a replica has in flight."""

    start_s: float
    pieces: list[tuple[SimRequest, int]]
    num_steps: int
    end_s: float
    shape: BatchShape
    decode_a_s: float = 0.0  # repeated runs only: step j takes a + b (C0 + j B)
    decode_b_s: float = 0.0

    def elapsed_s(self, steps: int) -> float:
        """Time the first ``steps`` steps of a repeated run take."""
        c0, b_seqs = self.shape.decode_kv_tokens, len(self.pieces)
        return steps * self.decode_a_s + self.decode_b_s * (
            steps * c0 + b_seqs * steps * (steps - 1) / 2
        )


class Replica:
    """One engine replica: queues, a paged KV pool in HBM and the step in flight."""

    def __init__(
        self,
        index: int,
        num_blocks: int,
        token_budget: int,
        max_num_seqs: int,
        block_size_tokens: int,
        kv_block_bytes: int = 0,
    ) -> None:
        self.index = index
        self.total_blocks = num_blocks
        self.used_blocks = 0
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.block_size_tokens = block_size_tokens
        self.kv_block_bytes = kv_block_bytes
        self.last_sample_s = float("-inf")
        self.waiting: dict[str, SimRequest] = {}
        self.running: dict[str, SimRequest] = {}
        self.step_index = 0
        self.run: _Run | None = None
        self.version = 0  # bumps when the step in flight is re-timed; stale end events are skipped
        self.schedule_pending = False
        self.class_blocks: dict[str, int] = {}
        self.peak_blocks = 0
        self.peak_class_blocks: dict[str, int] = {}

    def state(self, now_s: float) -> StepState:
        """The policy's view of this replica."""
        return StepState(
            now_s=now_s,
            step_index=self.step_index,
            waiting=tuple(r.view() for r in self.waiting.values()),
            running=tuple(r.view() for r in self.running.values()),
            swapped=(),
            free_hbm_blocks=self.total_blocks - self.used_blocks,
            total_hbm_blocks=self.total_blocks,
            free_cpu_blocks=0,
            total_cpu_blocks=0,
            block_size_tokens=self.block_size_tokens,
            token_budget=self.token_budget,
            max_num_seqs=self.max_num_seqs,
            kv_block_bytes=self.kv_block_bytes,
            replica=self.index,
        )

    def set_blocks(self, req: SimRequest, blocks: int) -> None:
        """Resize ``req``'s KV to ``blocks`` blocks, keeping pool and per-class counts exact."""
        delta = blocks - req.kv_blocks
        if delta:
            self.used_blocks += delta
            name = req.spec.slo.name
            self.class_blocks[name] = self.class_blocks.get(name, 0) + delta
            req.kv_blocks = blocks
            req.touch()

    def record_peak(self) -> None:
        """Fold the current KV use into the peaks."""
        self.peak_blocks = max(self.peak_blocks, self.used_blocks)
        for name, blocks in self.class_blocks.items():
            if blocks > self.peak_class_blocks.get(name, 0):
                self.peak_class_blocks[name] = blocks


@dataclass(frozen=True, slots=True)
class SimResult:
    """Outcome of a simulation.

    Attributes:
        requests: every request, in workload order, in a terminal state.
        end_s: instant the last event ran, s.
        kv_block_bytes: bytes of one KV block across the replica's GPUs.
        peak_kv_blocks: per replica, the peak of KV blocks in use.
        peak_class_kv_blocks: per replica, per SLO class, the peak of blocks held by that class.
        num_steps: engine steps run, all replicas.
        num_schedule_calls: scheduling decisions asked of the policy, all replicas.
        kv_capacity_blocks: KV blocks of one replica.
        timeline: samples ``(replica, time_s, used_hbm_blocks, num_waiting, num_running)``.
    """

    requests: tuple[SimRequest, ...]
    end_s: float
    kv_block_bytes: float
    peak_kv_blocks: tuple[int, ...]
    peak_class_kv_blocks: tuple[dict[str, int], ...]
    num_steps: int
    num_schedule_calls: int
    kv_capacity_blocks: int
    timeline: tuple[tuple[int, float, int, int, int], ...] = ()


class Simulator:
    """Runs a workload through replicas of one engine, with decisions from the plugins.

    Args:
        config: engine, model, hardware and cluster size.
        hook: the plugin manager's hook relay (``PluginManager.hook``); the engine calls
            ``superinfer_schedule``, ``superinfer_request_arrived``,
            ``superinfer_request_finished``, ``superinfer_request_aborted`` and
            ``superinfer_step_finished`` on it.
        step_time: step-time model; a :class:`RooflineStepTime` for ``config`` by default.
    """

    def __init__(
        self, config: SimConfig, hook: Any, step_time: RooflineStepTime | None = None
    ) -> None:
        self.config = config
        self.hook = hook
        self.step_time = step_time or RooflineStepTime(config.model, config.gpu, config.tp)
        profile = config.profile
        self.num_blocks = config.num_gpu_blocks_override or kv_capacity_blocks(
            profile, config.model, config.gpu, config.tp
        )
        budget, max_seqs = profile.limits(config.gpu)
        self.replicas = [
            Replica(
                i,
                self.num_blocks,
                budget,
                max_seqs,
                profile.block_size_tokens,
                int(config.model.kv_bytes_per_token() * profile.block_size_tokens),
            )
            for i in range(config.replicas)
        ]
        self._events: list[tuple[float, int, int, int, Any]] = []
        self._seq = 0
        self._rr = 0
        self.num_steps = 0
        self.num_schedule_calls = 0
        self.now_s = 0.0
        self.timeline: list[tuple[int, float, int, int, int]] = []

    # -- event plumbing -------------------------------------------------------------------------

    def _push(self, time_s: float, kind: int, replica: int, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (time_s, kind, self._seq, replica, payload))

    def run(self, specs: Sequence[RequestSpec]) -> SimResult:
        """Simulate ``specs`` to completion (or the horizon).

        Raises:
            PolicyError: a plugin returned an inapplicable decision, or none.
        """
        reqs = [SimRequest(s) for s in specs]
        for req in reqs:
            self._push(req.spec.arrival_s, _ARRIVAL, -1, req)
        horizon = self.config.horizon_s
        handlers: dict[int, Callable[[float, int, Any], None]] = {
            _STEP_END: self._on_step_end,
            _ARRIVAL: self._on_arrival,
            _SCHEDULE: self._on_schedule,
        }
        while self._events:
            time_s, kind, _, replica, payload = heapq.heappop(self._events)
            if horizon is not None and time_s > horizon:
                break
            self.now_s = time_s
            handlers[kind](time_s, replica, payload)
        for req in reqs:
            if req.status not in (RequestStatus.FINISHED, RequestStatus.REJECTED):
                reason = "simulation_horizon" if horizon is not None else "stalled"
                self._end(req, RequestStatus.FAILED, reason)
        return SimResult(
            requests=tuple(reqs),
            end_s=self.now_s,
            kv_block_bytes=self.config.model.kv_bytes_per_token()
            * self.config.profile.block_size_tokens,
            peak_kv_blocks=tuple(r.peak_blocks for r in self.replicas),
            peak_class_kv_blocks=tuple(dict(r.peak_class_blocks) for r in self.replicas),
            num_steps=self.num_steps,
            num_schedule_calls=self.num_schedule_calls,
            kv_capacity_blocks=self.num_blocks,
            timeline=tuple(self.timeline),
        )

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` unless every replica's books balance.

        KV blocks in use equal the blocks the running requests hold and never exceed capacity
        (per class too); a request is in at most one queue of one replica, in the status that
        queue implies; the waiting hold no KV. Tests call this after every step.
        """
        seen: set[str] = set()
        for rep in self.replicas:
            held = sum(r.kv_blocks for r in rep.running.values())
            assert rep.used_blocks == held, (rep.index, rep.used_blocks, held)
            assert 0 <= rep.used_blocks <= rep.total_blocks, (rep.index, rep.used_blocks)
            assert sum(rep.class_blocks.values()) == rep.used_blocks
            for queue, status in (
                (rep.waiting, RequestStatus.WAITING),
                (rep.running, RequestStatus.RUNNING),
            ):
                for rid, req in queue.items():
                    assert rid not in seen, f"{rid} is in two queues"
                    seen.add(rid)
                    assert req.status is status and req.replica == rep.index, rid
            assert all(r.kv_blocks == 0 for r in rep.waiting.values())

    # -- handlers -------------------------------------------------------------------------------

    def _on_arrival(self, now_s: float, _: int, req: SimRequest) -> None:
        rep = self.replicas[self._rr]
        self._rr = (self._rr + 1) % len(self.replicas)
        req.replica = rep.index
        spec = req.spec
        self.hook.superinfer_request_arrived(request=req.view(), now_s=now_s)
        total = spec.prompt_tokens + spec.max_output_tokens
        if total > self.config.model.max_model_len_tokens:
            self._end(req, RequestStatus.REJECTED, "exceeds_max_model_len")
            return
        if blocks_for_tokens(total, rep.block_size_tokens) > rep.total_blocks:
            self._end(req, RequestStatus.REJECTED, "exceeds_kv_capacity")
            return
        req.status = RequestStatus.WAITING
        rep.waiting[req.request_id] = req
        if rep.run is not None:
            self._cut_run(rep, now_s)
        elif not rep.schedule_pending:
            rep.schedule_pending = True
            self._push(now_s, _SCHEDULE, rep.index)

    def _on_schedule(self, now_s: float, replica: int, _: Any) -> None:
        rep = self.replicas[replica]
        rep.schedule_pending = False
        state = rep.state(now_s)
        decision = self.hook.superinfer_schedule(state=state)
        self.num_schedule_calls += 1
        if decision is None:
            raise PolicyError("no plugin answered superinfer_schedule")
        check_decision(state, decision)
        self._apply(rep, decision, now_s)
        if decision.num_tokens:
            self._start_run(rep, decision, now_s)

    def _on_step_end(self, now_s: float, replica: int, version: int) -> None:
        rep = self.replicas[replica]
        run = rep.run
        if run is None or version != rep.version:
            return  # re-timed: a newer end event exists
        rep.run = None
        k = run.num_steps
        finished: list[SimRequest] = []
        decode_tokens = prefill_tokens = 0
        for req, n in run.pieces:
            if n == 1 and req.generated_tokens > 0:
                decode_tokens += k
            else:
                prefill_tokens += n
            self._emit(req, run, n, now_s)
            rep.set_blocks(req, blocks_for_tokens(req.computed_tokens, rep.block_size_tokens))
            if req.generated_tokens >= req.spec.output_tokens:
                finished.append(req)
        rep.record_peak()
        rep.step_index += k
        self.num_steps += k
        for req in finished:
            del rep.running[req.request_id]
            rep.set_blocks(req, 0)
            self._end(req, RequestStatus.FINISHED, "")
        if now_s - rep.last_sample_s >= self.config.timeline_interval_s:
            rep.last_sample_s = now_s
            self.timeline.append(
                (rep.index, now_s, rep.used_blocks, len(rep.waiting), len(rep.running))
            )
        self.hook.superinfer_step_finished(
            stats=StepStats(
                now_s=now_s,
                step_index=rep.step_index,
                duration_s=now_s - run.start_s,
                num_steps=k,
                num_prefill_tokens=prefill_tokens,
                num_decode_tokens=decode_tokens,
                num_running=len(run.pieces),
                num_waiting=len(rep.waiting),
                used_hbm_blocks=rep.used_blocks,
                total_hbm_blocks=rep.total_blocks,
                finished_ids=tuple(r.request_id for r in finished),
            )
        )
        if rep.waiting or rep.running:
            rep.schedule_pending = True
            self._push(now_s, _SCHEDULE, rep.index)

    # -- decisions and steps --------------------------------------------------------------------

    def _apply(self, rep: Replica, decision: ScheduleDecision, now_s: float) -> None:
        for rid, reason in decision.reject.items():
            req = rep.waiting.pop(rid)
            self._end(req, RequestStatus.REJECTED, reason)
        for rid in decision.preempt:  # check_decision allows only RECOMPUTE here
            req = rep.running.pop(rid)
            rep.set_blocks(req, 0)
            req.computed_tokens = 0
            req.num_preemptions += 1
            req.status = RequestStatus.WAITING
            req.touch()
            rep.waiting = {rid: req, **rep.waiting}  # vLLM prepends preempted requests
        for rid in decision.admit:
            req = rep.waiting.pop(rid)
            req.status = RequestStatus.RUNNING
            rep.running[rid] = req
        for rid, tier in decision.tiers.items():
            req = rep.running.get(rid) or rep.waiting[rid]
            req.tier = tier
            req.touch()

    def _start_run(self, rep: Replica, decision: ScheduleDecision, now_s: float) -> None:
        bs = rep.block_size_tokens
        pieces = [(rep.running[rid], n) for rid, n in decision.num_tokens.items()]
        pairs = 0.0
        prefill_kv = decode_kv = samples = 0
        for req, n in pieces:
            c = req.computed_tokens
            if n == 1:
                decode_kv += c + 1
            else:
                pairs += n * (c + (n + 1) / 2)
                prefill_kv += c + n
            samples += req.pending_tokens == n
        shape = BatchShape(
            sum(n for _, n in pieces), samples, pairs, prefill_kv, decode_kv, len(pieces)
        )
        steps = self._repeat_steps(rep, decision, pieces)
        if steps > 1:
            a, b = self.step_time.decode_coefficients(len(pieces))
            run = _Run(now_s, pieces, steps, now_s, shape, a, b)
            run.end_s = now_s + run.elapsed_s(steps)
        else:
            run = _Run(now_s, pieces, 1, now_s + self.step_time.step_time_s(shape), shape)
        for req, n in pieces:
            rep.set_blocks(req, blocks_for_tokens(req.computed_tokens + max(n, steps), bs))
        rep.run = run
        rep.version += 1
        self._push(run.end_s, _STEP_END, rep.index, rep.version)

    def _repeat_steps(
        self, rep: Replica, decision: ScheduleDecision, pieces: list[tuple[SimRequest, int]]
    ) -> int:
        """Steps a decode-only decision may run as one event: bounded by the policy's allowance,
        the first finish, and the KV blocks free for the sequences' growth."""
        if decision.max_repeat_steps <= 1 or any(n != 1 for _, n in pieces):
            return 1
        if any(req.pending_tokens != 1 for req, _ in pieces):
            return 1
        k_max = min(
            decision.max_repeat_steps,
            min(r.spec.output_tokens - r.generated_tokens for r, _ in pieces),
        )
        free = rep.total_blocks - rep.used_blocks
        bs = rep.block_size_tokens

        def fits(k: int) -> bool:
            need = sum(
                max(0, blocks_for_tokens(r.computed_tokens + k, bs) - r.kv_blocks)
                for r, _ in pieces
            )
            return need <= free

        lo, hi = 1, k_max  # fits(1) holds: check_decision verified the single step
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _cut_run(self, rep: Replica, now_s: float) -> None:
        """An arrival during a repeated run: end it with the step in flight at ``now_s``."""
        run = rep.run
        assert run is not None
        if run.num_steps <= 1 or now_s >= run.end_s:
            return
        lo, hi = 1, run.num_steps  # smallest j with start + elapsed(j) >= now
        while lo < hi:
            mid = (lo + hi) // 2
            if run.start_s + run.elapsed_s(mid) >= now_s:
                hi = mid
            else:
                lo = mid + 1
        if lo < run.num_steps:
            run.num_steps = lo
            run.end_s = run.start_s + run.elapsed_s(lo)
            rep.version += 1
            self._push(run.end_s, _STEP_END, rep.index, rep.version)

    def _emit(self, req: SimRequest, run: _Run, n: int, end_s: float) -> None:
        """Advance ``req`` by the run: KV for its ``n`` tokens per step, and the output tokens of
        the steps that complete its pending tokens (every step of a repeated decode run)."""
        k = run.num_steps
        emitted = k if k > 1 else int(req.pending_tokens == n)
        req.computed_tokens += n * k
        if emitted:
            first_end = run.start_s + run.elapsed_s(1) if k > 1 else end_s
            if req.last_token_s is not None:
                req.max_itl_s = max(req.max_itl_s, first_end - req.last_token_s)
            if k > 1:
                last_step = run.elapsed_s(k) - run.elapsed_s(k - 1)
                req.max_itl_s = max(req.max_itl_s, last_step)
            if req.first_token_s is None:
                req.first_token_s = first_end
            req.generated_tokens += emitted
            req.last_token_s = end_s
        req.touch()

    def _end(self, req: SimRequest, status: RequestStatus, reason: str) -> None:
        req.status = status
        req.reason = reason
        req.finish_s = self.now_s
        req.touch()
        if status is RequestStatus.FINISHED:
            self.hook.superinfer_request_finished(request=req.view(), now_s=self.now_s)
        else:
            self.hook.superinfer_request_aborted(
                request=req.view(), now_s=self.now_s, reason=reason
            )
