"""Mode A: a front-end gate around the LLM API, with no change to TensorRT-LLM.

The gate holds requests and submits them with ``LLM.generate_async(..., streaming=True)`` in the
policy's order, keeping at most ``max_batch_size`` in flight, so the engine's own FIFO waiting
queue stays short and the policy decides admission (engine notes §3.2, Mode A). At every
admission it asks the placement policy about the prompt's blocks and passes the answer as the
request's ``KvCacheRetentionConfig``. ``poll`` folds the engine's KV cache events into a prefix
table (what the placement policy sees) and turns iteration stats into ``step_finished`` reports.

Scheduling points: an arrival, a first token (a prefill done), a finish or abort. Only admissions
and rejections can be applied from outside the engine: running requests cannot be paused or have
decode steps skipped, so a decision's ``preempt`` is counted and otherwise ignored, and
``num_tokens`` matters only for whom it admits.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from superinfer.adapters.trtllm.apply import (
    RetentionMapping,
    RetentionRange,
    kv_precision_of_dtype,
    retention_config,
    retention_ranges,
)
from superinfer.adapters.trtllm.engine import load_engine
from superinfer.adapters.trtllm.kv_events import PrefixCacheTable
from superinfer.adapters.trtllm.slo_table import FileSloTable, InMemorySloTable
from superinfer.adapters.trtllm.view import front_end_view, iteration_step_stats
from superinfer.policy_core.batching import blocks_for_tokens
from superinfer.policy_core.changes import ViewTracker
from superinfer.policy_core.types import (
    SLO,
    KVLocation,
    KVPrecision,
    Placement,
    PrefixNodeView,
    RequestView,
    ScheduleDecision,
    StepState,
)
from superinfer.policy_core.validation import PolicyError, check_decision

__all__ = [
    "GateConfig",
    "GateCounters",
    "GateRequest",
    "GateStatus",
    "RequestNotAdmittedError",
    "TrtllmGate",
]


class GateStatus(str, enum.Enum):
    """Where a request stands. Terminal: finished, rejected, aborted, failed."""

    HELD = "held"
    SUBMITTED = "submitted"
    FINISHED = "finished"
    REJECTED = "rejected"
    ABORTED = "aborted"
    FAILED = "failed"


class RequestNotAdmittedError(RuntimeError):
    """The request ended before it reached the engine (rejected by the policy, aborted, failed)."""

    def __init__(self, request_id: str, status: GateStatus, reason: str) -> None:
        super().__init__(f"request {request_id!r} {status.value}: {reason}")
        self.request_id = request_id
        self.status = status
        self.reason = reason


@dataclass(eq=False)
class GateRequest:
    """One request the gate has seen; the engine's ``RequestOutput`` once submitted.

    Attributes:
        request_id: the gate's id (the policy sees this one).
        prompt_token_ids: the prompt.
        sampling_params: passed to ``generate_async``.
        slo: its SLO class.
        arrival_s: when it reached the gate, in s of the gate's clock.
        max_output_tokens: ``sampling_params.max_tokens``.
        status: see :class:`GateStatus`.
        handle: the engine's ``RequestOutput`` (after submission).
        generated_tokens: output tokens streamed so far.
        first_token_s: when the first one arrived.
        finish_s: when it ended.
        tier: last tier the policy gave it.
        reason: why it was rejected, aborted or failed.
        retention: the retention ranges it was submitted with.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: Any
    slo: SLO
    arrival_s: float
    max_output_tokens: int
    generate_kwargs: dict[str, Any] = field(default_factory=dict)
    status: GateStatus = GateStatus.HELD
    handle: Any = None
    generated_tokens: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    tier: int = 0
    reason: str = ""
    retention: tuple[RetentionRange, ...] = ()
    path: tuple[str, ...] = ()
    _hits: tuple[int, int] = (-1, 0)  # (table events seen, matched tokens) cache
    _waiter: asyncio.Future[None] | None = None


