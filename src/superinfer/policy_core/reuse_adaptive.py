"""Block-level prefix caches that process whole requests, and the adaptive reuse predictor.

Every cache here holds KV blocks identified by dense ids ``0..U-1`` of a prefix forest
(``parent[b]``: the block before ``b`` in every prompt holding it, -1 for a first block), keeps
its HBM content prefix-closed (a block leaves only when none of its children is cached) and
offers one call per request, :meth:`BlockCache.request`, which makes every block of the request
cached and returns the blocks that left to bring the cache back within ``capacity``.

- :class:`HeapCache` -- LRU (key: last access instant) or LFU (key: accesses since insertion,
  then last access), ties deeper first then by id, the placement planner's order.
- :class:`ArcBlocks`, :class:`S3FifoBlocks` -- ARC and S3-FIFO
  (:mod:`superinfer.policy_core.kv_baselines`), fed a request's blocks deepest first, so that
  inside a request a parent is more recent than its child.
- :class:`LearnedCache` -- the learned reuse predictor (:mod:`superinfer.policy_core.reuse`)
  through the placement planner.
- :class:`AdaptiveCache` -- the adaptive reuse predictor. It runs the simple policies above and
  the learned one as shadow caches of the same capacity on the same requests (ids only, no KV),
  scores each by its exponentially decayed prefix-hit blocks (half-life ``half_life_blocks``
  block references), and
  makes its own cache follow the current leader: when over capacity it evicts first the blocks
  the leader does not hold (oldest first, deeper first), so its content converges to the
  leader's and, while the leader stays the same, equals it. It starts as LRU (cold start: LRU's
  hits exactly until another policy leads by the switching margin) and switches leader only when
  another policy's score exceeds the leader's by ``switch_margin`` (in hit rate over the decayed
  window), so it adapts when the structure shifts. With a CPU tier, each shadow also keeps an LRU
  of its HBM victims as large as the CPU tier and is scored by its hits in both. The per-request
  work is the simple shadow caches' (O(blocks) each, amortized), the learned one's (O(cache)
  numpy work per eviction) and O(log cache) per eviction of its own; a switch costs one O(cache)
  pass.

Pure: stdlib and numpy.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from numpy.typing import NDArray

from superinfer.policy_core.kv_baselines import ArcCache, S3FifoCache
from superinfer.policy_core.kv_placement_plan import PlacementPlanner
from superinfer.policy_core.reuse import NodeColumns, ReusePredictor, ReusePredictorConfig

__all__ = [
    "ADAPTIVE_EXPERTS",
    "AdaptiveCache",
    "AdaptiveConfig",
    "ArcBlocks",
    "BlockCache",
    "HeapCache",
    "LearnedCache",
    "S3FifoBlocks",
    "make_block_cache",
]


class BlockCache:
    """A block cache of ``capacity`` blocks over a prefix forest.

    Args:
        capacity: blocks kept (>= 1).
        parent: shape (U,), each block's parent id, -1 for a first block.
        depth: shape (U,), each block's index in its prompts.
    """

    name = "base"

    def __init__(self, capacity: int, parent: Sequence[int], depth: Sequence[int]) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.parent = list(parent)
        self.depth = list(depth)
        self.kids = [0] * len(self.parent)  # cached children per block

    def __contains__(self, block: object) -> bool:
        raise NotImplementedError

    def prefix_hit(self, blocks: Sequence[int]) -> int:
        """Leading blocks of ``blocks`` cached now."""
        k = 0
        while k < len(blocks) and blocks[k] in self:
            k += 1
        return k

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        """Serve one request (blocks root first); returns the blocks that left the cache."""
        raise NotImplementedError

    def _entered(self, b: int) -> None:
        p = self.parent[b]
        if p >= 0:
            self.kids[p] += 1

    def _left(self, b: int) -> None:
        p = self.parent[b]
        if p >= 0:
            self.kids[p] -= 1

    def _leaf(self, b: int) -> bool:
        return self.kids[b] == 0


class HeapCache(BlockCache):
    """LRU (``lfu=False``) or LFU with lazy heaps: the least key leaves first; a key never
    increases from a parent to its child, so the least key is a leaf."""

    def __init__(
        self, capacity: int, parent: Sequence[int], depth: Sequence[int], *, lfu: bool = False
    ) -> None:
        super().__init__(capacity, parent, depth)
        self.lfu = lfu
        self.name = "lfu" if lfu else "lru"
        self.key: list[tuple[float, ...] | None] = [None] * len(self.parent)
        self.count = [0] * len(self.parent)
        self.heap: list[tuple[float, ...]] = []
        self.size = 0

    def __contains__(self, block: object) -> bool:
        return self.key[cast(int, block)] is not None

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        for b in blocks:
            if self.key[b] is None:
                self.size += 1
                self.count[b] = 1
                self._entered(b)
            else:
                self.count[b] += 1
            k = (
                (self.count[b], now_s, -self.depth[b], b)
                if self.lfu
                else (now_s, -self.depth[b], b)
            )
            self.key[b] = k
            heapq.heappush(self.heap, k)
        out: list[int] = []
        while self.size > self.capacity and self.heap:
            entry = heapq.heappop(self.heap)
            b = int(entry[-1])
            if self.key[b] == entry:
                self.key[b] = None
                self.size -= 1
                self._left(b)
                out.append(b)
        return out


class _KeyedAlgo(BlockCache):
    """A :mod:`kv_baselines` algorithm fed a request's blocks deepest first."""

    algo: ArcCache[int] | S3FifoCache[int]

    def __contains__(self, block: object) -> bool:
        return block in self.algo

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        out: list[int] = []
        for b in reversed(blocks):
            was = b in self.algo
            gone = self.algo.access(b)
            if not was:
                self._entered(b)
            for v in gone:
                self._left(v)
            out.extend(gone)
        return out


