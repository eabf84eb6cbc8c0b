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
import struct
from collections.abc import Container, Mapping, Sequence
from itertools import islice

from superinfer.policy_core.kv_baselines import ArcCache, S3FifoCache

__all__ = ["ArcBlocks", "BlockCache", "HeapCache", "LrfuCache", "S3FifoBlocks"]

_PACK_DOUBLE = struct.Struct("<d").pack
_SIGN = 1 << 63


def _float_order(x: float) -> int:
    """A non-negative int of at most 64 bits ordered as the float ``x`` (its IEEE bits, the
    negative ones reversed; -0.0 as 0.0; not for NaN): ``_float_order(a) < _float_order(b)``
    exactly when ``a < b``."""
    i = int.from_bytes(_PACK_DOUBLE(x + 0.0), "little", signed=True)
    return (i ^ (_SIGN - 1) if i < 0 else i) + _SIGN


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

    key: list[int | None]  # the block's key, its heap entry (_int_keys), or None
    heap: list[int]
    size: int
    _low: list[int]
    _mask: int
    _tshift: int

    def __contains__(self, block: object) -> bool:
        return self.key[block] is not None  # type: ignore[call-overload]

    def prefix_hit(self, blocks: Sequence[int]) -> int:
        key, k, n = self.key, 0, len(blocks)
        while k < n and key[blocks[k]] is not None:
            k += 1
        return k

    def _int_keys(self) -> None:
        """Set up keys as ints: a key is ``(order << _tshift) + _low[b]``, ordered as the tuple
        ``(order, -depth[b], b)``, ``_low[b] = (max depth - depth[b]) << bits | b`` (``bits``
        enough for a block id); int comparisons keep the heap cheap."""
        bits = max(1, len(self.parent).bit_length())
        dmax = max(self.depth, default=0)
        self._low = [((dmax - d) << bits) | b for b, d in enumerate(self.depth)]
        self._mask = (1 << bits) - 1
        self._tshift = bits + max(1, (dmax - min(self.depth, default=0)).bit_length())

    def _evict(self, size: int) -> list[int]:
        """Pop the lazy heap until ``size`` cached blocks fit the capacity, skipping entries no
        longer a block's key; the blocks evicted, in order (``self.size`` set)."""
        key, heap, parent, kids, mask = self.key, self.heap, self.parent, self.kids, self._mask
        out: list[int] = []
        pop, capacity = heapq.heappop, self.capacity
        while size > capacity and heap:
            entry = pop(heap)
            v = entry & mask
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
        # A key orders (count (LFU only), last access, -depth, block): the count above the
        # access instant's order bits (_float_order) in the order of _int_keys.
        self._int_keys()
        self._cshift = self._tshift + 64
        u = len(self.parent)
        self.key: list[int | None] = [None] * u
        self.count = [0] * u
        self.heap: list[int] = []
        self.size = 0

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        # The bookkeeping of BlockCache._entered / _left inlined (the hottest loop of a replay).
        key, count, low, parent, kids = self.key, self.count, self._low, self.parent, self.kids
        heap, push = self.heap, heapq.heappush
        size, resume = self.size, self.resume
        base = _float_order(now_s) << self._tshift
        if self.lfu:
            cshift = self._cshift
            for b in blocks:
                if key[b] is None:
                    size += 1
                    count[b] = count[b] + 1 if resume is not None and b in resume else 1
                    p = parent[b]
                    if p >= 0:
                        kids[p] += 1
                else:
                    count[b] += 1
                k = (count[b] << cshift) + base + low[b]
                key[b] = k
                push(heap, k)
        else:
            for b in blocks:
                if key[b] is None:
                    size += 1
                    count[b] = count[b] + 1 if resume is not None and b in resume else 1
                    p = parent[b]
                    if p >= 0:
                        kids[p] += 1
                else:
                    count[b] += 1
                k = base + low[b]
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
        self.key = [None] * u  # (_float_order(log2 F + t_last / half_life), -depth, block)
        self.heap = []
        self.size = 0
        self._int_keys()

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        key, log_f, t_last = self.key, self.log_f, self.t_last
        parent, kids, heap, push = self.parent, self.kids, self.heap, heapq.heappush
        rate = 1.0 / self.half_life_s
        size, rate_now, log2 = self.size, rate * now_s, math.log2
        low, tshift, pack, from_bytes = self._low, self._tshift, _PACK_DOUBLE, int.from_bytes
        for b in blocks:
            x = log_f[b] - rate * (now_s - t_last[b])  # log2 of the old F decayed to now
            f = x + log2(1.0 + 2.0**-x) if x > -60.0 else 0.0  # log2(1 + 2^x)
            log_f[b] = f
            t_last[b] = now_s
            if key[b] is None:
                size += 1
                p = parent[b]
                if p >= 0:
                    kids[p] += 1
            i = from_bytes(pack(f + rate_now + 0.0), "little", signed=True)  # _float_order
            k = (((i ^ (_SIGN - 1) if i < 0 else i) + _SIGN) << tshift) + low[b]
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


def _first_leaf(od: Mapping[int, object], kids: list[int]) -> int | None:
    """The first key of ``od`` with no cached child (``kv_baselines._first`` with the leaf
    predicate read from ``kids`` directly)."""
    for key in od:
        if not kids[key]:
            return key
    return None