@dataclass(frozen=True)
class GateConfig:
    """The engine limits the gate presents to the policy.

    Attributes:
        max_batch_size: requests in flight at most (the engine's ``max_batch_size``).
        max_num_tokens: the engine's per-step token budget.
        tokens_per_block: KV block size (``KvCacheConfig.tokens_per_block``).
        kv_capacity_blocks: GPU KV blocks; ``None`` to take it from the ``created`` KV event.
        reserve_to_completion: the capacity policy reserves blocks to completion
            (GUARANTEED_NO_EVICT, the default) rather than per step (MAX_UTILIZATION).
        kv_precision: the precision of the engine's KV dtype.
    """

    max_batch_size: int
    max_num_tokens: int
    tokens_per_block: int
    kv_capacity_blocks: int | None = None
    reserve_to_completion: bool = True
    kv_precision: KVPrecision = KVPrecision.FP16

    @classmethod
    def from_llm(cls, llm: Any) -> GateConfig:
        """Read the limits from ``llm.args`` (``TorchLlmArgs``; [verify] on 1.2.1).

        The KV capacity is ``KvCacheConfig.max_tokens / tokens_per_block`` when set; otherwise it
        comes from the engine's ``created`` KV event (needs ``event_buffer_max_size > 0``).
        """
        args = llm.args
        kv = args.kv_cache_config
        policy = str(getattr(args.scheduler_config, "capacity_scheduler_policy", ""))
        return cls(
            max_batch_size=int(args.max_batch_size),
            max_num_tokens=int(args.max_num_tokens),
            tokens_per_block=int(kv.tokens_per_block),
            kv_capacity_blocks=None
            if kv.max_tokens is None
            else kv.max_tokens // kv.tokens_per_block,
            reserve_to_completion=not policy.endswith("MAX_UTILIZATION"),
            kv_precision=kv_precision_of_dtype(str(kv.dtype)),
        )


@dataclass
class GateCounters:
    """What the gate did.

    Attributes:
        num_schedule_calls: decisions asked of the policy.
        num_submitted: requests handed to the engine.
        num_preempt_ignored: preemptions the policy asked for (not applicable from outside).
        num_admit_deferred: admissions that fit only thanks to an ignored preemption; those
            requests stay held for a later scheduling point.
        num_placement_calls: placement decisions asked at admissions.
        num_step_reports: iteration stats turned into ``step_finished`` reports.
        admitted: the ids each scheduling point admitted, in order.
    """

    num_schedule_calls: int = 0
    num_submitted: int = 0
    num_preempt_ignored: int = 0
    num_admit_deferred: int = 0
    num_placement_calls: int = 0
    num_step_reports: int = 0
    admitted: list[tuple[str, ...]] = field(default_factory=list)


