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
from dataclasses import dataclass
from typing import Any, Protocol

from superinfer.policy_core.batching import SGLANG_CLIP_MAX_NEW_TOKENS, blocks_for_tokens
from superinfer.policy_core.kv_bytes import kv_bytes_ratio, kv_sequence_bytes
from superinfer.policy_core.types import (
    AdmissionRule,
    KVLocation,
    KVPrecision,
    Placement,
    PreemptMode,
    ScheduleDecision,
    StepState,
    StepStats,
)
from superinfer.policy_core.validation import PolicyError, check_decision, check_placement
from superinfer.sim.calibrated import default_step_time
from superinfer.sim.hardware import GPUSpec, ModelSpec
from superinfer.sim.kv import Link, Node, PrefixCache
from superinfer.sim.profiles import EngineProfile
from superinfer.sim.request import RequestSpec, RequestStatus, SimRequest
from superinfer.sim.step_time import BatchShape

__all__ = [
    "ROUTERS",
    "Replica",
    "SimConfig",
    "SimResult",
    "Simulator",
    "StepTimeModel",
    "kv_capacity_blocks",
]

_FP16 = KVPrecision.FP16

# Event kinds, in the order they run at equal times.
_STEP_END, _ARRIVAL, _SCHEDULE = 0, 1, 2

#: Request routers across replicas.
ROUTERS = ("round_robin", "least_tokens", "slo_aware", "cache_aware")

#: The cache-aware router's defaults, as SGLang's model gateway (sgl-router) and vLLM's router
#: ship them for their ``cache_aware`` policy: route to the replica holding the longest prefix
#: when it covers more than ``--cache-threshold`` 0.3 of the prompt, else to the one with the
#: smallest cache; but once the busiest replica has more than ``--balance-abs-threshold`` 64
#: requests over the idlest and ``--balance-rel-threshold`` 1.5 times as many, to the idlest.
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5

#: Scheduling points in a row that may run nothing yet change the queues before the replica
#: waits for the next event.
MAX_IDLE_ROUNDS = 8


