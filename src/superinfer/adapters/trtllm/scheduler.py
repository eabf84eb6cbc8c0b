"""Mode B: a ``RequestScheduler`` that asks the policy, then delegates to the executor's own.

At every ``PyExecutor._schedule()`` the wrapper shows the policy the executor's active requests
(``superinfer_schedule``), checks the decision, and hands the original ``SimpleScheduler`` the
active list reordered and filtered by it (``apply.plan_step``); the inner capacity and micro-batch
schedulers still decide what fits in the KV cache and the token budget. It reports requests that
appear and disappear (arrived / finished / aborted) and the step that ran (``step_finished``).

What the executor assumes of a scheduler (engine notes §5.2, enforced by the contract tests):
outputs are a subset of ``active_requests`` without duplicates; at most ``max_batch_size``
requests and ``max_num_tokens`` tokens run; paused requests had started; ``can_schedule`` has no
side effects; ``inflight_request_ids`` reaches the inner scheduler untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from superinfer.adapters.trtllm.apply import merge_output, plan_step
from superinfer.adapters.trtllm.engine import EngineModules
from superinfer.adapters.trtllm.slo_table import SloTable
from superinfer.adapters.trtllm.view import allocated_blocks, llm_request_view, reserved_blocks
from superinfer.policy_core.changes import ViewTracker
from superinfer.policy_core.types import SLO, RequestView, StepState, StepStats
from superinfer.policy_core.validation import PolicyError, check_decision

__all__ = ["NO_TOKEN_LIMIT", "EngineLimits", "LifecycleObserver", "SuperinferScheduler"]

#: Token budget shown to the policy when the engine sets none (``max_num_tokens=None``); the
#: executor's own "unlimited" (``PyExecutor(max_input_len=0x7fffffff)``).
NO_TOKEN_LIMIT = 0x7FFFFFFF


@dataclass(frozen=True)
class EngineLimits:
    """The executor's step limits, as the wrapped scheduler was built with them.

    Attributes:
        max_batch_size: most requests one step runs (micro-batch scheduler).
        max_num_tokens: most tokens one step runs, or :data:`NO_TOKEN_LIMIT`.
        tokens_per_block: KV block size.
        reserve_to_completion: the capacity policy is GUARANTEED_NO_EVICT (or STATIC_BATCH), which
            reserves blocks to completion; MAX_UTILIZATION does not.
    """

    max_batch_size: int
    max_num_tokens: int
    tokens_per_block: int
    reserve_to_completion: bool


@dataclass(slots=True)
class _Tracked:
    req: Any
    slo: SLO
    arrival_s: float
    slo_known: bool
    tier: int = 0
    first_token_s: float | None = None
    num_preemptions: int = 0
    rejected: bool = False


@dataclass(slots=True)
class _Repeat:
    steps_left: int
    active: tuple[tuple[int, bool], ...]  # (py_request_id, started) in active-list order
    plan: Any
    num_waiting: int


@dataclass(slots=True)
class _LastStep:
    now_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int


@dataclass
class SchedulerCounters:
    """What the wrapper did, for tests and logs.

    Attributes:
        num_calls: scheduling points answered.
        num_admitted_not_fitted: admissions the inner capacity scheduler did not fit that step.
        num_preempted: pauses the policy asked for.
        num_rejected: requests the policy rejected.
        num_repeated: steps that replayed a decode-only decision without asking the policy.
        admitted: ``(num_calls, admitted view ids)`` per answered point, when recording is on.
    """

    num_calls: int = 0
    num_admitted_not_fitted: int = 0
    num_preempted: int = 0
    num_rejected: int = 0
    num_repeated: int = 0
    admitted: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)


class SuperinferScheduler:
    """Wraps a 1.2 ``RequestScheduler`` (the executor's ``SimpleScheduler``).

    Registered as a virtual subclass of the engine's ``RequestScheduler`` when installed; other
    attributes (``capacity_scheduler``, ``micro_batch_scheduler``) are the inner scheduler's.

    Args:
        inner: the executor's scheduler.
        hook: the plugin manager's hook relay (``PluginManager.hook``).
        engine: the engine modules (request states, finish reasons).
        kv_cache_manager: the executor's Python ``KVCacheManager`` (for free blocks).
        limits: the executor's step limits.
        slo_table: where SLO classes are registered by LLM API request id.
        default_slo: the class of requests the table does not (yet) know.
        clock: monotonic seconds; the same clock as the table's arrival instants.
        record_admissions: keep each step's admitted ids in ``counters.admitted`` (tests).
    """

    def __init__(
        self,
        inner: Any,
        hook: Any,
        *,
        engine: EngineModules,
        kv_cache_manager: Any,
        limits: EngineLimits,
        slo_table: SloTable,
        default_slo: SLO,
        clock: Callable[[], float] = time.monotonic,
        record_admissions: bool = False,
    ) -> None:
        self.inner = inner
        self.hook = hook
        self.engine = engine
        self.kv_cache_manager = kv_cache_manager
        self.limits = limits
        self.slo_table = slo_table
        self.default_slo = default_slo
        self.clock = clock
        self.record_admissions = record_admissions
        self.counters = SchedulerCounters()
        self._tracked: dict[int, _Tracked] = {}
        self._last: _LastStep | None = None
        self._repeat: _Repeat | None = None
        self._views = ViewTracker()  # change sets of the states shown the policy

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    # -- the RequestScheduler interface ---------------------------------------------------------

    def can_schedule(self, requests: list[Any]) -> bool:
        """Delegated unchanged: a dry run must not reach the policy or change any state."""
        return bool(self.inner.can_schedule(requests))

    def schedule_request(self, active_requests: list[Any], inflight_request_ids: Any) -> Any:
        """One scheduling point: views -> policy -> inner scheduler -> merged output.

        A decode-only decision that allows ``max_repeat_steps > 1`` is replayed without asking
        the policy while the active list is unchanged (same requests in the same order, every
        started one decoding): any arrival, finish or pause ends the repeat, as the hook's
        contract requires (``ScheduleDecision.max_repeat_steps``).

        Raises:
            PolicyError: no plugin answered, or the decision is inapplicable.
        """
        now = self.clock()
        if self._repeat is not None and self._can_repeat(self._repeat, active_requests):
            return self._replay(self._repeat, inflight_request_ids, now)
        self._repeat = None
        return self._ask(active_requests, inflight_request_ids, now)

    def _ask(self, active_requests: list[Any], inflight_request_ids: Any, now: float) -> Any:
        states = self.engine.states
        self._report_gone(active_requests, now)
        running: dict[str, Any] = {}
        waiting: dict[str, Any] = {}
        unviewed: list[Any] = []
        views: dict[str, RequestView] = {}
        for req in active_requests:
            if req.is_dummy or not (states.is_started(req) or states.is_waiting(req)):
                unviewed.append(req)
                continue
            rid = str(req.py_request_id)
            views[rid] = self._view(req, rid, now)
            (running if states.is_started(req) else waiting)[rid] = req
        state = self._views.stamp(self._state(now, views, running, waiting))
        decision = self.hook.superinfer_schedule(state=state)
        if decision is None:
            raise PolicyError("no plugin answered superinfer_schedule")
        check_decision(state, decision)
        self.counters.num_calls += 1
        for rid, tier in decision.tiers.items():
            self._tracked[int(rid)].tier = tier
        plan = plan_step(decision, running, waiting, unviewed)
        for req, reason in plan.rejected:
            self._reject(req, reason, now)
        output = merge_output(
            self.inner.schedule_request(list(plan.ordered), inflight_request_ids), plan
        )
        self._record(output, decision.admit, plan, now, len(waiting))
        decode_only = not (decision.admit or decision.preempt or decision.reject) and all(
            n == 1 and views[rid].pending_tokens == 1 for rid, n in decision.num_tokens.items()
        )
        if decision.max_repeat_steps > 1 and decode_only and not output.paused_requests:
            active = tuple((r.py_request_id, states.is_started(r)) for r in active_requests)
            self._repeat = _Repeat(decision.max_repeat_steps - 1, active, plan, len(waiting))
        return output

    def _replay(self, repeat: _Repeat, inflight_request_ids: Any, now: float) -> Any:
        repeat.steps_left -= 1
        self.counters.num_repeated += 1
        output = merge_output(
            self.inner.schedule_request(list(repeat.plan.ordered), inflight_request_ids),
            repeat.plan,
        )
        self._record(output, (), repeat.plan, now, repeat.num_waiting)
        if output.paused_requests:  # KV ran short: ask again next step
            self._repeat = None
        return output

    def _can_repeat(self, repeat: _Repeat, active: list[Any]) -> bool:
        """Same requests, same order, none started or stopped since, the started ones decoding."""
        if repeat.steps_left <= 0 or len(active) != len(repeat.active):
            return False
        states = self.engine.states
        for req, (rid, started) in zip(active, repeat.active, strict=True):
            if req.py_request_id != rid or states.is_started(req) != started:
                return False
            if started and req.state != states.generation_in_progress:
                return False
        return True

    def observer(self) -> LifecycleObserver:
        """A resource manager reporting this scheduler's steps and finishes (see the class)."""
        return LifecycleObserver(self)

    # -- views ----------------------------------------------------------------------------------

    def _view(self, req: Any, rid: str, now: float) -> RequestView:
        tracked = self._tracked.get(req.py_request_id)
        if tracked is None:
            tracked = self._track(req, now)
            self.hook.superinfer_request_arrived(
                request=self._make_view(req, rid, tracked), now_s=now
            )
        elif not tracked.slo_known:
            entry = self.slo_table.lookup(req.py_client_id)
            if entry is not None:
                tracked.slo, tracked.slo_known = entry.slo, True
        if tracked.first_token_s is None and req.get_num_tokens(0) > req.orig_prompt_len:
            tracked.first_token_s = now
        return self._make_view(req, rid, tracked)

    def _track(self, req: Any, now: float) -> _Tracked:
        entry = self.slo_table.lookup(req.py_client_id)
        slo = entry.slo if entry else self.default_slo
        arrival = entry.arrival_s if entry and entry.arrival_s is not None else now
        tracked = _Tracked(req, slo, arrival, slo_known=entry is not None)
        self._tracked[req.py_request_id] = tracked
        return tracked

    def _make_view(self, req: Any, rid: str, t: _Tracked) -> RequestView:
        return llm_request_view(
            req,
            request_id=rid,
            states=self.engine.states,
            slo=t.slo,
            arrival_s=t.arrival_s,
            tokens_per_block=self.limits.tokens_per_block,
            reserve_to_completion=self.limits.reserve_to_completion,
            tier=t.tier,
            first_token_s=t.first_token_s,
            num_preemptions=t.num_preemptions,
        )

    def _state(
        self,
        now: float,
        views: dict[str, RequestView],
        running: dict[str, Any],
        waiting: dict[str, Any],
    ) -> StepState:
        kv, lim = self.kv_cache_manager, self.limits
        free = kv.get_num_free_blocks()
        if lim.reserve_to_completion:
            states, tpb = self.engine.states, lim.tokens_per_block
            free -= sum(
                reserved_blocks(r, tpb) - allocated_blocks(r, states, tpb) for r in running.values()
            )
        return StepState(
            now_s=now,
            step_index=self.counters.num_calls,
            waiting=tuple(views[rid] for rid in waiting),
            running=tuple(views[rid] for rid in running),
            swapped=(),
            free_hbm_blocks=max(0, free),
            total_hbm_blocks=kv.get_max_resource_count(),
            free_cpu_blocks=0,
            total_cpu_blocks=0,
            block_size_tokens=lim.tokens_per_block,
            token_budget=lim.max_num_tokens,
            max_num_seqs=lim.max_batch_size,
        )

    # -- lifecycle reports ----------------------------------------------------------------------

    def _report_gone(self, active: list[Any], now: float) -> None:
        """Requests that left the active list without being freed through the observer."""
        present = {r.py_request_id for r in active}
        for rid in [rid for rid in self._tracked if rid not in present]:
            self._end(self._tracked[rid].req, now)

    def _end(self, req: Any, now: float) -> None:
        t = self._tracked.pop(req.py_request_id)
        if t.rejected:
            return
        view = self._make_view(req, str(req.py_request_id), t)
        if req.state == self.engine.states.generation_complete:
            self.hook.superinfer_request_finished(request=view, now_s=now)
        else:
            self.hook.superinfer_request_aborted(
                request=view, now_s=now, reason="removed_by_engine"
            )

    def on_step_done(self, batch: Any) -> None:
        """The executor updated resources after the step it scheduled last: report the step."""
        last = self._last
        if last is None:
            return
        self._last = None
        now = self.clock()
        done = self.engine.states.generation_complete
        kv = self.kv_cache_manager
        total = kv.get_max_resource_count()
        finished = tuple(
            str(r.py_request_id)
            for r in list(batch.context_requests) + list(batch.generation_requests)
            if r.state == done and r.py_request_id in self._tracked
        )
        self.hook.superinfer_step_finished(
            stats=StepStats(
                now_s=now,
                step_index=self.counters.num_calls,
                duration_s=now - last.now_s,
                num_steps=1,
                num_prefill_tokens=last.num_prefill_tokens,
                num_decode_tokens=last.num_decode_tokens,
                num_running=last.num_running,
                num_waiting=last.num_waiting,
                used_hbm_blocks=total - kv.get_num_free_blocks(),
                total_hbm_blocks=total,
                finished_ids=finished,
            )
        )

    def on_free(self, request: Any) -> None:
        """The executor freed a request's resources: it finished, was cancelled or paused."""
        if request.py_request_id in self._tracked and request.state == (
            self.engine.states.generation_complete
        ):
            self._end(request, self.clock())

    def _reject(self, req: Any, reason: str, now: float) -> None:
        tracked = self._tracked[req.py_request_id]
        tracked.rejected = True
        view = self._make_view(req, str(req.py_request_id), tracked)
        # NOTE: a finished request is answered and dropped by the executor's response handling,
        # like a cancelled one ([verify] on 1.2.1 that a never-scheduled request is answered).
        req.finish_by(self.engine.finish_reason.CANCELLED, 0)
        self.counters.num_rejected += 1
        self.hook.superinfer_request_aborted(request=view, now_s=now, reason=reason)

    def _record(
        self, output: Any, admitted: tuple[str, ...], plan: Any, now: float, num_waiting: int
    ) -> None:
        ran = {r.py_request_id for r in output.context_requests}
        ran |= {r.py_request_id for r in output.generation_requests}
        self.counters.num_admitted_not_fitted += sum(1 for rid in admitted if int(rid) not in ran)
        self.counters.num_preempted += len(plan.preempted)
        if self.record_admissions:
            self.counters.admitted.append((self.counters.num_calls, admitted))
        for req in output.paused_requests:
            tracked = self._tracked.get(req.py_request_id)
            if tracked is not None:
                tracked.num_preemptions += 1
        self._last = _LastStep(
            now_s=now,
            num_prefill_tokens=sum(r.context_chunk_size for r in output.context_requests),
            num_decode_tokens=len(output.generation_requests),
            num_running=len(output.context_requests) + len(output.generation_requests),
            num_waiting=num_waiting,
        )


class LifecycleObserver:
    """A resource manager that only listens: the executor calls it every step and every free.

    Added to the executor's ``ResourceManager`` next to the KV cache manager (engine notes §3.2,
    "KV observer"): ``update_resources`` follows each step the scheduler planned, which is when
    ``superinfer_step_finished`` fires with that step's duration; ``free_resources`` follows each
    finished, cancelled or paused request, which is when ``superinfer_request_finished`` fires, so
    no finish waits for the next scheduling point. It holds no resources.
    """

    def __init__(self, scheduler: SuperinferScheduler) -> None:
        self.scheduler = scheduler

    def get_max_resource_count(self) -> int:
        return 0

    def get_needed_resource_to_completion(self, request: Any) -> int:
        return 0

    def add_dummy_requests(self, *args: Any, **kwargs: Any) -> None:
        return None

    def prepare_resources(self, scheduled_batch: Any) -> None:
        return None

    def update_resources(self, scheduled_batch: Any, *args: Any, **kwargs: Any) -> None:
        self.scheduler.on_step_done(scheduled_batch)

    def free_resources(self, request: Any, *args: Any, **kwargs: Any) -> None:
        self.scheduler.on_free(request)

    def shutdown(self) -> None:
        return None