class TrtllmGate:
    """Admission gate in front of one TensorRT-LLM ``LLM``.

    Args:
        llm: a ``tensorrt_llm.LLM`` (PyTorch backend).
        hook: the plugin manager's hook relay (``build_plugin_manager(...).hook``).
        config: engine limits; read from ``llm`` when omitted.
        clock: monotonic seconds.
        retention: placement -> retention priority mapping.
        slo_table: when given, every submitted request's class is registered there under the
            engine's request id, for a Mode B scheduler in the engine.

    Raises:
        ValueError: the KV capacity is neither configured nor reported by a ``created`` event.
        UnsupportedEngineError: not TensorRT-LLM 1.2.x.
    """

    def __init__(
        self,
        llm: Any,
        hook: Any,
        *,
        config: GateConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        retention: RetentionMapping | None = None,
        slo_table: InMemorySloTable | FileSloTable | None = None,
    ) -> None:
        self.llm = llm
        self.hook = hook
        self.config = config or GateConfig.from_llm(llm)
        self.clock = clock
        self.retention = retention or RetentionMapping()
        self.slo_table = slo_table
        self.table = PrefixCacheTable(self.config.tokens_per_block)
        self.counters = GateCounters()
        self._retention_cls = load_engine().retention_config
        self._held: dict[str, GateRequest] = {}
        self._in_flight: dict[str, GateRequest] = {}
        self._next_id = 0
        self._views = ViewTracker()  # change sets of the states pump() shows the policy
        if self.config.kv_capacity_blocks is None:
            self.poll()
            if not self.table.blocks_per_level:
                raise ValueError(
                    "cannot tell the engine's KV capacity: set KvCacheConfig(max_tokens=...) or "
                    "event_buffer_max_size > 0, or pass GateConfig(kv_capacity_blocks=...)"
                )

    # -- public API -----------------------------------------------------------------------------

    @property
    def held(self) -> Mapping[str, GateRequest]:
        """Requests waiting at the gate, in arrival order."""
        return self._held

    @property
    def in_flight(self) -> Mapping[str, GateRequest]:
        """Requests submitted to the engine and not ended."""
        return self._in_flight

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: Any = None,
        *,
        slo: SLO,
        request_id: str | None = None,
        **generate_kwargs: Any,
    ) -> GateRequest:
        """Queue a request at the gate; it reaches the engine when the policy admits it.

        Args:
            prompt_token_ids: the prompt as token ids (tokenize text with ``llm.tokenizer``).
            sampling_params: ``tensorrt_llm.SamplingParams`` (``max_tokens`` is the output cap).
            slo: its SLO class.
            request_id: the id the policy sees; ``"g<n>"`` when omitted.
            generate_kwargs: more ``generate_async`` arguments (``lora_request``, ``cache_salt``).

        Returns:
            Its record; ``status`` tells whether it was admitted at once.

        Raises:
            ValueError: an empty or non-integer prompt, or a request id already live.
        """
        ids = list(prompt_token_ids)
        if not ids or not all(isinstance(t, int) for t in ids):
            raise ValueError("prompt_token_ids must be a non-empty sequence of int token ids")
        if request_id is None:
            request_id = f"g{self._next_id}"
            self._next_id += 1
        if request_id in self._held or request_id in self._in_flight:
            raise ValueError(f"request id {request_id!r} is already live at the gate")
        for key in ("streaming", "kv_cache_retention_config"):
            if key in generate_kwargs:
                raise ValueError(f"{key} is set by the gate")
        now = self.clock()
        max_out = int(getattr(sampling_params, "max_tokens", None) or 0)
        if max_out <= 0:
            raise ValueError("sampling_params.max_tokens must be set (> 0)")
        rec = GateRequest(request_id, ids, sampling_params, slo, now, max_out, generate_kwargs)
        self._held[request_id] = rec
        self.hook.superinfer_request_arrived(request=self._view(rec), now_s=now)
        self.pump()
        return rec

    def on_output(self, rec: GateRequest, output: Any) -> None:
        """Fold one streamed ``RequestOutput`` of ``rec`` into the gate's books.

        A first token or a finish is a scheduling point.
        """
        if rec.status is not GateStatus.SUBMITTED:
            return
        n = len(output.outputs[0].token_ids)
        first = n > 0 and rec.first_token_s is None
        if first:
            rec.first_token_s = self.clock()
        rec.generated_tokens = n
        if output.finished:
            self._end(rec, GateStatus.FINISHED, "")
        if first or output.finished:
            self.pump()

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        """End a live request (held: dropped; in flight: ``RequestOutput.abort()``)."""
        rec = self._held.get(request_id) or self._in_flight.get(request_id)
        if rec is None:
            return
        if rec.status is GateStatus.SUBMITTED:
            rec.handle.abort()
        self._end(rec, GateStatus.ABORTED, reason)
        self.pump()

    def fail(self, rec: GateRequest, reason: str) -> None:
        """End a request whose engine stream failed."""
        if rec.status in (GateStatus.HELD, GateStatus.SUBMITTED):
            self._end(rec, GateStatus.FAILED, reason)
            self.pump()

    def pump(self) -> None:
        """One scheduling point: ask the policy and apply its admissions and rejections.

        Raises:
            PolicyError: no plugin answered, or the decision is inapplicable.
        """
        if not self._held:
            return
        now = self.clock()
        state = self._views.stamp(self.state(now))
        decision = self.hook.superinfer_schedule(state=state)
        if decision is None:
            raise PolicyError("no plugin answered superinfer_schedule")
        check_decision(state, decision)
        self.counters.num_schedule_calls += 1
        self.counters.num_preempt_ignored += len(decision.preempt)
        for rid, tier in decision.tiers.items():
            (self._held.get(rid) or self._in_flight[rid]).tier = tier
        for rid, reason in decision.reject.items():
            self._end(self._held[rid], GateStatus.REJECTED, reason)
        admit = self._admissible(decision, state)
        if admit:
            self.counters.admitted.append(admit)
        for rid in admit:
            self._submit(self._held.pop(rid), now, state.free_hbm_blocks)

    def _admissible(self, decision: ScheduleDecision, state: StepState) -> tuple[str, ...]:
        """The decision's admissions that fit with every running request still running.

        ``check_decision`` credits preempted requests' slots and blocks, which the gate cannot
        free; without preemptions this is the decision's ``admit`` unchanged.
        """
        if not decision.preempt:
            return decision.admit
        seqs = state.max_num_seqs - len(state.running)
        free = state.free_hbm_blocks
        admit: list[str] = []
        for rid in decision.admit:
            need = blocks_for_tokens(decision.num_tokens.get(rid, 0), state.block_size_tokens)
            if seqs <= 0 or need > free:
                break
            admit.append(rid)
            seqs, free = seqs - 1, free - need
        self.counters.num_admit_deferred += len(decision.admit) - len(admit)
        return tuple(admit)

    def poll(self, timeout_s: float = 0.0) -> None:
        """Read the engine's KV cache events and iteration stats (non-blocking by default).

        Events update the prefix table; each iteration's stats become one ``step_finished``.
        """
        now = self.clock()
        self.table.apply(self.llm.get_kv_cache_events(timeout_s), now)
        for stats in self.llm.get_stats(timeout_s):
            if "kvCacheStats" not in stats:
                continue  # an iteration without a KV cache manager reports no blocks
            report = iteration_step_stats(stats, now_s=now, num_held=len(self._held))
            self.hook.superinfer_step_finished(stats=report)
            self.counters.num_step_reports += 1

    async def poll_forever(self, interval_s: float = 0.05) -> None:
        """Call :meth:`poll` every ``interval_s`` seconds until cancelled."""
        while True:
            self.poll()
            await asyncio.sleep(interval_s)

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: Any = None,
        *,
        slo: SLO,
        request_id: str | None = None,
        **generate_kwargs: Any,
    ) -> AsyncIterator[Any]:
        """Submit through the gate and stream the engine's ``RequestOutput`` updates.

        Raises:
            RequestNotAdmittedError: the policy rejected it, or it was aborted before admission.
        """
        rec = self.submit(
            prompt_token_ids, sampling_params, slo=slo, request_id=request_id, **generate_kwargs
        )
        if rec.status is GateStatus.HELD:
            rec._waiter = asyncio.get_running_loop().create_future()
            try:
                await rec._waiter
            except asyncio.CancelledError:
                self.abort(rec.request_id)
                raise
        if rec.status is not GateStatus.SUBMITTED:
            raise RequestNotAdmittedError(rec.request_id, rec.status, rec.reason)
        try:
            async for output in rec.handle:
                self.on_output(rec, output)
                yield output
        except (asyncio.CancelledError, GeneratorExit):
            self.abort(rec.request_id)
            raise
        except Exception as exc:
            self.fail(rec, f"engine_error: {type(exc).__name__}: {exc}")
            raise

    # -- views ----------------------------------------------------------------------------------

    @property
    def kv_capacity_blocks(self) -> int:
        """GPU KV blocks of the engine."""
        if self.config.kv_capacity_blocks is not None:
            return self.config.kv_capacity_blocks
        return int(self.table.blocks_per_level[0])

    def _prefix_hit_tokens(self, rec: GateRequest) -> int:
        seen, tokens = rec._hits
        if seen != self.table.num_events:
            tokens = len(self.table.match(rec.prompt_token_ids)) * self.config.tokens_per_block
            rec._hits = (self.table.num_events, tokens)
        return tokens

    def _view(self, rec: GateRequest, in_flight: bool | None = None) -> RequestView:
        if in_flight is None:
            in_flight = rec.status is GateStatus.SUBMITTED
        return front_end_view(
            request_id=rec.request_id,
            arrival_s=rec.arrival_s,
            prompt_tokens=len(rec.prompt_token_ids),
            max_output_tokens=rec.max_output_tokens,
            slo=rec.slo,
            in_flight=in_flight,
            generated_tokens=rec.generated_tokens,
            tokens_per_block=self.config.tokens_per_block,
            reserve_to_completion=self.config.reserve_to_completion,
            prefix_hit_tokens=0
            if rec.status is not GateStatus.HELD
            else self._prefix_hit_tokens(rec),
            first_token_s=rec.first_token_s,
            tier=rec.tier,
            kv_precision=self.config.kv_precision,
        )

    def state(self, now_s: float | None = None) -> StepState:
        """The policy's view of the gate and the engine behind it."""
        now = self.clock() if now_s is None else now_s
        running = tuple(self._view(r) for r in self._in_flight.values())
        capacity = self.kv_capacity_blocks
        return StepState(
            now_s=now,
            step_index=self.counters.num_schedule_calls,
            waiting=tuple(self._view(r) for r in self._held.values()),
            running=running,
            swapped=(),
            free_hbm_blocks=max(0, capacity - sum(v.kv_blocks for v in running)),
            total_hbm_blocks=capacity,
            free_cpu_blocks=0,
            total_cpu_blocks=0,
            block_size_tokens=self.config.tokens_per_block,
            token_budget=self.config.max_num_tokens,
            max_num_seqs=self.config.max_batch_size,
        )

    def preview(
        self, prompt_token_ids: Sequence[int], max_output_tokens: int, slo: SLO
    ) -> RequestView:
        """The view a request would have if it arrived now (for precision routing)."""
        rec = GateRequest("?", list(prompt_token_ids), None, slo, self.clock(), max_output_tokens)
        return self._view(rec)

    # -- admission and the end of a request -----------------------------------------------------

    def _placement_nodes(
        self, rec: GateRequest, path: list[str], now: float
    ) -> list[PrefixNodeView]:
        tpb = self.config.tokens_per_block
        nodes = [self.table.view(node_id) for node_id in path]
        parent = path[-1] if path else None
        for i in range(len(path), len(rec.prompt_token_ids) // tpb):
            node_id = f"{rec.request_id}#{i}"  # a block this request will store
            nodes.append(PrefixNodeView(node_id, parent, tpb, 1, KVLocation.HBM, 0, now, False))
            parent = node_id
        return nodes

    def _free_cpu_blocks(self) -> int:
        levels = self.table.blocks_per_level
        if len(levels) < 2:
            return 0
        return max(0, int(levels[1]) - self.table.count(KVLocation.CPU))

    def _submit(self, rec: GateRequest, now: float, free_hbm_blocks: int) -> None:
        path = self.table.match(rec.prompt_token_ids)
        nodes = self._placement_nodes(rec, path, now)
        placements: list[Placement] = []
        if nodes:
            self.counters.num_placement_calls += 1
            decision = self.hook.superinfer_kv_placement(
                nodes=tuple(nodes),
                now_s=now,
                free_hbm_blocks=free_hbm_blocks,
                free_cpu_blocks=self._free_cpu_blocks(),
                # the blocks this request will store, beyond what is free
                needed_hbm_blocks=max(0, len(nodes) - len(path) - free_hbm_blocks),
                total_hbm_blocks=self.kv_capacity_blocks,
            )
            if decision is not None:
                placements = [decision.actions.get(n.node_id, Placement.KEEP) for n in nodes]
        rec.retention = retention_ranges(placements, self.config.tokens_per_block, self.retention)
        self.table.touch(path, now)
        self.table.acquire(path)
        rec.path = tuple(path)
        try:
            rec.handle = self.llm.generate_async(
                rec.prompt_token_ids,
                rec.sampling_params,
                streaming=True,
                kv_cache_retention_config=retention_config(rec.retention, self._retention_cls),
                **rec.generate_kwargs,
            )
        except Exception as exc:
            self._end(rec, GateStatus.FAILED, f"submit_failed: {type(exc).__name__}: {exc}")
            return
        rec.status = GateStatus.SUBMITTED
        self._in_flight[rec.request_id] = rec
        self.counters.num_submitted += 1
        if self.slo_table is not None:
            self.slo_table.put(rec.handle.request_id, rec.slo, rec.arrival_s)
        if rec._waiter is not None and not rec._waiter.done():
            rec._waiter.set_result(None)

    def _end(self, rec: GateRequest, status: GateStatus, reason: str) -> None:
        self._held.pop(rec.request_id, None)
        self._in_flight.pop(rec.request_id, None)
        self.table.release(rec.path)
        # the final view: a finished request has released its KV, an aborted one is shown as
        # it was when it ended
        view = self._view(
            rec, in_flight=rec.status is GateStatus.SUBMITTED and status is not GateStatus.FINISHED
        )
        rec.status, rec.reason, rec.finish_s = status, reason, self.clock()
        if status is GateStatus.FINISHED:
            self.hook.superinfer_request_finished(request=view, now_s=rec.finish_s)
        else:
            self.hook.superinfer_request_aborted(request=view, now_s=rec.finish_s, reason=reason)
        if rec._waiter is not None and not rec._waiter.done():
            rec._waiter.set_result(None)
