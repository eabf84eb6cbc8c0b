"""The engine scheduler that asks the policy: :class:`PolicyScheduler` (``"superinfer"``).

transformers' continuous-batching manager (``continuous_api.py``, transformers 5.24) builds its
scheduler from ``SCHEDULER_MAPPING[ContinuousBatchingConfig.scheduler_type]`` and, once per step of
its generation loop, calls ``schedule_batch(token_budget, cache_budget)`` for the batch to run. Our
subclass answers that call by building a :class:`StepState` (``view.py``), asking the plugins
(``superinfer_schedule``), checking the decision (``check_decision``) and applying it
(``apply.py``). It also calls the lifecycle hooks: ``superinfer_request_arrived`` when the
engine takes a request from its input queue, ``superinfer_request_finished`` /
``superinfer_request_aborted`` when one ends, and ``superinfer_step_finished`` after each step.

The engine's loop has no end-of-step callback; a step is closed at the start of the loop's next
iteration (the next request intake, cancellation sweep or scheduling call, whichever comes
first), which is after the engine has sampled the step's tokens and delivered its outputs.

Each closed step becomes a :class:`StepRecord`: where its time went (scheduling and policy,
input preparation, the model's forward pass, sampling and output handling) and what it ran.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from transformers.generation.continuous_batching.requests import (
    FutureRequestState,
    RequestState,
    RequestStatus,
)
from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING, Scheduler

from superinfer.adapters.hf.apply import Piece, apply_decision
from superinfer.adapters.hf.view import (
    TrackedRequest,
    free_blocks,
    full_attention_allocator,
    kv_blocks,
    request_view,
    step_state,
    total_blocks,
)
from superinfer.policy_core.batching import blocks_for_tokens
from superinfer.policy_core.changes import ViewTracker
from superinfer.policy_core.types import RequestView, ScheduleDecision, StepState, StepStats
from superinfer.policy_core.validation import PolicyError, check_decision

__all__ = ["SCHEDULER_NAME", "EngineBinding", "PolicyScheduler", "StepRecord", "install"]

#: ``ContinuousBatchingConfig.scheduler_type`` that selects :class:`PolicyScheduler`.
SCHEDULER_NAME = "superinfer"
#: Isolations of failing requests tried in one scheduling call before the engine stops (each
#: fails at least one request, so a step of n live requests needs at most n).
_MAX_POLICY_RETRIES = 64


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step. Instants are on the session clock, durations in s.

    Attributes:
        step_index: 0-based step counter of the session.
        start_s: the engine entered ``schedule_batch``.
        end_s: the engine started its next loop iteration (outputs of this step delivered).
        schedule_s: time inside ``schedule_batch``: views, policy, checks, applying the decision.
        policy_s: of ``schedule_s``, time inside the ``superinfer_schedule`` hook.
        prepare_s: from ``schedule_batch`` returning to the model's forward starting (input
            tensors, attention mask, cache indices).
        forward_s: the model's forward pass (all layers and the LM head).
        finish_s: from the forward's end to ``end_s`` (sampling, copying tokens out, updating
            request states, delivering streamed outputs).
        pieces: what each scheduled request ran.
        num_waiting: requests waiting once the step was scheduled.
        used_blocks: KV blocks in use once the step was scheduled.
    """

    step_index: int
    start_s: float
    end_s: float
    schedule_s: float
    policy_s: float
    prepare_s: float
    forward_s: float
    finish_s: float
    pieces: tuple[Piece, ...]
    num_waiting: int
    used_blocks: int

    @property
    def duration_s(self) -> float:
        """Wall time of the step, s."""
        return self.end_s - self.start_s

    @property
    def num_tokens(self) -> int:
        """Tokens the step ran."""
        return sum(p.num_tokens for p in self.pieces)

    @property
    def num_decode_tokens(self) -> int:
        """Tokens of decode pieces."""
        return sum(p.num_tokens for p in self.pieces if p.decode)

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of prefill pieces (first prefills and recomputes)."""
        return self.num_tokens - self.num_decode_tokens


@dataclass(slots=True)
class _OpenStep:
    index: int
    start_s: float
    schedule_end_s: float
    policy_s: float
    pieces: tuple[Piece, ...]
    num_waiting: int
    used_blocks: int


@dataclass
class EngineBinding:
    """What a :class:`PolicyScheduler` needs from the session that runs it.

    The engine thread writes the records here; the session thread reads them once the engine has
    stopped, or under :attr:`lock`.

    Attributes:
        hook: the plugin manager's hook relay (``PluginManager.hook``).
        clock: the session clock, s (monotonic).
        tracked: the adapter's record of each request, registered before the request is submitted.
        max_model_len_tokens: longest sequence the model takes; longer requests are rejected.
        timeline_interval_s: KV use and queue lengths are sampled at the end of the first step
            at least this long after the previous sample.
        steps: every closed step, in order.
        ended: request id -> ``(status, reason, instant)`` for requests that ended without an
            engine output: rejected at arrival or by the policy.
        error: the exception that stopped the engine's loop, if any.
        peak_blocks: peak KV blocks in use.
        peak_class_blocks: per SLO class, the peak of the blocks its requests held.
        timeline: samples ``(time_s, used_blocks, num_waiting, num_running)``.
        forward_start_s: start of the latest forward pass.
        forward_end_s: end of the latest forward pass.
        kv_block_bytes: bytes of one KV block (every layer's page), set by ``bind``.
        on_end: called (on the engine thread) as ``on_end(request_id, status, reason, instant)``
            whenever an entry is added to :attr:`ended`, for a server that must answer the
            client of a request the engine will produce no output for.
        queue_by_tier: live requests after the latest scheduling call, per ``(tier, state)``
            with state ``"waiting"`` or ``"running"`` (holding KV); read under :attr:`lock`.
        used_blocks: KV blocks in use after the latest scheduling call.
        capacity_blocks: KV blocks of the pool (set by ``bind``).
        isolate_policy_errors: a policy error fails only the request(s) it came from and the
            engine goes on (a server sets it); ``False`` (a benchmark): it stops the engine.
        policy_errors: requests failed because the policy raised on them (``"policy error:
            ..."``), or raised in a lifecycle hook, the engine going on with the others.
        hook_errors: the latest (at most 16) errors a lifecycle hook raised, one line each.
    """

    hook: Any
    clock: Callable[[], float]
    tracked: dict[str, TrackedRequest]
    max_model_len_tokens: int
    timeline_interval_s: float = 1.0
    steps: list[StepRecord] = field(default_factory=list)
    ended: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    error: BaseException | None = None
    peak_blocks: int = 0
    peak_class_blocks: dict[str, int] = field(default_factory=dict)
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)
    forward_start_s: float = 0.0
    forward_end_s: float = 0.0
    kv_block_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    on_end: Callable[[str, str, str, float], None] | None = None
    queue_by_tier: dict[tuple[int, str], int] = field(default_factory=dict)
    used_blocks: int = 0
    capacity_blocks: int = 0
    isolate_policy_errors: bool = False
    policy_errors: int = 0
    hook_errors: list[str] = field(default_factory=list)

    def record_end(self, request_id: str, status: str, reason: str, now_s: float) -> None:
        """Record that a request ended without an engine output, and tell :attr:`on_end`."""
        with self.lock:
            self.ended[request_id] = (status, reason, now_s)
        if self.on_end is not None:
            self.on_end(request_id, status, reason, now_s)

    def forward_started(self) -> None:
        """Model forward pre-hook: stamp the start of a forward pass."""
        self.forward_start_s = self.clock()

    def forward_ended(self) -> None:
        """Model forward hook: stamp its end."""
        self.forward_end_s = self.clock()


class PolicyScheduler(Scheduler):
    """transformers continuous-batching scheduler whose every decision comes from the plugins.

    Built by the engine like its own schedulers (``SCHEDULER_MAPPING``); unusable until
    :meth:`bind` gives it the hook relay and the session clock. Requires a cache without
    prefix sharing (``allow_block_sharing=False``): a prefix match taken at admission would
    change a request's computed tokens after the policy decided.

    Args:
        cache: the engine's paged cache.
        safety_margin: accepted for the engine's constructor signature; unused (the policy owns
            admission).
        max_requests_per_batch: most requests one step may run (``StepState.max_num_seqs``).
    """

    def __init__(
        self, cache: Any, safety_margin: float | None, max_requests_per_batch: int
    ) -> None:
        super().__init__(
            cache, 0.0 if safety_margin is None else safety_margin, max_requests_per_batch
        )
        self._binding: EngineBinding | None = None

    def reset(self) -> None:
        """Clear the queues (engine) and the step in flight; the binding is kept."""
        super().reset()
        self._open: _OpenStep | None = None
        self._step_index = 0
        self._views = ViewTracker()  # change sets of full states (probes are not stamped)
        self._finished_ids: list[str] = []
        self._last_sample_s = float("-inf")

    def bind(self, binding: EngineBinding) -> None:
        """Attach the session: hooks, clock and request records.

        Raises:
            ValueError: the cache shares prefix blocks, or the model is not full-attention only.
        """
        if self.cache.use_prefix_sharing:
            raise ValueError("the hf adapter needs allow_block_sharing=False (no prefix sharing)")
        alloc = full_attention_allocator(self.cache)
        binding.kv_block_bytes = alloc.bytes_per_block
        binding.capacity_blocks = total_blocks(self.cache, alloc)
        self._binding = binding

    def _require(self) -> EngineBinding:
        if self._binding is None:
            raise RuntimeError("PolicyScheduler used before bind(): start it through EngineSession")
        return self._binding

    # -- request lifecycle ----------------------------------------------------------------------

    def add_waiting_request(self, state: RequestState) -> None:
        """A request leaves the engine's input queue: tell the plugins, reject it if it can never
        run (as the simulator does), else queue it."""
        b = self._require()
        self._close_step()
        now = b.clock()
        rec = b.tracked[state.request_id]
        try:
            b.hook.superinfer_request_arrived(request=request_view(state, rec, 0), now_s=now)
        except Exception as exc:  # noqa: BLE001  (fails this request only)
            if not b.isolate_policy_errors:
                raise
            with b.lock:
                b.policy_errors += 1
            reason = f"policy error: {type(exc).__name__}: {exc}"
            self._end(state, rec, "failed", reason)
            return
        alloc = full_attention_allocator(self.cache)
        total = rec.prompt_tokens + rec.max_output_tokens
        reason = ""
        if total > b.max_model_len_tokens:
            reason = "exceeds_max_model_len"
        elif blocks_for_tokens(total, alloc.tokens_per_page) > total_blocks(self.cache, alloc):
            reason = "exceeds_kv_capacity"
        if reason:
            self._end(state, rec, "rejected", reason)
            return
        super().add_waiting_request(state)

    def finish_request(self, request_id: str) -> None:
        """The engine ends a request (it finished, or failed): tell the plugins, free its KV."""
        b = self._binding
        state = self.active_requests.get(request_id)
        if b is not None and state is not None:
            rec = b.tracked[request_id]
            view = request_view(state, rec, 0)
            if state.status == RequestStatus.FINISHED:
                _notify(b, b.hook.superinfer_request_finished, request=view, now_s=b.clock())
                self._finished_ids.append(request_id)
            else:
                _aborted(b, view, b.clock(), state.error or "engine_error")
        super().finish_request(request_id)
        if b is not None:
            self._snapshot(b)

    def clear_cancelled_requests(self) -> list[RequestState]:
        """The engine's per-iteration cancellation sweep; the previous step ends here. Each
        cancelled request (``ContinuousBatchingManager.cancel_request``: a server's client went
        away) is reported to the plugins as aborted with reason ``"cancelled"``."""
        self._close_step()
        cancelled = super().clear_cancelled_requests()
        b = self._binding
        if b is not None:
            for state in cancelled:
                rec = b.tracked.get(state.request_id)
                if rec is None:
                    continue
                now = b.clock()
                _aborted(b, request_view(state, rec, 0), now, "cancelled")
                b.record_end(state.request_id, "failed", "cancelled", now)
            if cancelled:
                self._snapshot(b)
        return cancelled

    def _end(self, state: RequestState, rec: TrackedRequest, status: str, reason: str) -> None:
        b = self._require()
        now = b.clock()
        blocks = kv_blocks(full_attention_allocator(self.cache), rec.request_id)
        _aborted(b, request_view(state, rec, blocks), now, reason)
        b.record_end(rec.request_id, status, reason, now)

    # -- scheduling -----------------------------------------------------------------------------

    def schedule_batch(
        self, token_budget: int, cache_budget: int
    ) -> tuple[list[FutureRequestState] | None, bool, int, int]:
        """Form the next step from the policy's decision.

        Args:
            token_budget: most query tokens of a step (the engine's ``max_batch_tokens``).
            cache_budget: most KV tokens a step reads (the whole pool here; never binding, since
                the requests' past lengths fit in the pool).

        Returns:
            ``(batch, decode_fast_path, num_q_tokens, max_kv_read)`` as the engine expects; an
            empty batch when the decision runs nothing (the engine then waits for new work).

        Raises:
            PolicyError: no plugin answered, or the decision fails ``check_decision``.
        """
        b = self._require()
        self._close_step()
        try:
            return self._schedule(b, token_budget)
        except BaseException as exc:
            b.error = exc
            raise

    def _state(
        self,
        b: EngineBinding,
        token_budget: int,
        only: str | None = None,
        *,
        empty: bool = False,
    ) -> StepState:
        """The policy's view now: of every live request, of ``only`` alone, or of none."""
        waiting = [self.waiting_requests[rid] for rid in self.waiting_requests_order]
        running = list(self.active_requests.values())
        if empty or only is not None:
            waiting = [s for s in waiting if s.request_id == only]
            running = [s for s in running if s.request_id == only]
        state = step_state(
            now_s=b.clock(),
            step_index=self._step_index,
            waiting=waiting,
            running=running,
            tracked=b.tracked,
            cache=self.cache,
            token_budget=token_budget,
            max_num_seqs=self.max_requests_per_batch,
        )
        return state if empty or only is not None else self._views.stamp(state)

    def _decide(self, b: EngineBinding, state: StepState) -> ScheduleDecision:
        """The plugins' checked decision on ``state``.

        Raises:
            Exception: whatever the policy raised; PolicyError if no plugin answered or the
                decision fails ``check_decision``.
        """
        decision = b.hook.superinfer_schedule(state=state)
        if decision is None:
            raise PolicyError("no plugin answered superinfer_schedule")
        check_decision(state, decision)
        return cast(ScheduleDecision, decision)

    def _fail_culprits(self, b: EngineBinding, token_budget: int, error: Exception) -> None:
        """The policy raised on a step: find the requests it raises on and fail only them.

        Each live request is offered to the policy alone (the probes' decisions are discarded);
        a request the policy raises on is failed with ``"policy error: <its error>"``. Where no
        single request makes it raise (an interaction), every live request is failed with the
        step's error. The engine then goes on with the others.

        Raises:
            Exception: ``error`` again when the policy raises on a step with no requests at all:
                the policy cannot run any step, and the engine stops.
        """
        try:
            self._decide(b, self._state(b, token_budget, empty=True))
        except Exception:
            raise error from None
        ids = list(self.waiting_requests_order) + list(self.active_requests)
        culprits: dict[str, Exception] = {}
        for rid in ids:
            try:
                self._decide(b, self._state(b, token_budget, rid))
            except Exception as exc:
                culprits[rid] = exc
        if not culprits:
            culprits = dict.fromkeys(ids, error)
        for rid, raised in culprits.items():
            self._fail(b, rid, f"policy error: {type(raised).__name__}: {raised}")
        self._snapshot(b)

    def _fail(self, b: EngineBinding, request_id: str, reason: str) -> None:
        """End a live request the policy failed on: drop it from the queues, free its KV, tell
        the plugins (an error there is ignored: the request is already being failed) and
        :attr:`EngineBinding.on_end`."""
        state = self.active_requests.pop(request_id, None)
        if state is None:
            state = self.waiting_requests.pop(request_id)
            self.waiting_requests_order.remove(request_id)
        rec = b.tracked[request_id]
        view = request_view(state, rec, kv_blocks(full_attention_allocator(self.cache), request_id))
        self.cache.free_blocks(request_id)
        now = b.clock()
        with b.lock:
            b.policy_errors += 1
        _aborted(b, view, now, "policy_error")
        b.record_end(request_id, "failed", reason, now)

    def _schedule(
        self, b: EngineBinding, token_budget: int
    ) -> tuple[list[FutureRequestState] | None, bool, int, int]:
        start = b.clock()
        for _ in range(_MAX_POLICY_RETRIES):
            if not self.has_pending_requests():
                self._record_kv(b)
                return [], False, 0, 0
            state = self._state(b, token_budget)
            policy_start = b.clock()
            try:
                decision = self._decide(b, state)
            except Exception as exc:  # noqa: BLE001  (isolated and reported per request)
                if not b.isolate_policy_errors:
                    raise
                self._fail_culprits(b, token_budget, exc)
                continue
            policy_s = b.clock() - policy_start
            break
        else:
            raise PolicyError(f"the policy kept failing after {_MAX_POLICY_RETRIES} isolations")
        applied = apply_decision(self, decision, b.tracked)
        if applied.rejected:
            views = {v.request_id: v for v in state.waiting}
            for rid, reason in applied.rejected.items():
                now = b.clock()
                _aborted(b, views[rid], now, reason)
                b.record_end(rid, "rejected", reason, now)
        used = self._record_kv(b)
        if not applied.batch:
            return [], False, 0, 0
        self._open = _OpenStep(
            index=self._step_index,
            start_s=start,
            schedule_end_s=b.clock(),
            policy_s=policy_s,
            pieces=applied.pieces,
            num_waiting=len(self.waiting_requests),
            used_blocks=used,
        )
        fast = self.cache.max_blocks_per_request > 0 and all(
            p.num_tokens == 1 and p.computed_tokens < self.cache.max_decode_fast_path_length
            for p in applied.pieces
        )
        return applied.batch, fast, applied.num_q_tokens, applied.max_kv_read

    def _record_kv(self, b: EngineBinding) -> int:
        """Fold the KV held after scheduling (its peak for the step) into the peaks."""
        alloc = full_attention_allocator(self.cache)
        used = total_blocks(self.cache, alloc) - free_blocks(self.cache, alloc)
        per_class: dict[str, int] = {}
        for rid in self.active_requests:
            name = b.tracked[rid].slo.name
            per_class[name] = per_class.get(name, 0) + kv_blocks(alloc, rid)
        b.peak_blocks = max(b.peak_blocks, used)
        for name, blocks in per_class.items():
            b.peak_class_blocks[name] = max(b.peak_class_blocks.get(name, 0), blocks)
        self._snapshot(b, used)
        return used

    def _snapshot(self, b: EngineBinding, used: int | None = None) -> None:
        """Publish the live requests per tier and the KV in use (for a server's metrics)."""
        if used is None:
            alloc = full_attention_allocator(self.cache)
            used = total_blocks(self.cache, alloc) - free_blocks(self.cache, alloc)
        queues: dict[tuple[int, str], int] = {}
        for state, ids in (("running", self.active_requests), ("waiting", self.waiting_requests)):
            for rid in ids:
                rec = b.tracked.get(rid)
                key = (rec.tier if rec is not None else 0, state)
                queues[key] = queues.get(key, 0) + 1
        with b.lock:
            b.queue_by_tier, b.used_blocks = queues, used

    def _close_step(self) -> None:
        """End the step in flight, if any: record it and call ``superinfer_step_finished``."""
        step = self._open
        if step is None:
            return
        self._open = None
        b = self._require()
        end = b.clock()
        fwd_start = max(b.forward_start_s, step.schedule_end_s)
        fwd_end = max(b.forward_end_s, fwd_start)
        record = StepRecord(
            step_index=step.index,
            start_s=step.start_s,
            end_s=end,
            schedule_s=step.schedule_end_s - step.start_s,
            policy_s=step.policy_s,
            prepare_s=fwd_start - step.schedule_end_s,
            forward_s=fwd_end - fwd_start,
            finish_s=end - fwd_end,
            pieces=step.pieces,
            num_waiting=step.num_waiting,
            used_blocks=step.used_blocks,
        )
        for piece in step.pieces:
            rec = b.tracked[piece.request_id]
            if piece.samples and rec.first_token_s is None:
                rec.first_token_s = end
        self._step_index += 1
        finished, self._finished_ids = tuple(self._finished_ids), []
        with b.lock:
            b.steps.append(record)
            if end - self._last_sample_s >= b.timeline_interval_s:
                self._last_sample_s = end
                b.timeline.append(
                    (end, step.used_blocks, len(self.waiting_requests), len(self.active_requests))
                )
        alloc = full_attention_allocator(self.cache)
        _notify(
            b,
            b.hook.superinfer_step_finished,
            stats=StepStats(
                now_s=end,
                step_index=self._step_index,
                duration_s=record.duration_s,
                num_steps=1,
                num_prefill_tokens=record.num_prefill_tokens,
                num_decode_tokens=record.num_decode_tokens,
                num_running=len(step.pieces),
                num_waiting=len(self.waiting_requests),
                used_hbm_blocks=total_blocks(self.cache, alloc) - free_blocks(self.cache, alloc),
                total_hbm_blocks=total_blocks(self.cache, alloc),
                finished_ids=finished,
            ),
        )


def _notify(b: EngineBinding, hook: Callable[..., Any], **kwargs: Any) -> None:
    """Call a lifecycle hook (arrival aside); with ``isolate_policy_errors`` an error there is
    counted (``policy_errors``, ``hook_errors``) and the engine goes on: the request it concerns
    has already finished or is being ended."""
    try:
        hook(**kwargs)
    except Exception as exc:  # noqa: BLE001
        if not b.isolate_policy_errors:
            raise
        with b.lock:
            b.policy_errors += 1
            b.hook_errors.append(f"{type(exc).__name__}: {exc}"[:200])
            del b.hook_errors[:-16]


def _aborted(b: EngineBinding, view: RequestView, now_s: float, reason: str) -> None:
    """``superinfer_request_aborted`` through :func:`_notify`."""
    _notify(b, b.hook.superinfer_request_aborted, request=view, now_s=now_s, reason=reason)


def install() -> None:
    """Register :class:`PolicyScheduler` in transformers' ``SCHEDULER_MAPPING`` as ``"superinfer"``.

    Idempotent. Raises ``RuntimeError`` if another class holds that name.
    """
    current = SCHEDULER_MAPPING.get(SCHEDULER_NAME)
    if current is not None and current is not PolicyScheduler:
        raise RuntimeError(f"SCHEDULER_MAPPING[{SCHEDULER_NAME!r}] is already {current!r}")
    SCHEDULER_MAPPING[SCHEDULER_NAME] = PolicyScheduler