class ArcBlocks(_KeyedAlgo):
    """ARC over blocks (leaves only)."""

    name = "arc"

    def __init__(self, capacity: int, parent: Sequence[int], depth: Sequence[int]) -> None:
        super().__init__(capacity, parent, depth)
        self.algo = ArcCache(capacity, evictable=self._leaf)


class S3FifoBlocks(_KeyedAlgo):
    """S3-FIFO over blocks (leaves only)."""

    name = "s3fifo"

    def __init__(self, capacity: int, parent: Sequence[int], depth: Sequence[int]) -> None:
        super().__init__(capacity, parent, depth)
        self.algo = S3FifoCache(capacity, evictable=self._leaf)


#: The shadow policies of :class:`AdaptiveCache`, in tie-break order (first wins a tie).
ADAPTIVE_EXPERTS = ("lru", "arc", "s3fifo", "lfu", "learned")


@dataclass(frozen=True, slots=True)
class AdaptiveConfig:
    """Hyperparameters of :class:`AdaptiveCache` (chosen a priori, not tuned per trace).

    Attributes:
        experts: shadow policies (names of :func:`make_block_cache`); the first is the cold
            start.
        half_life_blocks: half-life of the hit scores, in block references.
        switch_margin: a policy takes the lead when its score exceeds the leader's by this
            fraction of the decayed block references (a lead in hit rate, 0.003 = 0.3 points)
            and by ``min_lead`` hits.
        min_lead: absolute lead needed, in decayed hit blocks.

    Raises:
        ValueError: an unknown expert or a value out of range.
    """

    experts: tuple[str, ...] = ADAPTIVE_EXPERTS
    half_life_blocks: float = 20_000.0
    switch_margin: float = 0.003
    min_lead: float = 5.0

    def __post_init__(self) -> None:
        known = ("lru", "lfu", "arc", "s3fifo", "learned")
        if not self.experts or any(e not in known for e in self.experts):
            raise ValueError(f"experts must be among {', '.join(known)}: {self.experts}")
        if not self.half_life_blocks > 0:
            raise ValueError(f"half_life_blocks must be > 0, got {self.half_life_blocks}")
        if self.switch_margin < 0 or self.min_lead < 0:
            raise ValueError("switch_margin and min_lead must be >= 0")


