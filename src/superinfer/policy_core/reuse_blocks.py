"""Block-level prefix caches that process whole requests: the simple policies.

Every cache here holds KV blocks identified by dense ids ``0..U-1`` of a prefix forest
(``parent[b]``: the block before ``b`` in every prompt holding it, -1 for a first block), keeps
its HBM content prefix-closed (a block leaves only when none of its children is cached) and
offers one call per request, :meth:`BlockCache.request`, which makes every block of the request
cached and returns the blocks that left to bring the cache back within ``capacity``.

- :class:`HeapCache` -- LRU (key: last access instant) or LFU (key: accesses since insertion,
  then last access), ties deeper first then by id, the placement planner's order.
- :class:`LrfuCache` -- LRFU (Lee et al., IEEE Trans. Computers 2001): each block's decayed
  access count ``F = sum 2^(-(now - t_i) / half_life)`` over every access it ever had (a
  ghost history, kept across evictions), least first; between LRU (short half-life) and LFU
  with ghost counts (long).
- :class:`ArcBlocks`, :class:`S3FifoBlocks` -- ARC and S3-FIFO
  (:mod:`superinfer.policy_core.kv_baselines`), fed a request's blocks deepest first, so that
  inside a request a parent is more recent than its child.

The learned predictor's cache is :class:`superinfer.policy_core.reuse_learned.LearnedCache`,
the adaptive one's :class:`superinfer.policy_core.reuse_adaptive.AdaptiveCache`. Pure stdlib.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Container, Mapping, Sequence
from typing import Any

from superinfer.policy_core.kv_baselines import ArcCache, S3FifoCache

__all__ = ["ArcBlocks", "BlockCache", "HeapCache", "LrfuCache", "S3FifoBlocks"]


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

    #: changes whenever :meth:`cpu_key` would order the CPU tier differently (a replay then
    #: re-keys the blocks it holds there)
    cpu_epoch = 0

    def cpu_key(self, block: int, seq: int) -> tuple[int, int]:
        """Order of ``block`` in the CPU tier a replay keeps below this cache (least leaves
        first), given its offload sequence number ``seq``: here ``(1, seq)``, the least recently
        offloaded first."""
        return (1, seq)

    def cpu_rekey(self) -> list[int]:
        """Blocks whose :meth:`cpu_key` may have changed since the last call (a replay re-keys
        those it holds in its CPU tier); here none."""
        return []

    def content(self) -> list[int]:
        """The cached blocks, by id (O(U))."""
        return [b for b in range(len(self.parent)) if b in self]

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


class _KeyedBlocks(BlockCache):
    """A block cache whose ``key[b]`` is ``None`` exactly when block ``b`` is not cached
    (membership and the cached prefix read it without a call per block)."""

    key: list[Any]  # a tuple whose last item is the block (its heap entry), or None
    heap: list[Any]
    size: int

    def __contains__(self, block: object) -> bool:
        return self.key[block] is not None  # type: ignore[call-overload]

    def prefix_hit(self, blocks: Sequence[int]) -> int:
        key, k, n = self.key, 0, len(blocks)
        while k < n and key[blocks[k]] is not None:
            k += 1
        return k

    def _evict(self, size: int) -> list[int]:
        """Pop the lazy heap until ``size`` cached blocks fit the capacity, skipping entries no
        longer a block's key; the blocks evicted, in order (``self.size`` set)."""
        key, heap, parent, kids = self.key, self.heap, self.parent, self.kids
        out: list[int] = []
        pop = heapq.heappop
        while size > self.capacity and heap:
            entry = pop(heap)
            v = int(entry[-1])
            if key[v] == entry:
                key[v] = None
                size -= 1
                p = parent[v]
                if p >= 0:
                    kids[p] -= 1
                out.append(v)
        self.size = size
        return out


class HeapCache(_KeyedBlocks):
    """LRU (``lfu=False``) or LFU with lazy heaps: the least key leaves first; a key never
    increases from a parent to its child, so the least key is a leaf.

    ``resume`` (LFU with a CPU tier): a container of the blocks held in a CPU tier; a block
    found there when it re-enters keeps counting its accesses (``count + 1``) instead of
    restarting at 1, as :func:`~superinfer.harness.offline.cache_replay.replay_ordered`'s LFU
    counts accesses since a block entered HBM or CPU.
    """

    #: blocks whose access count survives their eviction (a CPU tier), or None
    resume: Container[int] | None = None

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

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        # The bookkeeping of BlockCache._entered / _left inlined (the hottest loop of a replay).
        key, count, depth, parent, kids = self.key, self.count, self.depth, self.parent, self.kids
        heap, push, lfu = self.heap, heapq.heappush, self.lfu
        size, resume = self.size, self.resume
        for b in blocks:
            if key[b] is None:
                size += 1
                count[b] = count[b] + 1 if resume is not None and b in resume else 1
                p = parent[b]
                if p >= 0:
                    kids[p] += 1
            else:
                count[b] += 1
            k = (count[b], now_s, -depth[b], b) if lfu else (now_s, -depth[b], b)
            key[b] = k
            push(heap, k)
        return self._evict(size)