class StepTimeModel(Protocol):
    """What the engine needs from a step-time model."""

    def step_time_s(self, shape: BatchShape) -> float: ...

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]: ...


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What to simulate.

    Attributes:
        profile: the engine's mechanics.
        model: the model served.
        gpu: the GPU type.
        tp: tensor-parallel degree (GPUs per replica).
        replicas: number of replicas behind the router.
        router: one of :data:`ROUTERS`: ``round_robin``; ``least_tokens`` (fewest outstanding
            tokens: prompt tokens not yet computed plus output caps not yet generated);
            ``slo_aware`` (requests with a TTFT target go where the fewest prompt tokens wait for
            prefill, the others by ``least_tokens``); ``cache_aware`` (the replica whose prefix
            cache holds the longest prefix of the prompt, balanced by load, as SGLang's gateway
            does: :data:`CACHE_THRESHOLD`).
        horizon_s: stop simulating at this instant; requests still live then fail with reason
            ``"simulation_horizon"``. ``None`` runs until every request ends.
        num_gpu_blocks_override: KV blocks per replica instead of the ones memory allows (as
            vLLM's ``--num-gpu-blocks-override``); for what-if runs and tests.
        cpu_kv_ratio: CPU-tier capacity as a multiple of HBM KV capacity; ``None`` takes the
            profile's, 0 disables the tier (no swap, no prefix offload).
        host_link_bytes_s: HBM<->CPU bandwidth per GPU and direction; ``None`` takes the GPU's.
        timeline_interval_s: a replica's KV use and queue lengths are sampled at the end of its
            first step at least this long after the previous sample.
        kv_group_size: quantization group size of INT8/INT4 KV (KIVI ``G``).
    """

    profile: EngineProfile
    model: ModelSpec
    gpu: GPUSpec
    tp: int = 1
    replicas: int = 1
    router: str = "round_robin"
    horizon_s: float | None = None
    num_gpu_blocks_override: int | None = None
    cpu_kv_ratio: float | None = None
    host_link_bytes_s: float | None = None
    timeline_interval_s: float = 1.0
    kv_group_size: int = 32


def kv_capacity_blocks(profile: EngineProfile, model: ModelSpec, gpu: GPUSpec, tp: int) -> int:
    """KV blocks one replica holds in HBM: the profile's KV bytes per GPU over one block's bytes
    on one GPU (FP16, the block's tokens across all layers, ``kv_heads / tp`` heads).

    Raises:
        ValueError: the weights leave no room for KV.
    """
    block_bytes = model.kv_bytes_per_token() / tp * profile.block_size_tokens
    blocks = int(profile.kv_bytes_per_gpu(model, gpu, tp) // block_bytes)
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
    decode_growth: float = 0.0  # B: FP16-equivalent KV tokens the batch adds per step

    def elapsed_s(self, steps: int) -> float:
        """Time the first ``steps`` steps of a repeated run take."""
        c0, b_seqs = self.shape.decode_kv_tokens, self.decode_growth
        return steps * self.decode_a_s + self.decode_b_s * (
            steps * c0 + b_seqs * steps * (steps - 1) / 2
        )


class Replica:
    """One engine replica: queues, KV tiers, prefix cache, copy link and the step in flight."""

    def __init__(self, index: int, profile: EngineProfile, num_blocks: int, cpu_blocks: int,
                 token_budget: int, max_num_seqs: int, kv_block_bytes: int,
                 link_bytes_s: float) -> None:  # fmt: skip
        self.index = index
        self.profile = profile
        self.model: ModelSpec | None = None  # set by the simulator; needed for quantized KV
        self.kv_group_size = 32
        self.total_blocks = num_blocks
        self.cpu_total_blocks = cpu_blocks
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.block_size_tokens = profile.block_size_tokens
        self.kv_block_bytes = kv_block_bytes
        self.link = Link(link_bytes_s)
        self.cache = PrefixCache(
            profile.block_size_tokens,
            use_priority=profile.prefix_cache == "block_reuse",
            offload_min_priority=profile.offload_min_priority,
        )
        self.own_hbm_blocks = 0  # requests' own blocks in HBM
        self.own_cpu_blocks = 0  # swapped requests' blocks in CPU
        self.transits: list[tuple[float, int]] = []  # (end_s, blocks) of swap-outs in flight
        self.reserve_ratio = profile.reserve_ratio_init
        self.waiting: dict[str, SimRequest] = {}
        self.running: dict[str, SimRequest] = {}
        self.swapped: dict[str, SimRequest] = {}
        self.step_index = 0
        self.run: _Run | None = None
        self.version = 0  # bumps when the step in flight is re-timed; stale end events are skipped
        self.schedule_pending = False
        self.idle_rounds = 0
        self.last_sample_s = float("-inf")
        self.class_blocks: dict[str, int] = {}
        self.peak_blocks = 0
        self.peak_active_blocks = 0
        self.peak_class_blocks: dict[str, int] = {}

    # -- accounting -----------------------------------------------------------------------------

    def blocks_for(self, req: SimRequest, tokens: int) -> int:
        """Pages ``tokens`` tokens of ``req``'s KV fill at its precision (FP16-sized pages).

        A quantized request packs its exact bytes (codes, scales, zero points and the 16-bit
        residual, ``policy_core.kv_bytes``) into the pool's FP16-sized pages.
        """
        if req.precision is _FP16 or self.model is None:
            return -(-tokens // self.block_size_tokens)
        m = self.model
        size = kv_sequence_bytes(tokens, m.num_layers, m.num_kv_heads, m.head_dim,
                                 req.precision, self.kv_group_size)  # fmt: skip
        return -(-size // self.kv_block_bytes)

    def kv_ratio(self, req: SimRequest) -> float:
        """Bytes of ``req``'s KV per token relative to FP16 (what decode attention reads)."""
        if req.precision is _FP16 or self.model is None:
            return 1.0
        return kv_bytes_ratio(self.model.head_dim, req.precision, self.kv_group_size)

    @property
    def transit_blocks(self) -> int:
        return sum(blocks for _, blocks in self.transits)

    @property
    def used_blocks(self) -> int:
        """HBM blocks in use: requests', the prefix cache's, and swap-outs still copying."""
        return self.own_hbm_blocks + self.cache.hbm_blocks + self.transit_blocks

    @property
    def free_blocks(self) -> int:
        """HBM blocks free right now (not counting what eviction could reclaim)."""
        return self.total_blocks - self.used_blocks

    @property
    def cpu_free_blocks(self) -> int:
        return self.cpu_total_blocks - self.own_cpu_blocks - self.cache.cpu_blocks

    def release_transits(self, now_s: float) -> None:
        """Free the HBM blocks of swap-outs whose copy has ended."""
        self.transits = [(end, b) for end, b in self.transits if end > now_s]

    def add_own(self, req: SimRequest, delta: int) -> None:
        """Change ``req``'s own HBM blocks by ``delta``, keeping pool and per-class counts exact."""
        if delta:
            req.own_blocks += delta
            self.own_hbm_blocks += delta
            name = req.spec.slo.name
            self.class_blocks[name] = self.class_blocks.get(name, 0) + delta
            req.touch()

    def reserved_blocks(self) -> int:
        """Headroom held for running requests' future tokens (SGLang ``new_token_ratio``)."""
        if self.profile.admission is not AdmissionRule.RESERVE_RATIO:
            return 0
        tokens = sum(
            min(r.spec.max_output_tokens - r.generated_tokens, SGLANG_CLIP_MAX_NEW_TOKENS)
            for r in self.running.values()
        )
        return blocks_for_tokens(int(tokens * self.reserve_ratio), self.block_size_tokens)

    def record_peak(self) -> None:
        """Fold the current KV use into the peaks."""
        used = self.used_blocks
        self.peak_blocks = max(self.peak_blocks, used)
        self.peak_active_blocks = max(
            self.peak_active_blocks, used - self.cache.evictable_hbm_blocks
        )
        for name, blocks in self.class_blocks.items():
            if blocks > self.peak_class_blocks.get(name, 0):
                self.peak_class_blocks[name] = blocks

    # -- prefix hits ----------------------------------------------------------------------------

    def refresh_hit(self, req: SimRequest) -> None:
        """Recompute a waiting request's prefix-cache hit if the cache changed since."""
        spec = req.spec
        if not spec.block_hashes or req.hit_version == self.cache.version:
            return
        match = self.cache.match(spec.block_hashes, spec.prompt_tokens)
        hbm = sum(n.blocks for n in match.nodes if n.location is KVLocation.HBM)
        if (match.tokens, hbm) != (req.hit_tokens, req.hit_blocks):
            req.hit_tokens, req.hit_blocks = match.tokens, hbm
            req.touch()
        req.hit_version = self.cache.version

    def state(self, now_s: float) -> StepState:
        """The policy's view of this replica."""
        for req in self.waiting.values():
            self.refresh_hit(req)
        return StepState(
            now_s=now_s,
            step_index=self.step_index,
            waiting=tuple(r.view() for r in self.waiting.values()),
            running=tuple(r.view() for r in self.running.values()),
            swapped=tuple(r.view() for r in self.swapped.values()),
            free_hbm_blocks=self.free_blocks + self.cache.evictable_hbm_blocks,
            total_hbm_blocks=self.total_blocks,
            free_cpu_blocks=self.cpu_free_blocks + self.cache.cpu_blocks,
            total_cpu_blocks=self.cpu_total_blocks,
            block_size_tokens=self.block_size_tokens,
            token_budget=self.token_budget,
            max_num_seqs=self.max_num_seqs,
            reserved_hbm_blocks=self.reserved_blocks(),
            admission=self.profile.admission,
            kv_block_bytes=self.kv_block_bytes,
            link_bytes_per_s=self.link.bytes_per_s if self.cpu_total_blocks else 0.0,
            replica=self.index,
        )


@dataclass(frozen=True, slots=True)
class SimResult:
    """Outcome of a simulation.

    Attributes:
        requests: every request, in workload order, in a terminal state.
        end_s: instant the last event ran, s.
        kv_block_bytes: bytes of one KV block across the replica's GPUs.
        peak_kv_blocks: per replica, the peak of HBM KV blocks in use (prefix cache included).
        peak_active_kv_blocks: per replica, the peak of HBM KV blocks requests use (cached
            prefixes nobody uses excluded).
        peak_class_kv_blocks: per replica, per SLO class, the peak of own blocks of that class.
        num_steps: engine steps run, all replicas.
        num_schedule_calls: scheduling decisions asked of the policy, all replicas.
        kv_capacity_blocks: KV blocks of one replica.
        timeline: samples ``(replica, time_s, used_hbm_blocks, num_waiting, num_running)``.
        counters: totals over replicas: ``prefill_tokens``, ``cached_tokens`` (prefill skipped by
            prefix hits), ``swap_out_bytes``, ``swap_in_bytes``, ``offloaded_blocks``,
            ``onboarded_blocks``, ``dropped_blocks``.
    """

    requests: tuple[SimRequest, ...]
    end_s: float
    kv_block_bytes: float
    peak_kv_blocks: tuple[int, ...]
    peak_active_kv_blocks: tuple[int, ...]
    peak_class_kv_blocks: tuple[dict[str, int], ...]
    num_steps: int
    num_schedule_calls: int
    kv_capacity_blocks: int
    timeline: tuple[tuple[int, float, int, int, int], ...] = ()
    counters: dict[str, int] | None = None


class Simulator:
    """Runs a workload through replicas of one engine, with decisions from the plugins.

    Args:
        config: engine, model, hardware and cluster size.
        hook: the plugin manager's hook relay (``PluginManager.hook``). The engine calls
            ``superinfer_schedule``, ``superinfer_kv_placement``, ``superinfer_request_arrived``,
            ``superinfer_request_finished``, ``superinfer_request_aborted`` and
            ``superinfer_step_finished`` on it.
        step_time: step-time model; the calibrated one for ``config`` by default
            (``sim.calibrated.default_step_time``).

    Raises:
        ValueError: unknown router, or the model leaves no KV memory.
    """

    def __init__(self, config: SimConfig, hook: Any, step_time: StepTimeModel | None = None
                 ) -> None:  # fmt: skip
        if config.router not in ROUTERS:
            raise ValueError(f"unknown router {config.router!r}; known: {', '.join(ROUTERS)}")
        self.config = config
        self.hook = hook
        self.step_time = step_time or default_step_time(config.model, config.gpu, config.tp)
        profile = config.profile
        self.num_blocks = config.num_gpu_blocks_override or kv_capacity_blocks(
            profile, config.model, config.gpu, config.tp
        )
        ratio = profile.cpu_kv_ratio if config.cpu_kv_ratio is None else config.cpu_kv_ratio
        link = config.host_link_bytes_s or config.gpu.host_link_bytes_s
        budget, max_seqs = profile.limits(config.gpu)
        block_bytes = int(config.model.kv_bytes_per_token() * profile.block_size_tokens)
        self.replicas = [
            Replica(i, profile, self.num_blocks, int(self.num_blocks * ratio), budget, max_seqs,
                    block_bytes, link * config.tp)
            for i in range(config.replicas)
        ]  # fmt: skip
        self.placement_enabled = bool(hook.superinfer_kv_placement.get_hookimpls())
        self.precision_enabled = bool(hook.superinfer_kv_precision.get_hookimpls())
        for replica in self.replicas:
            replica.model = config.model
            replica.kv_group_size = config.kv_group_size
        self._events: list[tuple[float, int, int, int, Any]] = []
        self._seq = 0
        self._rr = 0
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
            kv_block_bytes=self.config.model.kv_bytes_per_token()
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
            in_hbm = [r for r in (*rep.running.values(), *rep.swapped.values())
                      if r.location is KVLocation.HBM]  # fmt: skip
            in_cpu = [r for r in rep.swapped.values() if r.location is KVLocation.CPU]
            assert rep.own_hbm_blocks == sum(r.own_blocks for r in in_hbm), rep.index
            assert rep.own_cpu_blocks == sum(r.own_blocks for r in in_cpu), rep.index
            assert 0 <= rep.used_blocks <= rep.total_blocks, (rep.index, rep.used_blocks)
            assert rep.cpu_free_blocks >= 0, rep.index
            assert sum(rep.class_blocks.values()) == rep.own_hbm_blocks
            refs: dict[int, int] = {}
            for req in rep.running.values():
                assert req.shared_blocks == sum(n.blocks for n in req.nodes), req.request_id
                for node in req.nodes:
                    refs[node.key] = refs.get(node.key, 0) + 1
            for key, node in rep.cache.nodes.items():
                assert node.ref == refs.get(key, 0), (key, node.ref, refs.get(key, 0))
            queues = ((rep.waiting, RequestStatus.WAITING), (rep.running, RequestStatus.RUNNING),
                      (rep.swapped, RequestStatus.SWAPPED))  # fmt: skip
            for queue, status in queues:
                for rid, req in queue.items():
                    assert rid not in seen, f"{rid} is in two queues"
                    seen.add(rid)
                    assert req.status is status and req.replica == rep.index, rid
            assert all(r.kv_blocks == 0 for r in rep.waiting.values())

    # -- routing --------------------------------------------------------------------------------

    def _route(self, req: SimRequest) -> Replica:
        reps = self.replicas
        if self.config.router == "round_robin" or len(reps) == 1:
            rep = reps[self._rr]
            self._rr = (self._rr + 1) % len(reps)
            return rep

        def queued_prefill(rep: Replica) -> int:
            live = (*rep.waiting.values(), *rep.running.values(), *rep.swapped.values())
            return sum(r.pending_tokens for r in live if r.pending_tokens > 1)

        def outstanding(rep: Replica) -> int:
            live = (*rep.waiting.values(), *rep.running.values(), *rep.swapped.values())
            return sum(r.pending_tokens + r.spec.max_output_tokens - r.generated_tokens
                       for r in live)  # fmt: skip

        if self.config.router == "cache_aware":
            return self._route_cache_aware(req)
        slo_aware = self.config.router == "slo_aware" and req.spec.slo.ttft_ms is not None
        load = queued_prefill if slo_aware else outstanding
        return min(reps, key=lambda rep: (load(rep), len(rep.running), rep.index))

    def _route_cache_aware(self, req: SimRequest) -> Replica:
        reps = self.replicas
        loads = [len(r.waiting) + len(r.running) + len(r.swapped) for r in reps]
        busiest, idlest = max(loads), min(loads)
        if busiest - idlest > BALANCE_ABS_THRESHOLD and busiest > BALANCE_REL_THRESHOLD * idlest:
            return reps[loads.index(idlest)]
        spec = req.spec
        best, best_tokens = None, 0
        if spec.block_hashes:
            for rep in reps:
                matched = rep.cache.match(spec.block_hashes, spec.prompt_tokens).tokens
                if matched > best_tokens:
                    best, best_tokens = rep, matched
        if best is not None and best_tokens > CACHE_THRESHOLD * spec.prompt_tokens:
            return best
        return min(reps, key=lambda r: (r.cache.hbm_blocks + r.cache.cpu_blocks, loads[r.index],
                                        r.index))  # fmt: skip

    # -- handlers -------------------------------------------------------------------------------

    def _on_arrival(self, now_s: float, _: int, req: SimRequest) -> None:
        rep = self._route(req)
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
        req.touch()
        rep.waiting[req.request_id] = req
        if rep.run is not None:
            self._cut_run(rep, now_s)
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
            self._emit(req, n, k, first_end, last_step, now_s)
            if was_prefilling and req.computed_tokens >= prompt:
                self._insert_prefix(rep, req, now_s)
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
            self._release(rep, req, now_s)
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

    # -- KV memory ------------------------------------------------------------------------------

    def _allocate(self, rep: Replica, blocks: int, now_s: float) -> float | None:
        """Make ``blocks`` HBM blocks free for the caller to take.

        Evicts prefix-cache nodes (placement plugin first, then the engine's own order) and, if
        still short, waits for swap-outs in flight.

        Returns:
            The instant the blocks are free (``now_s`` or the end of a copy), or ``None`` if they
            cannot be found.
        """
        if blocks <= rep.free_blocks:
            return now_s
        self._evict(rep, blocks - rep.free_blocks, now_s)
        if blocks <= rep.free_blocks:
            return now_s
        short = blocks - rep.free_blocks
        for end, freed in sorted(rep.transits):
            short -= freed
            if short <= 0:
                rep.release_transits(end)  # the caller takes these blocks once the copy ends
                return end
        return None

    def _evict(self, rep: Replica, blocks: int, now_s: float) -> None:
        """Take at least ``blocks`` HBM blocks from unused prefix-cache nodes, if there are any:
        the placement plugin's decision first, then the engine's own order among unpinned
        nodes."""
        cache = rep.cache
        freed = self._placement(rep, blocks, now_s) if self.placement_enabled else 0
        while freed < blocks:
            node = cache.pop_victim()
            if node is None:
                return
            freed += self._leave_hbm(rep, node, now_s, offload=True)

    def _placement(self, rep: Replica, needed: int, now_s: float) -> int:
        """Ask ``superinfer_kv_placement`` about every cached node and apply its answer (drop,
        offload, prefetch, then the new pin set); the HBM blocks it freed."""
        cache = rep.cache
        if not cache.nodes:
            return 0
        waiting_refs: dict[int, int] = {}
        for req in (*rep.waiting.values(), *rep.swapped.values()):
            for key in req.spec.block_hashes:
                if key not in cache.nodes:
                    break
                waiting_refs[key] = waiting_refs.get(key, 0) + 1
        views = tuple(n.view(waiting_refs.get(k, 0)) for k, n in cache.nodes.items())
        decision = self.hook.superinfer_kv_placement(
            nodes=views, now_s=now_s, free_hbm_blocks=rep.free_blocks,
            free_cpu_blocks=rep.cpu_free_blocks, needed_hbm_blocks=needed,
            total_hbm_blocks=rep.total_blocks,
        )  # fmt: skip
        if decision is None:
            return 0
        check_placement(views, decision, has_cpu_tier=rep.cpu_total_blocks > 0)
        by_id = {str(k): n for k, n in cache.nodes.items()}
        freed = 0
        for wanted in (Placement.DROP, Placement.OFFLOAD):
            chosen = [by_id[i] for i, a in decision.actions.items() if a is wanted]
            for node in sorted(chosen, key=lambda n: (-n.depth, n.key)):  # leaves first
                if node.key not in cache.nodes:
                    continue  # went with a dropped ancestor
                if node.location is KVLocation.HBM:
                    freed += self._leave_hbm(rep, node, now_s, offload=wanted is Placement.OFFLOAD)
                elif wanted is Placement.DROP:
                    cache.drop_cpu(node)
        for node_id in decision.prefetch:
            node = by_id[node_id]
            if node.key in cache.nodes and node.location is KVLocation.CPU:
                if node.blocks > rep.free_blocks:
                    break  # prefetch only into free memory, never by evicting
                cache.onboard(node)
                rep.link.transfer("h2d", node.blocks * rep.kv_block_bytes, now_s)
        pins = {i for i, a in decision.actions.items() if a is Placement.PIN}
        for key, node in cache.nodes.items():
            cache.set_pinned(node, str(key) in pins)
        return freed

    def _leave_hbm(self, rep: Replica, node: Node, now_s: float, *, offload: bool) -> int:
        """Offload ``node`` to CPU if asked and possible (else drop it); the HBM blocks freed."""
        cache = rep.cache
        offload = (
            offload and rep.cpu_total_blocks > 0 and node.priority >= cache.offload_min_priority
        )
        while offload and rep.cpu_free_blocks < node.blocks:
            victim = cache.pop_cpu_victim()
            if victim is None:
                offload = False
            else:
                cache.drop_cpu(victim)
        if offload:
            rep.link.transfer("d2h", node.blocks * rep.kv_block_bytes, now_s)
        cache.leave_hbm(node, offload=offload)
        return node.blocks

    def _insert_prefix(self, rep: Replica, req: SimRequest, now_s: float) -> None:
        """A request finished its prefill: cache its prompt's hashed blocks (its pages become the
        cache's; the request keeps them locked)."""
        spec = req.spec
        if not spec.block_hashes or req.precision is not KVPrecision.FP16:
            return  # the cache holds FP16 KV; quantized requests reuse it but do not add to it
        cache = rep.cache
        parent = req.nodes[-1] if req.nodes else None
        for index in range(len(req.nodes), len(spec.block_hashes)):
            key = spec.block_hashes[index]
            tokens = cache.node_tokens(spec.prompt_tokens, index, spec.hash_block_tokens)
            if tokens == 0 or key in cache.nodes:
                break  # a partial page, or another request cached it first: keep ours private
            node = cache.insert(key, parent, tokens, now_s, slo=spec.slo.name)
            req.nodes.append(node)
            req.shared_blocks += node.blocks
            rep.add_own(req, -node.blocks)
            req.reserve_blocks = max(0, req.reserve_blocks - node.blocks)
            parent = node

    def _release(self, rep: Replica, req: SimRequest, now_s: float) -> None:
        """Give back ``req``'s HBM KV: unlock its prefix nodes, free its own blocks."""
        rep.cache.unlock(req.nodes, now_s)
        req.nodes = []
        req.shared_blocks = 0
        req.reserve_blocks = 0
        rep.add_own(req, -req.own_blocks)
        req.location = KVLocation.UNALLOCATED
        req.touch()

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
                self._release(rep, req, now_s)
            self._end(req, RequestStatus.REJECTED, reason)
        for rid, mode in decision.preempt.items():
            req = rep.running.pop(rid)
            req.num_preemptions += 1
            if mode is PreemptMode.SWAP:
                self._swap_out(rep, req, now_s)
            else:
                self._release(rep, req, now_s)
                req.computed_tokens = req.cached_tokens = 0
                req.status = RequestStatus.WAITING
                req.hit_version = -1
                rep.waiting = {rid: req, **rep.waiting}  # vLLM prepends preempted requests
            req.touch()
        if decision.preempt and rep.profile.admission is AdmissionRule.RESERVE_RATIO:
            rep.reserve_ratio = rep.profile.reserve_ratio_init  # a retraction resets it
        for rid in decision.prefetch:
            not_before = max(not_before, self._swap_in(rep, rep.swapped[rid], now_s) or now_s)
        for rid in decision.resume:
            req = rep.swapped[rid]
            if self._swap_in(rep, req, now_s) is None:
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
        when = self._allocate(rep, onboard_blocks + reserve, now_s)
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

    def _swap_out(self, rep: Replica, req: SimRequest, now_s: float) -> None:
        """Copy ``req``'s KV to CPU; its HBM pages free when the copy ends."""
        blocks = rep.blocks_for(req, req.computed_tokens)
        end = rep.link.transfer("d2h", blocks * rep.kv_block_bytes, max(now_s, req.ready_s))
        own = req.own_blocks
        rep.add_own(req, -own)
        rep.transits.append((end, own))
        rep.cache.unlock(req.nodes, now_s)
        req.nodes = []
        req.shared_blocks = 0
        req.reserve_blocks = 0
        while rep.cpu_free_blocks < blocks:
            victim = rep.cache.pop_cpu_victim()
            assert victim is not None, "check_decision guarantees CPU room"
            rep.cache.drop_cpu(victim)
        req.own_blocks = blocks
        rep.own_cpu_blocks += blocks
        req.location = KVLocation.CPU
        req.ready_s = end  # its KV is in CPU memory from here on
        req.status = RequestStatus.SWAPPED
        rep.swapped[req.request_id] = req

    def _swap_in(self, rep: Replica, req: SimRequest, now_s: float) -> float | None:
        """Copy a swapped request's KV back to HBM (no-op if already there); when it lands."""
        if req.location is KVLocation.HBM:
            return req.ready_s
        blocks = req.own_blocks
        when = self._allocate(rep, blocks, now_s)
        if when is None:
            return None
        rep.own_cpu_blocks -= blocks
        req.own_blocks = 0
        rep.add_own(req, blocks)
        req.location = KVLocation.HBM
        start = max(when, req.ready_s)  # not before its swap-out copy has landed in CPU
        req.ready_s = rep.link.transfer("h2d", blocks * rep.kv_block_bytes, start)
        req.touch()
        return req.ready_s

    # -- steps ----------------------------------------------------------------------------------

    def _start_run(self, rep: Replica, decision: ScheduleDecision, now_s: float,
                   not_before: float) -> None:  # fmt: skip
        running = rep.running
        pieces = [(running[rid], n) for rid, n in decision.num_tokens.items() if rid in running]
        if not pieces:
            return
        steps = self._repeat_steps(rep, decision, pieces)
        start = not_before
        kept = []
        pairs = full_pairs = decode_kv = growth = 0.0
        tokens = prefill_kv = samples = prefill_tokens = prefill_seqs = 0
        for req, n in pieces:
            c = req.computed_tokens
            need = rep.blocks_for(req, c + (n if n > steps else steps)) - req.kv_blocks
            if need > 0:
                when = self._allocate(rep, need, now_s)
                if when is None:
                    # The policy counted cached blocks that admissions in this same decision
                    # have since locked; this request sits the step out (its next step will fit
                    # or the policy preempts).
                    continue
                if when > start:
                    start = when
                rep.add_own(req, need)
            if req.ready_s > start:
                start = req.ready_s
            kept.append((req, n))
            tokens += n
            if n == 1:
                ratio = rep.kv_ratio(req)
                decode_kv += (c + 1) * ratio
                growth += ratio
            else:
                prefill_seqs += 1
                pairs += n * (c + (n + 1) / 2)
                full_pairs += n * (c + n)
                prefill_kv += c + n
                prefill_tokens += n
            samples += req.pending_tokens == n
        if not kept:
            return
        shape = BatchShape(
            tokens, samples, pairs, prefill_kv, decode_kv, len(kept), prefill_tokens,
            full_pairs, prefill_seqs,
        )  # fmt: skip
        if steps > 1:
            a, b = self.step_time.decode_coefficients(len(kept))
            run = _Run(start, kept, steps, start, shape, a, b, growth)
            run.end_s = start + run.elapsed_s(steps)
        else:
            run = _Run(start, kept, 1, start + self.step_time.step_time_s(shape), shape)
        rep.run = run
        rep.version += 1
        self._push(run.end_s, _STEP_END, rep.index, rep.version)

    def _repeat_steps(self, rep: Replica, decision: ScheduleDecision,
                      pieces: list[tuple[SimRequest, int]]) -> int:  # fmt: skip
        """Steps a decode-only decision may run as one event: bounded by the policy's allowance,
        the first finish, and the KV blocks free (or reclaimable) for the sequences' growth."""
        if decision.max_repeat_steps <= 1 or any(n != 1 for _, n in pieces):
            return 1
        if any(req.pending_tokens != 1 or req.ready_s > self.now_s for req, _ in pieces):
            return 1
        k_max = min(
            decision.max_repeat_steps,
            min(r.spec.output_tokens - r.generated_tokens for r, _ in pieces),
        )
        free = rep.free_blocks + rep.cache.evictable_hbm_blocks

        def fits(k: int) -> bool:
            need = sum(
                max(0, rep.blocks_for(r, r.computed_tokens + k) - r.kv_blocks) for r, _ in pieces
            )
            return need <= free

        if fits(k_max):  # the common case: memory is not the bound
            return k_max
        lo, hi = 1, k_max - 1
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

    @staticmethod
    def _emit(req: SimRequest, n: int, k: int, first_end_s: float, last_step_s: float,
              end_s: float) -> None:  # fmt: skip
        """Advance ``req`` by a run of ``k`` steps of ``n`` tokens each: its KV, and the output
        tokens of the steps that complete its pending tokens (every step of a repeated run).
        ``first_end_s`` is the end of the run's first step, ``last_step_s`` its last step's
        length (repeated runs only)."""
        emitted = k if k > 1 else int(req.pending_tokens == n)
        req.computed_tokens += n * k
        if emitted:
            if req.last_token_s is not None:
                gap = first_end_s - req.last_token_s
                if gap > req.max_itl_s:
                    req.max_itl_s = gap
            if k > 1 and last_step_s > req.max_itl_s:
                req.max_itl_s = last_step_s
            if req.first_token_s is None:
                req.first_token_s = first_end_s
            req.generated_tokens += emitted
            req.last_token_s = end_s
        req._view = None

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
