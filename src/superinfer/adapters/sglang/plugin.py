"""The SGLang plugin: entry point ``superinfer`` in group ``sglang.srt.plugins``.

SGLang calls :func:`register` in every process that runs ``load_plugins()``, the scheduler
subprocesses included (``managers/scheduler.py::run_scheduler_process``). It does nothing unless
``SUPERINFER_SGLANG=1``; then it builds our pluggy manager from the configuration
(:mod:`.config`) and registers these ``HookRegistry`` hooks:

==============================================  =======  ==========================================
target (sglang 0.5.23)                          type     what the adapter does
==============================================  =======  ==========================================
``Scheduler.__init__``                          AFTER    bind limits, KV pool, aborts
``Scheduler._add_request_to_queue``             AROUND   arrival: SLO, rank -> priority
``SchedulePolicy.calc_priority``                AROUND   ``superinfer_schedule``: order, tiers,
                                                         rejects, precision plan
``PrefillAdder.add_one_req``                    AROUND   admit only what the policy admitted
``PrefillAdder.preempt_to_schedule``            REPLACE  the policy's victims
``ScheduleBatch.retract_decode``                AROUND   ask the policy at a KV shortage
``ScheduleBatch._get_decode_retraction_order``  REPLACE  its order
``Scheduler.process_batch_result``              AFTER    clock, first tokens, finishes,
                                                         ``superinfer_step_finished``, stats file
``Scheduler.run_batch``                         AROUND   step wall time (stats file only)
``Scheduler.send_abort_output``                 AFTER    aborts
``UnifiedRadixCache._evict``                    AROUND   ``superinfer_kv_placement``
``UnifiedRadixCache.checkpoint_into_tree``,     AROUND   insert priority from the rank
``...advance_unpublished_req``
==============================================  =======  ==========================================

plus the eviction policy ``superinfer`` (:class:`.apply.SuperinferEvictionStrategy`).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from superinfer.adapters.hookspecs import policy_counters, wants_prompt_keys
from superinfer.adapters.manager import UnknownPolicyError, build_plugin_manager
from superinfer.adapters.sglang.config import ENV_SWITCH, AdapterConfig, ConfigError, load_config
from superinfer.adapters.sglang.prefix_view import prefix_node_views
from superinfer.adapters.sglang.stats import Telemetry, kv_usage
from superinfer.adapters.sglang.view import (
    EngineLimits,
    RequestRecord,
    SLOFieldError,
    ViewTracker,
    chunked_request,
    clock_for,
    kv_pool_blocks,
    new_token_ratio,
    request_view,
    reserved_blocks,
    resolve_slo,
    step_state,
)
from superinfer.policy_core.types import (
    KVPrecision,
    PlacementDecision,
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)
from superinfer.policy_core.validation import PolicyError, check_decision

__all__ = [
    "HOOKS",
    "AdapterStats",
    "EnginePort",
    "SGLangAdapter",
    "current_adapter",
    "install",
    "register",
]

logger = logging.getLogger("superinfer.sglang")

_M = "sglang.srt.managers"
_SCHED = f"{_M}.scheduler.Scheduler"
_POLICY = f"{_M}.schedule_policy.SchedulePolicy"
_ADDER = f"{_M}.schedule_policy.PrefillAdder"
_BATCH = f"{_M}.schedule_batch.ScheduleBatch"
_CACHE = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache"

_ADAPTER: SGLangAdapter | None = None


def current_adapter() -> SGLangAdapter | None:
    """The adapter installed in this process, if any."""
    return _ADAPTER


class EnginePort(Protocol):
    """What the adapter asks of the scheduler it runs in (a ``Scheduler``, or a test double)."""

    def abort(self, req: Any, message: str, status_code: int) -> None:
        """End ``req`` (not in the waiting queue any more) with an abort the client receives."""
        ...


@dataclass(slots=True)
class AdapterStats:
    """Counters of what the adapter did in this scheduler process.

    Attributes:
        decisions: ``superinfer_schedule`` answers applied.
        invalid_decisions: answers refused by ``check_decision`` (SGLang's order kept that pass).
        rejected: requests the policy rejected.
        bad_slo: requests refused for unusable SLO fields (HTTP 400).
        preempted: running requests preempted for the policy.
        retraction_points: KV shortages at which the policy ordered the decode batch.
        placements: ``superinfer_kv_placement`` answers applied.
        precision_plans: planned KV precision -> requests (plan-only on SGLang).
    """

    decisions: int = 0
    invalid_decisions: int = 0
    rejected: int = 0
    bad_slo: int = 0
    preempted: int = 0
    retraction_points: int = 0
    placements: int = 0
    precision_plans: Counter[str] = field(default_factory=Counter)


class SGLangAdapter:
    """One scheduler process's bridge between SGLang and the ``superinfer_*`` hooks.

    Args:
        config: the adapter's configuration.
        hook: the plugin manager's hook relay.
        limits: SGLang settings; replaced from the ``Scheduler`` when it starts.
        engine: where aborts go; the ``Scheduler`` when it starts.
    """

    def __init__(
        self,
        config: AdapterConfig,
        hook: Any,
        limits: EngineLimits | None = None,
        engine: EnginePort | None = None,
    ) -> None:
        from superinfer.adapters.sglang.apply import PlacementBook
        from superinfer.adapters.sglang.prefill_bank import PrefillBank

        self.config, self.hook = config, hook
        self._keys = wants_prompt_keys(hook)  # hash prompts for a reader (`adaptive`, `hazard`)
        self.limits, self.engine = limits or EngineLimits(), engine
        self.clock = clock_for(config)  # logical until a scheduler says how many ranks decide
        self.records: dict[str, RequestRecord] = {}
        self.stats = AdapterStats()
        self.book = PlacementBook(config.pin_budget_fraction)
        self.decision: ScheduleDecision | None = None  # of the prefill pass in progress
        self.bank = PrefillBank()  # its admissions SGLang may start (.prefill_bank)
        self._kv: tuple[Any, Any] | None = None  # (allocator, tree cache) once bound
        self._retracting: Any = None  # the batch inside retract_decode
        self._node_seen: dict[int, tuple[float, float, int, int, tuple[str, ...]]] = {}
        self._seq, self._views = 0, ViewTracker()  # record numbers; full states' change sets
        labels = {"policy": config.policy, "kv_policy": config.kv_policy}
        self.telemetry = Telemetry.from_env(labels, policy_stats=lambda: policy_counters(hook))

    # -- binding --------------------------------------------------------------------------------

    def bind(self, allocator: Any, tree_cache: Any, limits: EngineLimits | None = None) -> None:
        """Attach to a KV pool and radix cache (what ``Scheduler.__init__`` does)."""
        self._kv = (allocator, tree_cache)
        if limits is not None:
            self.limits = limits

    def on_scheduler_init(self, _result: Any, scheduler: Any, *_: Any, **__: Any) -> None:
        """AFTER ``Scheduler.__init__``: read the settings the views report; pick the clock
        (:func:`.view.clock_for`: wall when this scheduler decides alone, for ``auto``)."""
        self.clock = clock_for(self.config, scheduler)
        from superinfer.adapters.sglang.apply import SchedulerPort

        self.engine = SchedulerPort(scheduler)
        self.bind(
            scheduler.token_to_kv_pool_allocator,
            scheduler.tree_cache,
            EngineLimits(
                page_size=scheduler.page_size,
                max_prefill_tokens=scheduler.max_prefill_tokens,
                max_running_requests=scheduler.max_running_requests,
                priority_scheduling=scheduler.enable_priority_scheduling,
                low_priority_values_first=scheduler.schedule_low_priority_values_first,
                kv_cache_dtype=str(getattr(scheduler.server_args, "kv_cache_dtype", "auto")),
                mixed_chunk=bool(getattr(scheduler, "is_mixed_chunk", False)),
            ),
        )
        if not scheduler.enable_priority_scheduling:
            logger.warning(
                "superinfer: --enable-priority-scheduling is off: the policy orders and admits, "
                "but SGLang never asks it for preemption victims"
            )

    # -- views ----------------------------------------------------------------------------------

    def _record(self, req: Any) -> RequestRecord:
        rec = self.records.get(req.rid)
        if rec is None:  # a request queued before the adapter saw it arrive (e.g. in tests)
            rec = self._admit_record(req, resolve_slo(req, self.config))
        return rec

    def _admit_record(self, req: Any, slo: Any) -> RequestRecord:
        self._seq += 1
        rec = RequestRecord(seq=self._seq, arrival_s=self.clock.now_s, slo=slo)
        self.records[req.rid] = rec
        return rec

    def view(self, req: Any, *, running: bool, chunked: bool = False) -> RequestView:
        """The policy's view of ``req`` (``chunked``: SGLang's chunked request)."""
        rec, page = self._record(req), self.limits.page_size
        return request_view(req, rec, running=running, page_size=page, chunked=chunked)

    def state(
        self,
        waiting: Sequence[Any],
        running: Sequence[Any],
        pool: tuple[Any, Any] | None = None,
        chunked: Any = None,
    ) -> StepState:
        """A ``StepState`` of ``waiting`` and ``running`` ``Req``s over the bound KV pool;
        ``chunked`` (SGLang's chunked request between its chunks: it holds a seat and KV, and
        its next chunk runs first) is listed last among the running ones."""
        allocator, tree_cache = pool or self._pool()
        page = self.limits.page_size
        free, total = kv_pool_blocks(allocator, tree_cache, page)
        views = [self.view(r, running=True) for r in running]
        if chunked is not None:
            views.append(self.view(chunked, running=True, chunked=True))
        ratio = new_token_ratio(getattr(self.engine, "scheduler", None))
        waiting_views = [self.view(r, running=False) for r in waiting]
        reserved = reserved_blocks(running, chunked, ratio, page)
        return step_state(clock=self.clock, waiting=waiting_views, running=views, free_blocks=free,
                          total_blocks=total, limits=self.limits, reserved=reserved)  # fmt: skip

    def _pool(self) -> tuple[Any, Any]:
        if self._kv is None:
            raise RuntimeError("superinfer: the adapter is not bound to a KV pool")
        return self._kv

    def _set_tier(self, req: Any, tier: int) -> None:
        from superinfer.adapters.sglang.apply import sglang_priority

        self._record(req).tier = tier
        if self.limits.priority_scheduling:
            req.priority = sglang_priority(
                tier, low_values_first=self.limits.low_priority_values_first
            )

    # -- request lifecycle ----------------------------------------------------------------------

    def add_request_to_queue(
        self, original: Callable[..., Any], scheduler: Any, req: Any, *a: Any, **k: Any
    ) -> Any:
        """AROUND ``Scheduler._add_request_to_queue``: a new request gets its SLO, its rank as
        SGLang priority, and ``superinfer_request_arrived``; a re-queued one passes through."""
        from superinfer.adapters.sglang.apply import sglang_priority

        if req.rid not in self.records:
            try:
                slo = resolve_slo(req, self.config)
            except SLOFieldError as exc:
                self.stats.bad_slo += 1
                if self.engine is not None:
                    self.engine.abort(req, str(exc), 400)
                self.telemetry.publish(self.stats, force=True)
                return None
            rec = self._admit_record(req, slo)
            if self.limits.priority_scheduling:
                req.priority = sglang_priority(
                    rec.rank, low_values_first=self.limits.low_priority_values_first
                )
            view = request_view(req, rec, running=False, page_size=self.limits.page_size,
                                keys=self._keys)  # fmt: skip
            self.hook.superinfer_request_arrived(request=view, now_s=self.clock.now_s)
        return original(scheduler, req, *a, **k)

    def _end(self, req: Any, reason: str | None) -> None:
        rec = self.records.pop(req.rid, None)
        if rec is None or rec.ended:
            return
        rec.ended = True
        view = request_view(req, rec, running=False, page_size=self.limits.page_size)
        if reason is None:
            self.hook.superinfer_request_finished(request=view, now_s=self.clock.now_s)
        else:
            self.hook.superinfer_request_aborted(
                request=view, now_s=self.clock.now_s, reason=reason
            )

    def on_abort_output(self, _result: Any, _scheduler: Any, abort_req: Any, req: Any) -> None:
        """AFTER ``Scheduler.send_abort_output``: a request ended outside the output stream."""
        reason = (abort_req.finished_reason or {}).get("message") or "aborted"
        self._end(req, reason)

    def on_batch_result(self, _result: Any, scheduler: Any, batch: Any, *_: Any) -> None:
        """AFTER ``Scheduler.process_batch_result``: advance the clock, note first tokens and
        finishes, report ``superinfer_step_finished``."""
        mode = batch.forward_mode
        if not (mode.is_decode() or mode.is_extend()):
            return  # idle and prebuilt passes run no tokens
        reqs, decode = list(batch.reqs), mode.is_decode()
        prefill_tokens = 0 if decode else int(batch.extend_num_tokens or 0)
        decode_tokens = len(reqs) if decode else 0
        duration_s = self.clock.advance(prefill_tokens + decode_tokens, self.telemetry.step.last_s)
        finished = []
        for req in reqs:
            rec = self.records.get(req.rid)
            if rec is None:
                continue
            if rec.first_token_s is None and len(req.output_ids):
                rec.first_token_s = self.clock.now_s
            if req.finished():
                reason = req.finished_reason.to_json()
                aborted = reason.get("type") == "abort"
                self._end(req, (reason.get("message") or "aborted") if aborted else None)
                finished.append(req.rid)
        allocator = scheduler.token_to_kv_pool_allocator
        total = allocator.size // self.limits.page_size
        self.hook.superinfer_step_finished(
            stats=StepStats(
                now_s=self.clock.now_s,
                step_index=self.clock.step_index,
                duration_s=duration_s,
                num_steps=1,
                num_prefill_tokens=prefill_tokens,
                num_decode_tokens=decode_tokens,
                num_running=len(reqs),
                num_waiting=len(scheduler.waiting_queue),
                used_hbm_blocks=total - allocator.available_size() // self.limits.page_size,
                total_hbm_blocks=total,
                finished_ids=tuple(finished),
            )
        )
        idle = not scheduler.waiting_queue and all(r.finished() for r in reqs)
        kv = kv_usage(*self._pool())
        self.telemetry.publish(self.stats, force=idle, kv=kv, pins=len(self.book.pins))

    def run_batch(self, original: Callable[..., Any], scheduler: Any, *a: Any, **k: Any) -> Any:
        """AROUND ``Scheduler.run_batch``: the step's wall time, for the stats file only."""
        start = time.perf_counter()
        try:
            return original(scheduler, *a, **k)
        finally:
            self.telemetry.step.add(time.perf_counter() - start)

    # -- scheduling -----------------------------------------------------------------------------

    def _decide(self, state: StepState) -> ScheduleDecision | None:
        start = time.perf_counter()  # measured, never decided on (decisions use self.clock)
        decision: ScheduleDecision | None = self.hook.superinfer_schedule(state=state)
        self.telemetry.policy.add(time.perf_counter() - start)
        if decision is None:
            return None
        try:
            check_decision(state, decision)
        except PolicyError as exc:
            self.stats.invalid_decisions += 1
            logger.error("superinfer: invalid decision at step %d: %s", state.step_index, exc)
            return None
        self.stats.decisions += 1
        return decision

    def calc_priority(
        self,
        original: Callable[..., Any],
        policy: Any,
        waiting_queue: list[Any],
        running_batch: Any = None,
        *a: Any,
        **k: Any,
    ) -> None:
        """AROUND ``SchedulePolicy.calc_priority``: SGLang's pass first (its prefix matches),
        then the policy's decision replaces the order."""
        from superinfer.adapters.sglang.apply import order_waiting_queue

        original(policy, waiting_queue, running_batch, *a, **k)
        running = [r for r in (running_batch.reqs if running_batch else []) if not r.finished()]
        pool = self._kv or (policy.tree_cache.token_to_kv_pool_allocator, policy.tree_cache)
        chunked = chunked_request(getattr(self.engine, "scheduler", None), waiting_queue, running)
        state = self._views.stamp(self.state(waiting_queue, running, pool, chunked))
        self.decision = decision = self._decide(state)
        if decision is None:
            return
        held = [*waiting_queue, *running, *([chunked] if chunked is not None else [])]
        by_id = {r.rid: r for r in held}  # the chunked request: its tier (never a victim)
        for rid, tier in decision.tiers.items():
            if rid in by_id:
                self._set_tier(by_id[rid], tier)
        for rid, reason in decision.reject.items():
            req = by_id[rid]
            waiting_queue.remove(req)
            self.stats.rejected += 1
            if self.engine is not None:
                self.engine.abort(req, f"rejected by superinfer policy: {reason}", 503)
            self._end(req, reason)
        order_waiting_queue(waiting_queue, decision, self.records)
        self.bank.update(decision, state, self.limits.max_prefill_tokens, queue=waiting_queue)
        self._plan_precision(decision, state)

    def _plan_precision(self, decision: ScheduleDecision, state: StepState) -> None:
        """Ask ``superinfer_kv_precision`` for each admission and log it: SGLang stores every
        request's KV in the engine's one ``--kv-cache-dtype`` (plan-only, docs/adapters.md)."""
        views = {v.request_id: v for v in state.waiting}
        for rid in decision.admit:
            rec = self.records[rid]
            if rec.precision_planned:
                continue
            rec.precision_planned = True
            plan: KVPrecision | None = self.hook.superinfer_kv_precision(
                request=views[rid], state=state
            )
            if plan is not None:
                self.stats.precision_plans[plan.value] += 1
                logger.info(
                    "superinfer: kv precision plan rid=%s class=%s plan=%s (not applied: engine "
                    "kv dtype %s)",
                    rid,
                    rec.slo.name,
                    plan.value,
                    self.limits.kv_cache_dtype,
                )

    def add_one_req(
        self, original: Callable[..., Any], adder: Any, req: Any, *a: Any, **k: Any
    ) -> Any:
        """AROUND ``PrefillAdder.add_one_req``: a request the policy did not admit this pass, or
        whose banked allotments do not yet cover its prefill (:mod:`.prefill_bank`), ends the pass
        (``AddReqResult.OTHER``); SGLang's own budget may still refuse one it did."""
        from sglang.srt.managers.schedule_policy import AddReqResult

        if self.decision is not None and req.rid not in self.bank.ready:
            return AddReqResult.OTHER
        return original(adder, req, *a, **k)

    def preempt_to_schedule(self, adder: Any, req: Any) -> bool:
        """REPLACE ``PrefillAdder.preempt_to_schedule``: when the running batch is full, preempt
        the running requests the decision preempts, if it admits ``req`` (not the chunked one)."""
        from superinfer.adapters.sglang.apply import release_victims

        decision = self.decision
        if decision is None or req.rid not in decision.admit or not decision.preempt:
            return False
        victims = [
            r
            for r in adder.running_batch.reqs
            if r.rid in decision.preempt and r not in adder.preempt_list and not r.finished()
        ]
        if not victims:
            return False
        release_victims(adder, victims)
        self.stats.preempted += len(victims)
        return True

    def retract_decode(self, original: Callable[..., Any], batch: Any, *a: Any, **k: Any) -> Any:
        """AROUND ``ScheduleBatch.retract_decode``: remember the batch for the order hook."""
        self._retracting = batch
        try:
            return original(batch, *a, **k)
        finally:
            self._retracting = None

    def decode_retraction_order(self, reqs: Sequence[Any]) -> list[int]:
        """REPLACE ``ScheduleBatch._get_decode_retraction_order``: a scheduling point with only
        the decode batch and the KV actually free; the policy's victims are retracted first."""
        from superinfer.adapters.sglang.apply import retraction_order

        batch = self._retracting
        pool = (batch.token_to_kv_pool_allocator, batch.tree_cache) if batch else None
        state = self.state([], reqs, pool)
        decision = self._decide(state)
        self.stats.retraction_points += 1
        if decision is None:
            return list(range(len(reqs)))
        by_id = {r.rid: r for r in reqs}
        for rid, tier in decision.tiers.items():
            if rid in by_id:
                self._set_tier(by_id[rid], tier)
        return retraction_order(reqs, decision)

    # -- radix cache ----------------------------------------------------------------------------

    def place(self, cache: Any, needed_tokens: int = 0) -> None:
        """Ask ``superinfer_kv_placement`` about a Python-core cache's nodes, ``needed_tokens``
        (those SGLang is about to evict) as ``needed_hbm_blocks``, and carry out the answer (pins,
        bands: its victims are ``DROP``, evicted first within their priority; offloads)."""
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

        if not self.hook.superinfer_kv_placement.get_hookimpls():
            return
        views = prefix_node_views(
            cache.tree_core.root_node,
            now_s=self.clock.now_s,
            page_size=self.limits.page_size,
            pinned=self.book.pins,
            last_seen=self._node_seen,
            full=ComponentType.FULL,
        )
        allocator, page = cache.token_to_kv_pool_allocator, self.limits.page_size
        start = time.perf_counter()  # measured, never decided on
        decision: PlacementDecision | None = self.hook.superinfer_kv_placement(
            nodes=views, now_s=self.clock.now_s, free_hbm_blocks=allocator.available_size() // page,
            free_cpu_blocks=0, needed_hbm_blocks=-(-needed_tokens // page),
            total_hbm_blocks=allocator.size // page,
        )  # fmt: skip
        self.telemetry.placement.add(time.perf_counter() - start)
        if decision is not None:
            self.book.apply(cache, decision, views)
            self.stats.placements += 1

    def evict(self, original: Callable[..., Any], cache: Any, *a: Any, **k: Any) -> Any:
        """AROUND ``UnifiedRadixCache._evict(params, ...)``: placement first, on the Python tree
        core, asked to free ``params.num_tokens`` (until 2026-12-06 it was asked for none, so only
        pins reached the cache); the Rust core orders by insert priority only."""
        from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

        if isinstance(cache.tree_core, UnifiedTreeCore):
            params = a[0] if a else k.get("params")
            self.place(cache, int(getattr(params, "num_tokens", 0) or 0))
        return original(cache, *a, **k)

    def insert_with_rank(
        self, original: Callable[..., Any], cache: Any, req: Any, *a: Any, **k: Any
    ) -> Any:
        """AROUND ``UnifiedRadixCache.checkpoint_into_tree`` / ``advance_unpublished_req``: the
        request's KV enters the tree with :func:`.apply.eviction_priority` of its rank (SGLang
        passes ``req.priority``, whose direction follows the scheduling flag, not eviction)."""
        from superinfer.adapters.sglang.apply import eviction_priority

        rec = self.records.get(req.rid)
        if rec is None:
            return original(cache, req, *a, **k)
        saved = req.priority
        req.priority = eviction_priority(rec.rank)
        try:
            return original(cache, req, *a, **k)
        finally:
            req.priority = saved


#: (target, hook type, adapter method) of every hook :func:`install` registers (sglang 0.5.23).
HOOKS: tuple[tuple[str, str, str], ...] = (
    (f"{_SCHED}.__init__", "AFTER", "on_scheduler_init"),
    (f"{_SCHED}._add_request_to_queue", "AROUND", "add_request_to_queue"),
    (f"{_SCHED}.process_batch_result", "AFTER", "on_batch_result"),
    (f"{_SCHED}.run_batch", "AROUND", "run_batch"),
    (f"{_SCHED}.send_abort_output", "AFTER", "on_abort_output"),
    (f"{_POLICY}.calc_priority", "AROUND", "calc_priority"),
    (f"{_ADDER}.add_one_req", "AROUND", "add_one_req"),
    (f"{_ADDER}.preempt_to_schedule", "REPLACE", "preempt_to_schedule"),
    (f"{_BATCH}.retract_decode", "AROUND", "retract_decode"),
    (f"{_BATCH}._get_decode_retraction_order", "REPLACE", "decode_retraction_order"),
    (f"{_CACHE}._evict", "AROUND", "evict"),
    (f"{_CACHE}.checkpoint_into_tree", "AROUND", "insert_with_rank"),
    (f"{_CACHE}.advance_unpublished_req", "AROUND", "insert_with_rank"),
)


def register_eviction_policy(book: Callable[[], Any]) -> None:
    """Make ``--radix-eviction-policy superinfer`` known to SGLang (:mod:`.apply`)."""
    from superinfer.adapters.sglang.apply import register_eviction_policy as register_in_sglang

    register_in_sglang(book)


def install(adapter: SGLangAdapter) -> None:
    """Register ``adapter``'s hooks with SGLang's ``HookRegistry`` (applied by ``load_plugins``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    global _ADAPTER
    _ADAPTER = adapter
    register_eviction_policy(lambda: _ADAPTER.book if _ADAPTER is not None else None)
    for target, kind, method in HOOKS:
        HookRegistry.register(target, getattr(adapter, method), HookType[kind])


def register() -> None:
    """Entry point (``sglang.srt.plugins``): inert unless ``SUPERINFER_SGLANG=1``.

    Raises:
        SystemExit: the configuration is unusable or names an unregistered policy; the one-line
            message names the file and field.
    """
    if os.environ.get(ENV_SWITCH) != "1":
        return
    try:
        config = load_config()
        pm = build_plugin_manager(config.policy, config.policy_options, kv_policy=config.kv_policy)
    except (ConfigError, UnknownPolicyError) as exc:
        # SystemExit passes through load_plugins' `except Exception`: a server asked to run the
        # policy must not start without it.
        raise SystemExit(f"superinfer: {exc}") from None
    install(SGLangAdapter(config, pm.hook))
    msg = "superinfer: policy %s (kv policy %s) installed in pid %d"
    logger.info(msg, config.policy, config.kv_policy, os.getpid())