class LrfuCache(_KeyedBlocks):
    """LRFU over blocks with a lazy heap: the least decayed access count leaves first.

    ``F`` decays at the same rate for every block, so the order of two blocks changes only when
    one is accessed: the heap key is ``log2 F`` at the last access plus ``t_last / half_life``
    (the order of ``F`` at any later instant), ties deeper first, then by id. A child is only
    accessed with its parent, so its ``F`` never exceeds its parent's and the least key is a
    leaf. O(log cache) per block.

    Args:
        capacity, parent, depth: as :class:`BlockCache`.
        half_life_s: the half-life of an access's weight, s (> 0).

    Raises:
        ValueError: ``half_life_s <= 0``.
    """

    def __init__(
        self, capacity: int, parent: Sequence[int], depth: Sequence[int], half_life_s: float
    ) -> None:
        super().__init__(capacity, parent, depth)
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        self.half_life_s = half_life_s
        self.name = f"lrfu{half_life_s:g}"
        u = len(self.parent)
        self.log_f = [-math.inf] * u  # log2 F at the last access (kept across evictions)
        self.t_last = [0.0] * u
        self.key: list[tuple[float, int, int] | None] = [None] * u
        self.heap: list[tuple[float, int, int]] = []
        self.size = 0

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        key, log_f, t_last, depth = self.key, self.log_f, self.t_last, self.depth
        parent, kids, heap, push = self.parent, self.kids, self.heap, heapq.heappush
        rate = 1.0 / self.half_life_s
        size = self.size
        for b in blocks:
            x = log_f[b] - rate * (now_s - t_last[b])  # log2 of the old F decayed to now
            f = x + math.log2(1.0 + 2.0**-x) if x > -60.0 else 0.0  # log2(1 + 2^x)
            log_f[b] = f
            t_last[b] = now_s
            if key[b] is None:
                size += 1
                p = parent[b]
                if p >= 0:
                    kids[p] += 1
            k = (f + rate * now_s, -depth[b], b)
            key[b] = k
            push(heap, k)
        out = self._evict(size)
        if len(self.heap) > 4 * self.capacity + 1024:
            self.heap = [k for k in key if k is not None]
            heapq.heapify(self.heap)
        return out


class _KeyedAlgo(BlockCache):
    """A :mod:`kv_baselines` algorithm fed a request's blocks deepest first."""

    algo: ArcCache[int] | S3FifoCache[int]
    #: The algorithm's dicts whose keys are the cached blocks (membership without a call).
    _held: tuple[Mapping[int, object], Mapping[int, object]]

    def __contains__(self, block: object) -> bool:
        return block in self.algo

    def prefix_hit(self, blocks: Sequence[int]) -> int:
        m1, m2 = self._held
        k, n = 0, len(blocks)
        while k < n and (blocks[k] in m1 or blocks[k] in m2):
            k += 1
        return k

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        out: list[int] = []
        m1, m2 = self._held
        access, parent, kids = self.algo.access, self.parent, self.kids
        for b in reversed(blocks):
            was = b in m1 or b in m2
            gone = access(b)
            if not was:
                p = parent[b]
                if p >= 0:
                    kids[p] += 1
            for v in gone:
                p = parent[v]
                if p >= 0:
                    kids[p] -= 1
            out.extend(gone)
        if out:
            # A block that left while the request was fed and came back later in it (its own
            # cached tail, a leaf until its new child entered) is cached: not a departure.
            out = [v for v in dict.fromkeys(out) if not (v in m1 or v in m2)]
        return out


class ArcBlocks(_KeyedAlgo):
    """ARC over blocks (leaves only)."""

    name = "arc"

    def __init__(self, capacity: int, parent: Sequence[int], depth: Sequence[int]) -> None:
        super().__init__(capacity, parent, depth)
        self.algo = ArcCache(capacity, evictable=self._leaf)
        self._held = (self.algo.t1, self.algo.t2)


class S3FifoBlocks(_KeyedAlgo):
    """S3-FIFO over blocks (leaves only)."""

    name = "s3fifo"

    def __init__(self, capacity: int, parent: Sequence[int], depth: Sequence[int]) -> None:
        super().__init__(capacity, parent, depth)
        self.algo = S3FifoCache(capacity, evictable=self._leaf)
        self._held = (self.algo.freq, {})
