"""One engine replica's state: queues, KV tiers and their books, the prefix cache, the copy
link, and the step (or run of repeated decode steps) in flight. What changes that state lives in
``sim.engine`` (the loop and decisions) and ``sim.kv_movement`` (allocation and copies)."""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.policy_core.batching import blocks_for_tokens, sglang_output_reserve
from superinfer.policy_core.changes import ViewTracker
from superinfer.policy_core.kv_bytes import KVPacking, kv_bytes_ratio
from superinfer.policy_core.types import AdmissionRule, KVLocation, KVPrecision, StepState
from superinfer.sim.hardware import ModelSpec
from superinfer.sim.kv import Link, PrefixCache
from superinfer.sim.profiles import EngineProfile
from superinfer.sim.request import RequestStatus, SimRequest
from superinfer.sim.step_time import BatchShape

__all__ = ["Replica", "StepRun"]

_FP16 = KVPrecision.FP16


@dataclass(slots=True)
class StepRun:
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
        self.model: ModelSpec | None = None  # set_model; needed for quantized KV
        self.kv_group_size = 32
        self.kv_packing: KVPacking | None = None  # set_model; StepState.kv_packing
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
        self.run: StepRun | None = None
        self.version = 0  # bumps when the step in flight is re-timed; stale end events are skipped
        self.schedule_pending = False
        self.idle_rounds = 0
        self.last_sample_s = float("-inf")
        self.class_blocks: dict[str, int] = {}
        self.peak_blocks = 0
        self.peak_active_blocks = 0
        self.peak_class_blocks: dict[str, int] = {}
        self.views = ViewTracker()  # StepState.views / queue_of / changes (issue 21)

    # -- accounting -----------------------------------------------------------------------------

    def set_model(self, model: ModelSpec, kv_group_size: int) -> None:
        """The model whose KV this replica stores and the INT8 / INT4 group size (KVPacking)."""
        self.model, self.kv_group_size = model, kv_group_size
        self.kv_packing = KVPacking(model.num_layers, model.num_kv_heads, model.head_dim,
                                    kv_group_size, self.kv_block_bytes)  # fmt: skip

    def blocks_for(self, req: SimRequest, tokens: int) -> int:
        """Pages ``tokens`` tokens of ``req``'s KV fill at its precision (FP16-sized pages).

        A quantized request packs its exact bytes (codes, scales, zero points and the 16-bit
        residual, ``policy_core.kv_bytes``) into the pool's FP16-sized pages
        (:meth:`KVPacking.blocks`, the arithmetic policies see in ``StepState.kv_packing``).
        """
        if req.precision is _FP16 or self.kv_packing is None:
            return -(-tokens // self.block_size_tokens)
        return self.kv_packing.blocks(tokens, req.precision)

    def kv_ratio(self, req: SimRequest) -> float:
        """Bytes of ``req``'s KV per token relative to FP16 (what decode attention reads)."""
        if req.precision is _FP16 or self.model is None:
            return 1.0
        return kv_bytes_ratio(self.model.head_dim, req.precision, self.kv_group_size)

    @property
    def transit_blocks(self) -> int:
        """HBM blocks of swap-outs whose copy to CPU is still in flight."""
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
        """CPU-tier blocks held by neither swapped requests nor offloaded prefix nodes."""
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
        """Headroom held for running requests' future tokens: ``new_token_ratio`` of their
        remaining output caps (SGLang ``PrefillAdder``'s running offsets), plus, with the
        profile's ``reserve_whole_prompt``, the prompt tokens still to prefill of a request in
        chunked prefill, whole (its next chunks are taken before any admission,
        ``PrefillAdder.add_chunked_req``, and were checked whole when it was admitted: a chunk
        never waits for KV that a later admission took)."""
        if self.profile.admission is not AdmissionRule.RESERVE_RATIO:
            return 0
        whole = self.profile.reserve_whole_prompt
        out = rest = 0
        for r in self.running.values():
            out += sglang_output_reserve(r.spec.max_output_tokens, r.generated_tokens)
            if whole and (pending := r.pending_tokens) > 1:
                rest += pending
        return blocks_for_tokens(rest + int(out * self.reserve_ratio), self.block_size_tokens)

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
        """The policy's view of this replica, with its change set since the previous one."""
        for req in self.waiting.values():
            self.refresh_hit(req)
        state = StepState(
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
            mixed_batches=self.profile.mixed_batches,
            reserve_whole_prompt=self.profile.reserve_whole_prompt,
            finish_aware_admission=self.profile.finish_aware_admission,
            prefill_runs_whole=self.profile.prefill_runs_whole,
            kv_packing=self.kv_packing,
        )
        return self.views.stamp(state)

    # -- books ----------------------------------------------------------------------------------

    def check(self, seen: set[str]) -> None:
        """Raise ``AssertionError`` unless this replica's books balance
        (``Simulator.check_invariants``); ``seen`` collects request ids across replicas."""
        self.cache.check()
        in_hbm = [r for r in (*self.running.values(), *self.swapped.values())
                  if r.location is KVLocation.HBM]  # fmt: skip
        in_cpu = [r for r in self.swapped.values() if r.location is KVLocation.CPU]
        assert self.own_hbm_blocks == sum(r.own_blocks for r in in_hbm), self.index
        assert self.own_cpu_blocks == sum(r.own_blocks for r in in_cpu), self.index
        assert 0 <= self.used_blocks <= self.total_blocks, (self.index, self.used_blocks)
        assert self.cpu_free_blocks >= 0, self.index
        assert sum(self.class_blocks.values()) == self.own_hbm_blocks
        refs: dict[int, int] = {}
        for req in self.running.values():
            assert req.shared_blocks == sum(n.blocks for n in req.nodes), req.request_id
            for node in req.nodes:
                refs[node.key] = refs.get(node.key, 0) + 1
        for key, node in self.cache.nodes.items():
            assert node.ref == refs.get(key, 0), (key, node.ref, refs.get(key, 0))
        queues = ((self.waiting, RequestStatus.WAITING), (self.running, RequestStatus.RUNNING),
                  (self.swapped, RequestStatus.SWAPPED))  # fmt: skip
        for queue, status in queues:
            for rid, req in queue.items():
                assert rid not in seen, f"{rid} is in two queues"
                seen.add(rid)
                assert req.status is status and req.replica == self.index, rid
        assert all(r.kv_blocks == 0 for r in self.waiting.values())