class AdaptiveCache(BlockCache):
    """The adaptive reuse predictor: follows the simple policy with the most recent hits.

    Attributes:
        experts: the shadow caches by name.
        leader: the policy followed now.
        scores: decayed prefix-hit blocks of each shadow cache.
        switches: (block references seen, old leader, new leader) of each switch.
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
        self.experts = {
            name: make_block_cache(name, capacity, self.parent, self.depth)
            for name in self.config.experts
        }
        self.leader = self.config.experts[0]
        self.scores = dict.fromkeys(self.experts, 0.0)
        # With a CPU tier each shadow also keeps an LRU of its HBM victims (ids only), so the
        # policies are scored by what they would hit in HBM + CPU.
        self.shadow_cpu: dict[str, OrderedDict[int, None]] = {
            n: OrderedDict() for n in self.experts
        }
        self.switches: list[tuple[int, str, str]] = []
        self.refs = 0
        self.decayed_refs = 0.0
        self.cached = [False] * len(self.parent)
        self.last = [0.0] * len(self.parent)
        self.size = 0
        self.stale: list[tuple[float, int, int]] = []  # (last access, -depth, block)
        self.lru: list[tuple[float, int, int]] = []  # every cached block (fallback)
        self._decay = math.log(2.0) / self.config.half_life_blocks

    def __contains__(self, block: object) -> bool:
        return bool(self.cached[cast(int, block)])

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        keep = math.exp(-self._decay * len(blocks))
        for name, cache in self.experts.items():
            self.scores[name] = keep * self.scores[name] + self._shadow_hit(name, cache, blocks)
        self.refs += len(blocks)
        self.decayed_refs = keep * self.decayed_refs + len(blocks)
        for b in blocks:
            if not self.cached[b]:
                self.cached[b] = True
                self.size += 1
                self._entered(b)
            self.last[b] = now_s
            heapq.heappush(self.lru, (now_s, -self.depth[b], b))
        lead = self.experts[self.leader]
        for name, cache in self.experts.items():
            gone = cache.request(blocks, now_s)
            if self.cpu_capacity:
                cpu = self.shadow_cpu[name]
                for b in blocks:
                    cpu.pop(b, None)
                for v in gone:
                    cpu[v] = None
                while len(cpu) > self.cpu_capacity:
                    cpu.popitem(last=False)
            if cache is lead:
                for v in gone:
                    if self.cached[v]:
                        heapq.heappush(self.stale, (self.last[v], -self.depth[v], v))
        self._maybe_switch()
        return self._trim()

    def _shadow_hit(self, name: str, cache: BlockCache, blocks: Sequence[int]) -> int:
        if not self.cpu_capacity:
            return cache.prefix_hit(blocks)
        cpu = self.shadow_cpu[name]
        k = 0
        while k < len(blocks) and (blocks[k] in cache or blocks[k] in cpu):
            k += 1
        return k

    def _maybe_switch(self) -> None:
        cfg = self.config
        best = max(self.experts, key=lambda n: self.scores[n])
        cur = self.scores[self.leader]
        lead = self.scores[best] - cur
        if best == self.leader or lead < max(cfg.switch_margin * self.decayed_refs, cfg.min_lead):
            return
        self.switches.append((self.refs, self.leader, best))
        self.leader = best
        leader_cache = self.experts[best]
        self.stale = [
            (self.last[b], -self.depth[b], b)
            for b in range(len(self.cached))
            if self.cached[b] and b not in leader_cache
        ]
        heapq.heapify(self.stale)

    def _pop_valid(
        self, heap: list[tuple[float, int, int]], lead: BlockCache, stale: bool
    ) -> int | None:
        held: list[tuple[float, int, int]] = []
        found = None
        while heap:
            entry = heapq.heappop(heap)
            b = entry[2]
            if not self.cached[b] or self.last[b] != entry[0] or (stale and b in lead):
                continue  # outdated entry
            if self.kids[b]:
                held.append(entry)
                continue
            found = b
            break
        for entry in held:
            heapq.heappush(heap, entry)
        return found

    def _trim(self) -> list[int]:
        out: list[int] = []
        lead = self.experts[self.leader]
        while self.size > self.capacity:
            b = self._pop_valid(self.stale, lead, True)
            if b is None:
                b = self._pop_valid(self.lru, lead, False)
            if b is None:
                break
            self.cached[b] = False
            self.size -= 1
            self._left(b)
            out.append(b)
        if len(self.lru) > 4 * self.capacity + 1024:
            self.lru = [(self.last[b], -self.depth[b], b) for b in range(len(self.cached))
                        if self.cached[b]]  # fmt: skip
            heapq.heapify(self.lru)
        return out

    def metrics(self) -> dict[str, object]:
        """Leader now, switches made, and the shadow policies' decayed scores."""
        return {
            "leader": self.leader,
            "num_switches": len(self.switches),
            "switches": [f"{n}:{a}->{b}" for n, a, b in self.switches[:20]],
            "scores": {k: round(v, 1) for k, v in self.scores.items()},
        }