class _ArcLeaves(ArcCache[int]):
    """:class:`ArcCache` whose evictable keys are the blocks with no cached child (``kids[b] ==
    0``), read from the list in REPLACE instead of through a predicate call per key."""

    def __init__(self, capacity: int, kids: list[int]) -> None:
        super().__init__(capacity, evictable=lambda b: kids[b] == 0)
        self._kids = kids

    def _replace(self, key: int, out: list[int]) -> None:
        t1, t2, kids = self.t1, self.t2, self._kids
        n1 = len(t1)
        from_t1 = n1 >= 1 and ((key in self.b2 and n1 == self.p) or n1 > self.p)
        first, second = (t1, t2) if from_t1 else (t2, t1)
        victim = _first_leaf(first, kids)
        src = first
        if victim is None:
            victim, src = _first_leaf(second, kids), second
        if victim is None:
            return  # nothing may leave: the cache stays over capacity
        del src[victim]
        (self.b1 if src is t1 else self.b2)[victim] = None
        out.append(victim)


class _S3FifoLeaves(S3FifoCache[int]):
    """:class:`S3FifoCache` whose evictable keys are the blocks with no cached child (``kids[b]
    == 0``), read from the list in its eviction scans instead of through a predicate call."""

    def __init__(self, capacity: int, kids: list[int]) -> None:
        super().__init__(capacity, evictable=lambda b: kids[b] == 0)
        self._kids = kids

    def _evict_small(self) -> int | None:
        small, main, freq, kids = self.small, self.main, self.freq, self._kids
        passed = 0
        while small and passed < 16:
            tail = next(iter(small))
            if freq[tail] >= 1:  # accessed while in S: promoted to M, counter cleared
                del small[tail]
                freq[tail] = 0
                main[tail] = None
                continue
            if kids[tail]:
                passed += 1
                if passed > len(small):
                    return None
                small.move_to_end(tail)
                continue
            del small[tail]
            del freq[tail]
            return self._to_ghost(tail)
        if not small:
            return None
        # Many passed over: the rest of the first pass over S (the keys not yet rotated, in
        # order; S gains no key meanwhile) from a snapshot, without an iterator per step. The
        # step-by-step loop would then meet a rotated key again and give up (``passed`` would
        # exceed S's size), or find S empty: None either way.
        move = small.move_to_end
        for tail in list(islice(small, len(small) - passed)):
            if freq[tail] >= 1:
                del small[tail]
                freq[tail] = 0
                main[tail] = None
            elif kids[tail]:
                move(tail)
            else:
                del small[tail]
                del freq[tail]
                return self._to_ghost(tail)
        return None

    def _to_ghost(self, key: int) -> int:
        ghost = self.ghost
        ghost[key] = None
        if len(ghost) > self.ghost_size:
            ghost.popitem(last=False)
        return key

    def _evict_main(self) -> int | None:
        main, freq, kids = self.main, self.freq, self._kids
        move = main.move_to_end
        passed = 0
        while main:
            tail = next(iter(main))
            f = freq[tail]
            if f > 0:
                freq[tail] = f - 1
                move(tail)
                continue
            if kids[tail]:
                passed += 1
                if passed > len(main):
                    return None
                move(tail)
                continue
            del main[tail]
            del freq[tail]
            return tail
        return None


class ArcBlocks(_KeyedAlgo):
    """ARC over blocks (leaves only)."""

    name = "arc"

    def __init__(self, capacity: int, parent: Sequence[int], depth: Sequence[int]) -> None:
        super().__init__(capacity, parent, depth)
        self.algo = self._arc = _ArcLeaves(capacity, self.kids)
        self._held = (self._arc.t1, self._arc.t2)

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        # _KeyedAlgo.request with ArcCache.access's hit cases inlined (no call per hit).
        out: list[int] = []
        algo = self._arc
        t1, t2 = algo.t1, algo.t2
        access, move, parent, kids = algo.access, t2.move_to_end, self.parent, self.kids
        for b in reversed(blocks):
            if b in t1:  # case I
                del t1[b]
                t2[b] = None
                continue
            if b in t2:
                move(b)
                continue
            gone = access(b)
            p = parent[b]
            if p >= 0:
                kids[p] += 1
            for v in gone:
                p = parent[v]
                if p >= 0:
                    kids[p] -= 1
            out.extend(gone)
        if out:
            # as _KeyedAlgo.request: blocks that left and came back inside the request stay
            out = [v for v in dict.fromkeys(out) if not (v in t1 or v in t2)]
        return out


class S3FifoBlocks(_KeyedAlgo):
    """S3-FIFO over blocks (leaves only)."""

    name = "s3fifo"

    def __init__(self, capacity: int, parent: Sequence[int], depth: Sequence[int]) -> None:
        super().__init__(capacity, parent, depth)
        self.algo = self._s3 = _S3FifoLeaves(capacity, self.kids)
        self._held = (self._s3.freq, {})

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        # _KeyedAlgo.request with S3FifoCache.access's hit case inlined (no call per hit).
        out: list[int] = []
        algo = self._s3
        freq, top = algo.freq, algo.MAX_FREQ
        access, parent, kids = algo.access, self.parent, self.kids
        for b in reversed(blocks):
            f = freq.get(b)
            if f is not None:
                freq[b] = f + 1 if f < top else top
                continue
            gone = access(b)
            p = parent[b]
            if p >= 0:
                kids[p] += 1
            for v in gone:
                p = parent[v]
                if p >= 0:
                    kids[p] -= 1
            out.extend(gone)
        if out:
            # as _KeyedAlgo.request: blocks that left and came back inside the request stay
            out = [v for v in dict.fromkeys(out) if v not in freq]
        return out
