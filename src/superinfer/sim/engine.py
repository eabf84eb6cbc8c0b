"""Discrete-event simulator: replicas of one engine profile, each a continuous-batching loop.

One heap of events drives every replica. Events at the same instant run in a fixed order:
step ends, then arrivals, then scheduling points, then by insertion sequence, so a request that
arrives exactly when a step ends is visible to the next scheduling decision. Nothing in here
decides: at every scheduling point the replica asks the plugins (``superinfer_schedule``),
checks the answer (``check_decision``) and applies it.

KV memory per replica: HBM pages (the profile's page size, FP16) shared by running requests and
the prefix cache; CPU memory (the profile's CPU tier) for swapped requests and offloaded prefix
blocks; a copy engine between them (``kv.Link``) that overlaps with compute. Swap-outs free their
HBM pages when their copy ends; a step that needs those pages, or runs a request whose KV is still
being copied in, starts when the copies are done.

A decode-only decision may allow the engine to repeat it (``ScheduleDecision.max_repeat_steps``,
vLLM's multi-step scheduling). The engine then runs ``k`` steps as one event, ``k`` bounded by
the first finish and by the free KV blocks; an arrival during the run cuts it at the end of the
step in flight. Decode step time is linear in the KV tokens read (``decode_coefficients``), so
``k`` steps take ``k a + b (k C0 + B k (k - 1) / 2)`` for ``B`` sequences reading ``C0`` KV tokens
in the first step.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from superinfer.adapters.hookspecs import wants_prompt_keys
from superinfer.policy_core.batching import blocks_for_tokens
from superinfer.policy_core.types import (
    AdmissionRule,
    KVLocation,
    KVPrecision,
    PreemptMode,
    ScheduleDecision,
    StepState,
    StepStats,
)
from superinfer.policy_core.validation import PolicyError, check_decision
from superinfer.sim.config import (
    SimConfig,
    SimResult,
    StepTimeModel,
    dtype_bytes,
    kv_capacity_blocks,
)
from superinfer.sim.engine_costs import engine_step_time
from superinfer.sim.kv_movement import KVMovement
from superinfer.sim.replica import Replica
from superinfer.sim.request import RequestSpec, RequestStatus, SimRequest
from superinfer.sim.routers import ROUTERS, make_router
from superinfer.sim.steps import build_run, cut_run, emit

# ``SimConfig``, ``SimResult``, ``StepTimeModel``, ``kv_capacity_blocks`` (sim.config),
# ``Replica`` (sim.replica) and ``ROUTERS`` (sim.routers) are re-exported: import them from
# their own modules.
__all__ = [
    "ROUTERS",
    "Replica",
    "SimConfig",
    "SimResult",
    "Simulator",
    "StepTimeModel",
    "kv_capacity_blocks",
]

# Event kinds, in the order they run at equal times.
_STEP_END, _ARRIVAL, _SCHEDULE = 0, 1, 2

#: Scheduling points in a row that may run nothing yet change the queues before the replica
#: waits for the next event.
MAX_IDLE_ROUNDS = 8


class Simulator:
    """Runs a workload through replicas of one engine, with decisions from the plugins.

    Args:
        config: engine, model, hardware and cluster size.
        hook: the plugin manager's hook relay (``PluginManager.hook``). The engine calls
            ``superinfer_schedule``, ``superinfer_kv_placement``, ``superinfer_request_arrived``,
            ``superinfer_request_finished``, ``superinfer_request_aborted`` and
            ``superinfer_step_finished`` on it.
        step_time: step-time model; by default the calibrated kernels with the engine's own
            costs (``sim.engine_costs.engine_step_time``).

    Raises:
        ValueError: unknown router, or the model leaves no KV memory.
    """

    def __init__(self, config: SimConfig, hook: Any, step_time: StepTimeModel | None = None
                 ) -> None:  # fmt: skip
        if config.router not in ROUTERS:
            raise ValueError(f"unknown router {config.router!r}; known: {', '.join(ROUTERS)}")
        self.config = config
        self.hook = hook
        self.step_time = step_time or engine_step_time(config)
        profile = config.profile
        self.num_blocks = config.num_gpu_blocks_override or kv_capacity_blocks(
            profile, config.model, config.gpu, config.tp, config.weight_dtype, config.kv_dtype
        )
        ratio = profile.cpu_kv_ratio if config.cpu_kv_ratio is None else config.cpu_kv_ratio
        link = config.host_link_bytes_s or config.gpu.host_link_bytes_s
        budget, max_seqs = profile.limits(config.gpu)
        kv_bytes = dtype_bytes(config.kv_dtype)
        block_bytes = int(config.model.kv_bytes_per_token(kv_bytes) * profile.block_size_tokens)
        self.replicas = [
            Replica(i, profile, self.num_blocks, int(self.num_blocks * ratio), budget, max_seqs,
                    block_bytes, link * config.tp)
            for i in range(config.replicas)
        ]  # fmt: skip
        self.placement_enabled = bool(hook.superinfer_kv_placement.get_hookimpls())
        self.precision_enabled = bool(hook.superinfer_kv_precision.get_hookimpls())
        self.prompt_keys = wants_prompt_keys(hook)
        self.kv = KVMovement(hook, self.placement_enabled)
        self.router = make_router(config.router)
        for replica in self.replicas:
            replica.set_model(config.model, config.kv_group_size)
        self._events: list[tuple[float, int, int, int, Any]] = []
        self._seq = 0
        self.num_steps = 0
        self.num_schedule_calls = 0
        self.now_s = 0.0
        self.timeline: list[tuple[int, float, int, int, int]] = []
        self.counters = {"prefill_tokens": 0, "cached_tokens": 0}

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
        if self.config.record_token_gaps:
            for req in reqs:
                req.token_gaps = []
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
        counters = dict(self.counters)
        for rep in self.replicas:
            for key in ("offloaded_blocks", "onboarded_blocks", "dropped_blocks"):
                counters[key] = counters.get(key, 0) + rep.cache.stats[key]
            counters["swap_out_bytes"] = (
                counters.get("swap_out_bytes", 0) + rep.link.bytes_moved["d2h"]
            )
            counters["swap_in_bytes"] = (
                counters.get("swap_in_bytes", 0) + rep.link.bytes_moved["h2d"]
            )
        return SimResult(
            requests=tuple(reqs),
            end_s=self.now_s,
            kv_block_bytes=self.config.model.kv_bytes_per_token(dtype_bytes(self.config.kv_dtype))
            * self.config.profile.block_size_tokens,
            peak_kv_blocks=tuple(r.peak_blocks for r in self.replicas),
            peak_active_kv_blocks=tuple(r.peak_active_blocks for r in self.replicas),
            peak_class_kv_blocks=tuple(dict(r.peak_class_blocks) for r in self.replicas),
            num_steps=self.num_steps,
            num_schedule_calls=self.num_schedule_calls,
            kv_capacity_blocks=self.num_blocks,
            timeline=tuple(self.timeline),
            counters=counters,
        )

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` unless every replica's books balance.

        HBM and CPU blocks in use equal what requests, the prefix cache and copies in flight hold,
        and never exceed capacity; per-class counts add up; every node's lock count equals the
        requests holding it; a request is in at most one queue of one replica, in the status that
        queue implies. Tests call this after every step.
        """
        seen: set[str] = set()
        for rep in self.replicas:
            rep.cache.check()
        for rep in self.replicas:
            rep.check(seen)

    # -- routing --------------------------------------------------------------------------------

    def _route(self, req: SimRequest) -> Replica:
        reps = self.replicas
        if len(reps) == 1:
            return reps[0]
        return self.router.route(req, reps)

    # -- handlers -------------------------------------------------------------------------------

    def _on_arrival(self, now_s: float, _: int, req: SimRequest) -> None:
        rep = self._route(req)
        req.replica = rep.index
        spec = req.spec
        view = req.view()
        if self.prompt_keys and spec.block_hashes:  # its content keys, as SGLang's adapter gives
            view = replace(view, prompt_chunk_keys=tuple(map(str, spec.block_hashes)))
        self.hook.superinfer_request_arrived(request=view, now_s=now_s)
        total = spec.prompt_tokens + spec.max_output_tokens
        if total > self.config.model.max_model_len_tokens:
            self._end(req, RequestStatus.REJECTED, "exceeds_max_model_len")
            return
        if blocks_for_tokens(total, rep.block_size_tokens) > rep.total_blocks:
            self._end(req, RequestStatus.REJECTED, "exceeds_kv_capacity")
            return
        req.status = RequestStatus.WAITING
        req.touch()
        rep.waiting[req.request_id] = req
        if rep.run is not None:
            if rep.profile.cut_repeat_on_arrival and cut_run(rep.run, now_s):
                rep.version += 1
                self._push(rep.run.end_s, _STEP_END, rep.index, rep.version)
        elif not rep.schedule_pending:
            rep.schedule_pending = True
            self._push(now_s, _SCHEDULE, rep.index)

    def _on_schedule(self, now_s: float, replica: int, _: Any) -> None:
        rep = self.replicas[replica]
        rep.schedule_pending = False
        rep.release_transits(now_s)
        state = rep.state(now_s)
        decision = self.hook.superinfer_schedule(state=state)
        self.num_schedule_calls += 1
        if decision is None:
            raise PolicyError("no plugin answered superinfer_schedule")
        check_decision(state, decision, swap_supported=rep.cpu_total_blocks > 0)
        not_before = self._apply(rep, decision, now_s, state)
        if decision.num_tokens:
            self._start_run(rep, decision, now_s, not_before)
        if rep.run is not None:
            rep.idle_rounds = 0
            return
        # Nothing runs. Look again when a copy in flight lands, or at once if the decision
        # changed the queues (a bounded number of times, so a policy cannot spin in place).
        copies = [e for e, _ in rep.transits] + [
            r.ready_s for r in rep.swapped.values() if r.ready_s > now_s
        ]
        acted = decision.reject or decision.preempt or decision.resume or decision.admit
        if copies:
            wake = min(copies)
        elif (acted or decision.prefetch) and rep.idle_rounds < MAX_IDLE_ROUNDS:
            rep.idle_rounds += 1
            wake = now_s
        else:
            return  # idle until the next arrival
        rep.schedule_pending = True
        self._push(wake, _SCHEDULE, rep.index)

    def _on_step_end(self, now_s: float, replica: int, version: int) -> None:
        rep = self.replicas[replica]
        run = rep.run
        if run is None or version != rep.version:
            return  # re-timed: a newer end event exists
        rep.run = None
        k = run.num_steps
        finished: list[SimRequest] = []
        decode_tokens = prefill_tokens = 0
        first_end = run.start_s + run.elapsed_s(1) if k > 1 else now_s
        last_step = run.elapsed_s(k) - run.elapsed_s(k - 1) if k > 1 else 0.0
        for req, n in run.pieces:
            if n == 1 and req.generated_tokens > 0:
                decode_tokens += k
            else:
                prefill_tokens += n
            prompt = req.spec.prompt_tokens
            was_prefilling = req.computed_tokens < prompt
            emit(req, n, k, first_end, last_step, now_s)
            if was_prefilling and req.computed_tokens >= prompt:
                self.kv.insert_prefix(rep, req, now_s)
            own = rep.blocks_for(req, req.computed_tokens) - req.shared_blocks
            if req.reserve_blocks > own:
                own = req.reserve_blocks
            if own != req.own_blocks:
                rep.add_own(req, own - req.own_blocks)
            if req.generated_tokens >= req.spec.output_tokens:
                finished.append(req)
        self.counters["prefill_tokens"] += prefill_tokens
        rep.record_peak()
        rep.step_index += k
        self.num_steps += k
        if rep.profile.admission is AdmissionRule.RESERVE_RATIO and decode_tokens:
            decayed = rep.reserve_ratio - k * rep.profile.reserve_ratio_decay
            rep.reserve_ratio = max(rep.profile.reserve_ratio_min, decayed)
        for req in finished:
            del rep.running[req.request_id]
            self.kv.release(rep, req, now_s)
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
        if rep.waiting or rep.running or rep.swapped:
            rep.schedule_pending = True
            self._push(now_s, _SCHEDULE, rep.index)

    # -- decisions ------------------------------------------------------------------------------

    def _apply(self, rep: Replica, decision: ScheduleDecision, now_s: float,
               state: StepState) -> float:  # fmt: skip
        """Apply everything but the tokens; the earliest instant the step may start."""
        not_before = now_s
        for rid, reason in decision.reject.items():
            req = rep.waiting.pop(rid, None) or rep.swapped.pop(rid)
            if req.location is KVLocation.CPU:
                rep.own_cpu_blocks -= req.own_blocks
                req.own_blocks = 0
            elif req.own_blocks:
                self.kv.release(rep, req, now_s)
            self._end(req, RequestStatus.REJECTED, reason)
        for rid, mode in decision.preempt.items():
            req = rep.running.pop(rid)
            req.num_preemptions += 1
            # A swap the CPU tier cannot hold after all becomes a recompute preemption.
            if not (mode is PreemptMode.SWAP and self.kv.swap_out(rep, req, now_s)):
                self.kv.release(rep, req, now_s)
                req.computed_tokens = req.cached_tokens = 0
                req.status = RequestStatus.WAITING
                req.hit_version = -1
                rep.waiting = {rid: req, **rep.waiting}  # vLLM prepends preempted requests
            req.touch()
        if decision.preempt and rep.profile.admission is AdmissionRule.RESERVE_RATIO:
            rep.reserve_ratio = rep.profile.reserve_ratio_init  # a retraction resets it
        for rid in decision.prefetch:
            not_before = max(not_before, self.kv.swap_in(rep, rep.swapped[rid], now_s) or now_s)
        for rid in decision.resume:
            req = rep.swapped[rid]
            if self.kv.swap_in(rep, req, now_s) is None:
                continue  # no HBM room after all: it stays swapped
            del rep.swapped[rid]
            req.status = RequestStatus.RUNNING
            req.touch()
            rep.running[rid] = req
        for rid in decision.admit:
            self._admit(rep, rep.waiting[rid], now_s, state)
        for rid, tier in decision.tiers.items():
            req = rep.running.get(rid) or rep.waiting.get(rid) or rep.swapped[rid]
            req.tier = tier
            req.touch()
        return not_before

    def _admit(self, rep: Replica, req: SimRequest, now_s: float, state: StepState) -> None:
        """Move a waiting request to running: choose its KV precision (``superinfer_kv_precision``,
        FP16 when no plugin answers), lock its cached prefix (copying CPU nodes back), and, under
        ``RESERVE_MAX``, reserve its blocks to completion. If the allocator cannot find the blocks
        it stays waiting."""
        spec = req.spec
        if self.precision_enabled:
            chosen = self.hook.superinfer_kv_precision(request=req.view(), state=state)
            req.precision = chosen or KVPrecision.FP16
        match = (
            rep.cache.match(spec.block_hashes, spec.prompt_tokens) if spec.block_hashes else None
        )
        nodes = match.nodes if match else []
        onboard = [n for n in nodes if n.location is KVLocation.CPU]
        onboard_blocks = sum(n.blocks for n in onboard)
        slo = spec.slo.name
        rep.cache.lock([n for n in nodes if n.location is KVLocation.HBM], now_s, hit=True, slo=slo)
        hit_tokens = match.tokens if match else 0
        reserve = 0
        if rep.profile.admission is AdmissionRule.RESERVE_MAX:
            total = rep.blocks_for(req, spec.prompt_tokens + spec.max_output_tokens)
            reserve = max(0, total - sum(n.blocks for n in nodes))
        when = self.kv.allocate(rep, onboard_blocks + reserve, now_s)
        if when is None:
            rep.cache.unlock([n for n in nodes if n.location is KVLocation.HBM], now_s)
            return
        for node in onboard:
            rep.cache.onboard(node)
            rep.cache.lock([node], now_s, hit=True, slo=slo)
            req.ready_s = rep.link.transfer("h2d", node.blocks * rep.kv_block_bytes, when)
        del rep.waiting[spec.request_id]
        req.nodes = list(nodes)
        req.shared_blocks = sum(n.blocks for n in nodes)
        req.computed_tokens = req.cached_tokens = hit_tokens
        self.counters["cached_tokens"] += hit_tokens
        req.reserve_blocks = reserve
        rep.add_own(req, reserve)
        req.location = KVLocation.HBM
        req.status = RequestStatus.RUNNING
        req.touch()
        rep.running[spec.request_id] = req

    # -- steps ----------------------------------------------------------------------------------

    def _start_run(self, rep: Replica, decision: ScheduleDecision, now_s: float,
                   not_before: float) -> None:  # fmt: skip
        run = build_run(rep, decision, now_s, not_before, self.kv, self.step_time)
        if run is None:
            return
        rep.run = run
        rep.version += 1
        self._push(run.end_s, _STEP_END, rep.index, rep.version)

    def _end(self, req: SimRequest, status: RequestStatus, reason: str) -> None:
        req.status = status
        req.reason = reason
        req.finish_s = self.now_s
        req.touch()
        if status is RequestStatus.FINISHED:
            self.hook.superinfer_request_finished(request=req.view(), now_s=self.now_s)
        else:
            self.hook.superinfer_request_aborted(request=req.view(), now_s=self.now_s,
                                                 reason=reason)  # fmt: skip
