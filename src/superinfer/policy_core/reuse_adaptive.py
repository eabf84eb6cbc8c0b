"""Block-level prefix caches that process whole requests, and the adaptive reuse predictor.

Every cache here holds KV blocks identified by dense ids ``0..U-1`` of a prefix forest
(``parent[b]``: the block before ``b`` in every prompt holding it, -1 for a first block), keeps
its HBM content prefix-closed (a block leaves only when none of its children is cached) and
offers one call per request, :meth:`BlockCache.request`, which makes every block of the request
cached and returns the blocks that left to bring the cache back within ``capacity``.

- :class:`HeapCache` -- LRU (key: last access instant) or LFU (key: accesses since insertion,
  then last access), ties deeper first then by id, the placement planner's order;
  :class:`LrfuCache` -- LRFU (decayed access count over a ghost history, ``lrfuH``: half-life
  H s); and :class:`ArcBlocks`, :class:`S3FifoBlocks` -- ARC and S3-FIFO
  (:mod:`superinfer.policy_core.kv_baselines`), fed a request's blocks deepest first, so that
  inside a request a parent is more recent than its child (all in
  :mod:`superinfer.policy_core.reuse_blocks`, re-exported here).
- :class:`LearnedCache` -- the learned reuse predictor (:mod:`superinfer.policy_core.reuse`)
  in the placement planner's eviction order, its O(cache) plan amortized over requests
  (:mod:`superinfer.policy_core.reuse_learned`, re-exported here); an optional expert
  (``learned``), no longer a default one (issue 22: LRFU with a 200 s half-life led where it
  did, at a tenth of its cost).
- :class:`AdaptiveCache` -- the adaptive reuse predictor. It runs its experts (default: LRU,
  ARC, S3-FIFO, LFU, LRFU with half-lives 20 s and 200 s, and the reuse-hazard expert
  :class:`~superinfer.policy_core.reuse_hazard.HazardCache`) as shadow caches of the same
  capacity on the same requests (ids only, no KV), scores each by its exponentially decayed
  prefix-hit blocks (half-life ``half_life_blocks`` block references), and
  makes its own cache follow the current leader (:mod:`~superinfer.policy_core.reuse_follow`:
  the blocks the leader does not hold leave first). It starts as LRU (cold start: LRU's
  hits exactly until another policy leads by the switching margin) and switches leader only when
  another policy's score exceeds the leader's by ``switch_margin`` (in hit rate over the decayed
  window) and by the measured cost of a switch (the hits it lost to its leader over the last
  leader's tenure while its content converged, ``switch_cost``), so it adapts when the
  structure shifts but does not chase near-tied experts. With a CPU tier, each shadow also
  keeps a CPU tier of its HBM victims as large as the real one (LRU; LFU-ordered for the LFU
  shadow, whose counts survive it) and is scored by its hits in both; while LFU leads,
  :meth:`cpu_key` orders the real CPU tier by the LFU counts too. With a CPU tier it also runs
  every expert again as a *union shadow*, one cache as large as HBM + CPU, scored by its plain
  prefix hits, with a leader of its own (the margin rule without the switch charge, cold start
  LRU); once that leader is not LRU, the real CPU tier drops first the blocks the union
  leader does not hold (:meth:`cpu_key`, re-keyed through :meth:`cpu_rekey`), so the union of
  HBM and CPU follows the policy that does best at the union's size (a CPU hit counts as a
  hit). The per-request work is the shadow caches' (O(blocks log cache) each, amortized; twice
  as many shadows with a CPU tier) and O(log cache) per eviction of its own; a switch costs one
  O(cache) pass.

  With ``sample_rate`` R < 1 the shadows are miniature simulations (Waldspurger et al., USENIX
  ATC 2017; SHARDS, FAST 2015) of ``capacity * R`` blocks on a fixed spatial sample of the
  blocks, hits scaled by 1/R, and the cache follows one full-size cache of the leader's policy,
  warmed on the recent references at each switch (:mod:`~superinfer.policy_core.reuse_sampled`
  says why); R = 1 (the default) is exactly the unsampled predictor.

Pure: stdlib and numpy.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Container, Sequence

from superinfer.policy_core.reuse_adaptive_config import (
    ADAPTIVE_EXPERTS,
    AdaptiveConfig,
    adaptive_sample_rate,
    lrfu_half_life,
)
from superinfer.policy_core.reuse_blocks import (
    ArcBlocks,
    BlockCache,
    HeapCache,
    LrfuCache,
    S3FifoBlocks,
)
from superinfer.policy_core.reuse_follow import FollowingCache
from superinfer.policy_core.reuse_hazard import HazardCache
from superinfer.policy_core.reuse_learned import LearnedCache
from superinfer.policy_core.reuse_sampled import WarmLog, sample_mask, sampled_forest

__all__ = [
    "ADAPTIVE_EXPERTS",
    "AdaptiveCache",
    "AdaptiveConfig",
    "ArcBlocks",
    "BlockCache",
    "HeapCache",
    "LearnedCache",
    "S3FifoBlocks",
    "adaptive_sample_rate",
    "make_block_cache",
]


class AdaptiveCache(FollowingCache):
    """The adaptive reuse predictor: follows the simple policy with the most recent hits.

    Attributes:
        experts: the shadow caches by name.
        leader: the policy followed now.
        scores: decayed prefix-hit blocks of each shadow cache.
        switches: (block references seen, old leader, new leader) of each switch.
        follow: with ``sample_rate`` < 1, the full-size cache of the leader's policy that this
            cache follows (None while LRU leads); ``union_follow`` the union leader's.
    """

    name = "adaptive"

    def __init__(
        self,
        capacity: int,
        parent: Sequence[int],
        depth: Sequence[int],
        config: AdaptiveConfig | None = None,
        cpu_capacity: int = 0,
    ) -> None:
        super().__init__(capacity, parent, depth)
        self.config = config or AdaptiveConfig()
        self.cpu_capacity = cpu_capacity
        rate = self.rate = self.config.sample_rate
        # The shadows' forest, capacities and hit scale (the full ones when unsampled).
        self.mask: list[bool] | None = sample_mask(len(self.parent), rate) if rate < 1 else None
        shadow_parent = self.parent if self.mask is None else sampled_forest(self.parent, self.mask)
        self.shadow_capacity = max(1, round(capacity * rate))
        self.shadow_cpu_capacity = max(1, round(cpu_capacity * rate)) if cpu_capacity else 0
        self.scale = 1.0 / rate
        self.experts = {
            name: make_block_cache(name, self.shadow_capacity, shadow_parent, self.depth)
            for name in self.config.experts
        }
        # Sampled: the full-size caches followed (the leader's; the union leader's while that
        # is not the cold start) and the recent references that warm them.
        self.follow: BlockCache | None = None
        self.union_follow: BlockCache | None = None
        self.warm = None if self.mask is None else WarmLog(self._window(capacity + cpu_capacity))
        if self.mask is not None and self.config.experts[0] != "lru":
            self.follow = make_block_cache(self.config.experts[0], capacity, parent, depth)
        self.leader = self.config.experts[0]
        self.scores = dict.fromkeys(self.experts, 0.0)
        # With a CPU tier each shadow also keeps a CPU tier of its HBM victims (ids only), so
        # the policies are scored by what they would hit in HBM + CPU: LRU of the victims, and
        # for LFU the victims by their access counts (which survive the CPU tier), as LFU's own
        # CPU tier in replay_ordered.
        self.shadow_cpu: dict[str, OrderedDict[int, None]] = {
            n: OrderedDict() for n in self.experts
        }
        # With a CPU tier, the union shadows: each expert again, as one cache as large as HBM +
        # CPU, scored by its plain prefix hits. The real CPU tier drops first the blocks the
        # union leader does not hold (cpu_key), so the union of the tiers follows the policy
        # that does best at the size of the union; while the union leader is the first expert
        # (the cold start), the CPU tier is ordered as without union shadows.
        ucap = max(1, round((capacity + cpu_capacity) * rate))
        self.union: dict[str, BlockCache] = {
            name: make_block_cache(name, ucap, shadow_parent, self.depth)
            for name in (self.config.experts if cpu_capacity else ())
        }
        self.union_leader = self.config.experts[0]
        self.union_scores = dict.fromkeys(self.union, 0.0)
        self.union_switches: list[tuple[int, str, str]] = []
        self._rekey: list[int] = []
        self._lfu_cpu: dict[int, tuple[int, float, int]] = {}
        self._lfu_heap: list[tuple[int, float, int, int]] = []
        lfu = self.experts.get("lfu")
        if cpu_capacity and isinstance(lfu, HeapCache):
            lfu.resume = self._lfu_cpu
        self.switches: list[tuple[int, str, str]] = []
        # The cost of a switch, measured: over each leader's tenure, the leader's HBM prefix hits
        # minus this cache's own (its content converging to the leader's, then equal to it).
        self.switch_costs: list[float] = []  # the tenure cost each switch closed
        self.tenure_cost = 0.0  # the current tenure's, so far
        self.last_switch_cost = 0.0  # the last closed tenure's
        self.refs = 0
        self.decayed_refs = 0.0
        self._decay = math.log(2.0) / self.config.half_life_blocks

    def lead_cache(self) -> BlockCache:
        """The full-size cache of the leader's policy this cache follows (the leader's shadow
        itself when unsampled; this cache itself while sampled and LRU leads, as its own
        fallback order is LRU's)."""
        if self.mask is None:
            return self.experts[self.leader]
        return self if self.follow is None else self.follow

    def union_lead_cache(self) -> BlockCache | None:
        """The full-size union cache of the union leader's policy (None without a CPU tier, or
        while sampled and the union leader is the cold start)."""
        if self.mask is not None:
            return self.union_follow
        return self.union.get(self.union_leader)

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        keep = math.exp(-self._decay * len(blocks))
        cached, own, n = self.cached, 0, len(blocks)
        while own < n and cached[blocks[own]]:
            own += 1
        mask, scale = self.mask, self.scale
        sub = blocks if mask is None else [b for b in blocks if mask[b]]  # the shadows' view
        lead_hit = own if self.follow is None else self.follow.prefix_hit(blocks)
        for name, cache in self.experts.items():
            hit = self._shadow_hit(name, cache, sub)
            if name == self.leader and mask is None:
                lead_hit = cache.prefix_hit(blocks) if self.cpu_capacity else hit
            self.scores[name] = keep * self.scores[name] + hit * scale
        self.tenure_cost += lead_hit - own
        for name, cache in self.union.items():
            self.union_scores[name] = keep * self.union_scores[name] + cache.prefix_hit(sub) * scale
        self.refs += len(blocks)
        self.decayed_refs = keep * self.decayed_refs + len(blocks)
        self._touch(blocks, now_s)
        lead, ulead = self.lead_cache(), self.union_lead_cache()
        cpu_cap = self.shadow_cpu_capacity
        for name, shadow in [*self.experts.items(), ("", self.follow)]:
            if shadow is None:
                continue
            gone = shadow.request(sub if name else blocks, now_s)
            if cpu_cap and name == "lfu" and isinstance(shadow, HeapCache):
                self._lfu_shadow_cpu(shadow, sub, gone)
            elif cpu_cap and name:
                cpu = self.shadow_cpu[name]
                for b in sub:
                    cpu.pop(b, None)
                for v in gone:
                    cpu[v] = None
                while len(cpu) > cpu_cap:
                    cpu.popitem(last=False)
            if shadow is lead:
                self._lead_evicted(gone)
        if self.union:
            for union in [*self.union.values(), self.union_follow]:
                if union is None:
                    continue
                gone = union.request(blocks if union is self.union_follow else sub, now_s)
                if union is ulead and self.union_leader != self.config.experts[0]:
                    self._rekey.extend(gone)
        if self.warm is not None:
            self.warm.add(blocks, now_s)
        self._maybe_switch()
        self._maybe_switch_union()
        return self._trim(self.lead_cache())

    def _maybe_switch_union(self) -> None:
        if not self.union:
            return
        cfg, scores = self.config, self.union_scores
        best = max(scores, key=scores.__getitem__)  # in expert order: first on ties
        lead = scores[best] - scores[self.union_leader]
        if best == self.union_leader or lead < max(
            cfg.switch_margin * self.decayed_refs, cfg.min_lead
        ):
            return
        self.union_switches.append((self.refs, self.union_leader, best))
        self.union_leader = best
        if (
            self.warm is not None
        ):  # sampled: a full-size union cache of the new union leader, warmed
            cap = self.capacity + self.cpu_capacity
            self.union_follow = (
                self.warm.replay(
                    make_block_cache(best, cap, self.parent, self.depth), self._window(cap)
                )
                if best != self.config.experts[0]
                else None
            )
        self.cpu_epoch += 1
        self._rekey.clear()

    def _lfu_shadow_cpu(self, cache: HeapCache, blocks: Sequence[int], gone: Sequence[int]) -> None:
        """The LFU shadow's CPU tier: victims keyed (count, last access, -depth) as in HBM; the
        least key leaves first when over ``cpu_capacity``."""
        cpu, heap, last, depth = self._lfu_cpu, self._lfu_heap, self.last, self.depth
        for b in blocks:
            cpu.pop(b, None)
        for v in gone:  # self.last is already this request's instant for its own blocks
            count, t, d = cache.count[v], last[v], -depth[v]
            cpu[v] = (count, t, d)
            heapq.heappush(heap, (count, t, d, v))
        while len(cpu) > self.shadow_cpu_capacity and heap:
            count, t, d, v = heapq.heappop(heap)
            if cpu.get(v) == (count, t, d):
                del cpu[v]
        if len(heap) > 4 * self.shadow_cpu_capacity + 1024:
            self._lfu_heap = [(*k, v) for v, k in cpu.items()]
            heapq.heapify(self._lfu_heap)

    #: added to the CPU key of a block the union leader holds (above any access count)
    UNION_HELD = 1 << 40

    def cpu_key(self, block: int, seq: int) -> tuple[int, int]:
        """While LFU leads, the real CPU tier drops the least LFU-counted leaves first, in
        offload order among equal counts; otherwise the least recently offloaded first. Once
        the union leader is not the cold-start expert, the blocks it does not hold go first
        (:attr:`UNION_HELD` added to the others' first key)."""
        lfu = self.lead_cache()
        base = lfu.count[block] if self.leader == "lfu" and isinstance(lfu, HeapCache) else 1
        ulead = self.union_lead_cache()
        if self.union and self.union_leader != self.config.experts[0] and ulead is not None:
            if block in ulead:
                base += self.UNION_HELD
        return (base, seq)

    def cpu_rekey(self) -> list[int]:
        """The blocks the union leader evicted since the last call (their :meth:`cpu_key`
        drops below the held blocks'); none while the cold-start expert is the union leader."""
        out = self._rekey if self.union_leader != self.config.experts[0] else []
        self._rekey = []
        return out

    def _shadow_hit(self, name: str, cache: BlockCache, blocks: Sequence[int]) -> int:
        if not self.cpu_capacity:
            return cache.prefix_hit(blocks)
        cpu: Container[int] = self._lfu_cpu if name == "lfu" else self.shadow_cpu[name]
        k = cache.prefix_hit(blocks)  # the HBM prefix first (no call per block), then both
        while k < len(blocks) and (blocks[k] in cache or blocks[k] in cpu):
            k += 1
        return k

    def _window(self, capacity: int) -> int:
        """Block references replayed to warm a full-size cache of ``capacity`` blocks."""
        return max(1, math.ceil(self.config.warm_window * capacity))

    def _maybe_switch(self) -> None:
        cfg = self.config
        best = max(self.scores, key=self.scores.__getitem__)  # in expert order: first on ties
        cur = self.scores[self.leader]
        lead = self.scores[best] - cur
        # A switch costs what the cache loses while its content converges to the new leader's:
        # the lead (decayed hits, what the new leader gains over one window if it keeps it) must
        # pay for it, as measured at the last switch (or so far in this tenure, if more).
        cost = cfg.switch_cost * max(self.last_switch_cost, self.tenure_cost)
        need = max(cfg.switch_margin * self.decayed_refs, cfg.min_lead, cost)
        if best == self.leader or lead < need:
            return
        self.switches.append((self.refs, self.leader, best))
        self.switch_costs.append(self.tenure_cost)
        self.last_switch_cost = self.tenure_cost
        self.tenure_cost = 0.0
        if "lfu" in (self.leader, best):
            self.cpu_epoch += 1  # the real CPU tier's order changes with the leader
        self.leader = best
        if self.warm is not None:  # sampled: a full-size cache of the new leader's, warmed
            cap = self.capacity
            self.follow = None if best == "lru" else self.warm.replay(
                make_block_cache(best, cap, self.parent, self.depth), self._window(cap)
            )  # fmt: skip
        self._restale(self.lead_cache())

    def metrics(self) -> dict[str, object]:
        """Leader now, switches made, and the shadow policies' decayed scores."""
        return {
            "leader": self.leader,
            "num_switches": len(self.switches),
            "switches": [f"{n}:{a}->{b}" for n, a, b in self.switches[:20]],
            "scores": {k: round(v, 1) for k, v in self.scores.items()},
            **(
                {
                    "union_leader": self.union_leader,
                    "union_switches": [f"{n}:{a}->{b}" for n, a, b in self.union_switches[:20]],
                }
                if self.union
                else {}
            ),
        }