class LearnedCache(BlockCache):
    """The learned reuse predictor of :mod:`superinfer.policy_core.reuse` (logistic model of
    P(reused within the cache's characteristic time), LRU until calibrated) evicting through the
    :class:`~superinfer.policy_core.kv_placement_plan.PlacementPlanner`, as ``cache-eval``'s
    ``predictor`` replays it without a CPU tier; O(cache) numpy work per eviction."""

    name = "learned"

    def __init__(
        self,
        capacity: int,
        parent: Sequence[int],
        depth: Sequence[int],
        tokens: Sequence[int] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(capacity, parent, depth)
        u = len(self.parent)
        self.model = ReusePredictor(ReusePredictorConfig(seed=seed))
        self.planner = PlacementPlanner()
        self._parent = np.asarray(self.parent, dtype=np.int64)
        self._depth = np.asarray(self.depth, dtype=np.int64)
        self._tokens = np.ones(u) if tokens is None else np.asarray(tokens, dtype=np.float64)
        self.cached = np.zeros(u, dtype=bool)
        self.last = np.full(u, -np.inf)
        self.first = np.zeros(u)
        self.accesses = np.zeros(u)
        self.interval = np.full(u, np.nan)
        self.pos = np.full(u, -1, dtype=np.int64)
        self.size = 0

    def __contains__(self, block: object) -> bool:
        return bool(self.cached[cast(int, block)])

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        b = np.asarray(blocks, dtype=np.int64)
        w = self.model.config.interval_weight
        seen = self.last[b] > -np.inf
        gap = now_s - self.last[b]
        old = self.interval[b]
        self.interval[b] = np.where(
            seen, np.where(np.isnan(old), gap, w * gap + (1 - w) * old), np.nan
        )
        self.first[b[~seen]] = now_s
        self.last[b] = now_s
        self.accesses[b] += 1
        self.size += int((~self.cached[b]).sum())
        self.cached[b] = True
        need = self.size - self.capacity
        if need <= 0:
            return []
        cached = np.flatnonzero(self.cached)
        self.pos[cached] = np.arange(len(cached))
        par = self._parent[cached]
        ppos = np.where(par >= 0, self.pos[np.maximum(par, 0)], -1)
        children = np.bincount(ppos[ppos >= 0], minlength=len(cached)).astype(np.float64)

        def cols_of(idx: NDArray[np.int64]) -> NodeColumns:
            c = cached[idx]
            return NodeColumns(
                age_s=now_s - self.last[c],
                since_first_s=now_s - self.first[c],
                num_accesses=self.accesses[c],
                interval_ewma_s=self.interval[c],
                depth=self._depth[c].astype(np.float64),
                tokens_per_block=self._tokens[c],
                num_children=children[idx],
            )

        self.model.learn(now_s, lambda keys: self.last[keys])
        sample = self.model.sample_indices(len(cached))
        self.model.add_samples(cached[sample], cols_of(sample), now_s)
        plan = self.planner.plan_arrays(
            score=lambda idx: self.model.scores(cols_of(idx)),
            parent=ppos,
            depth=self._depth[cached],
            num_blocks=np.ones(len(cached), dtype=np.int64),
            in_hbm=np.ones(len(cached), dtype=bool),
            needed_hbm_blocks=need,
            free_hbm_blocks=0,
            free_cpu_blocks=0,
            total_hbm_blocks=self.capacity,
            has_cpu_tier=False,
            calibrated=self.model.calibrated,
            pins=False,
        )
        gone = cached[plan.drop]
        self.cached[gone] = False
        self.size -= len(gone)
        self.model.observe_evictions(now_s - self.last[gone])
        out: list[int] = gone.tolist()
        return out


def make_block_cache(
    name: str,
    capacity: int,
    parent: Sequence[int],
    depth: Sequence[int],
    *,
    cpu_capacity: int = 0,
) -> BlockCache:
    """The block cache called ``name``: ``lru``, ``lfu``, ``arc``, ``s3fifo``, ``learned`` or
    ``adaptive`` (``cpu_capacity``: the CPU tier its shadow policies are scored with).

    Raises:
        ValueError: an unknown name.
    """
    if name in ("lru", "lfu"):
        return HeapCache(capacity, parent, depth, lfu=name == "lfu")
    if name == "arc":
        return ArcBlocks(capacity, parent, depth)
    if name == "s3fifo":
        return S3FifoBlocks(capacity, parent, depth)
    if name == "learned":
        return LearnedCache(capacity, parent, depth)
    if name == "adaptive":
        return AdaptiveCache(capacity, parent, depth, cpu_capacity=cpu_capacity)
    raise ValueError(f"unknown block cache {name!r}")