def make_block_cache(
    name: str,
    capacity: int,
    parent: Sequence[int],
    depth: Sequence[int],
    *,
    cpu_capacity: int = 0,
) -> BlockCache:
    """The block cache called ``name``: ``lru``, ``lfu``, ``arc``, ``s3fifo``, ``lrfuH``,
    ``hazard``, ``learned``, ``adaptive`` or ``adaptive-sN`` (its shadows sampled at 1/N;
    ``cpu_capacity``: the CPU tier its shadow policies are scored with).

    Raises:
        ValueError: an unknown name.
    """
    if name in ("lru", "lfu"):
        return HeapCache(capacity, parent, depth, lfu=name == "lfu")
    half_life = lrfu_half_life(name)
    if half_life is not None:
        return LrfuCache(capacity, parent, depth, half_life)
    if name == "arc":
        return ArcBlocks(capacity, parent, depth)
    if name == "s3fifo":
        return S3FifoBlocks(capacity, parent, depth)
    if name == "learned":
        return LearnedCache(capacity, parent, depth)
    if name == "hazard":
        return HazardCache(capacity, parent, depth)
    if name == "adaptive":
        return AdaptiveCache(capacity, parent, depth, cpu_capacity=cpu_capacity)
    rate = adaptive_sample_rate(name)
    if rate is not None:
        cfg = AdaptiveConfig(sample_rate=rate)
        return AdaptiveCache(capacity, parent, depth, cfg, cpu_capacity=cpu_capacity)
    raise ValueError(f"unknown block cache {name!r}")
