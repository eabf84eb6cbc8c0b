"""A block cache that follows another cache's content (the adaptive reuse predictor's own
cache, :class:`superinfer.policy_core.reuse_adaptive.AdaptiveCache`, follows its leader).

:class:`FollowingCache` keeps its blocks prefix-closed and, when over capacity, evicts first the
cached leaves its *lead* cache evicted or does not hold (oldest first, deeper first on ties),
then the least recently used leaves: while the lead stays the same its content converges to the
lead's, and then equals it.

Pure: stdlib.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from superinfer.policy_core.reuse_blocks import BlockCache, _float_order

__all__ = ["FollowingCache"]


class FollowingCache(BlockCache):
    """A block cache whose evictions follow a lead cache's (a subclass feeds it the requests
    with :meth:`_touch`, the lead's evictions with :meth:`_lead_evicted`, re-points it with
    :meth:`_restale` and trims with :meth:`_trim`).

    Args:
        capacity: blocks kept (>= 1).
        parent: shape (U,), each block's parent id, -1 for a first block.
        depth: shape (U,), each block's index in its prompts.

    Raises:
        ValueError: ``capacity`` < 1.
    """

    def __init__(self, capacity: int, parent: Sequence[int], depth: Sequence[int]) -> None:
        super().__init__(capacity, parent, depth)
        self.cached = [False] * len(self.parent)
        self.last = [0.0] * len(self.parent)  # last access, s
        self.size = 0
        # Heap entries are ints ordered as the tuples (last access, -depth, block):
        # _float_order(last access) above (max depth - depth) above the block id; _fkey[b] is
        # block b's at its last access (an entry is outdated once it differs).
        bits = max(1, len(self.parent).bit_length())
        dmax = max(self.depth, default=0)
        self._low = [((dmax - d) << bits) | b for b, d in enumerate(self.depth)]
        self._mask = (1 << bits) - 1
        self._tshift = bits + max(1, (dmax - min(self.depth, default=0)).bit_length())
        self._fkey = [0] * len(self.parent)
        self.stale: list[int] = []  # the blocks to leave first
        self.lru: list[int] = []  # every cached block (fallback)

    def __contains__(self, block: object) -> bool:
        return bool(self.cached[block])  # type: ignore[call-overload]

    def _touch(self, blocks: Sequence[int], now_s: float) -> None:
        """Cache every block of a request, accessed at ``now_s`` (may exceed the capacity)."""
        cached, last, low, fkey = self.cached, self.last, self._low, self._fkey
        parent, kids, lru, push, entered = self.parent, self.kids, self.lru, heapq.heappush, 0
        base = _float_order(now_s) << self._tshift
        for b in blocks:
            if not cached[b]:
                cached[b] = True
                entered += 1
                p = parent[b]  # BlockCache._entered, inlined
                if p >= 0:
                    kids[p] += 1
            last[b] = now_s
            k = fkey[b] = base + low[b]
            push(lru, k)
        self.size += entered

    def _lead_evicted(self, gone: Sequence[int]) -> None:
        """The lead evicted ``gone``: those cached here leave first."""
        cached, fkey, stale, push = self.cached, self._fkey, self.stale, heapq.heappush
        for v in gone:
            if cached[v]:
                push(stale, fkey[v])

    def _restale(self, lead: BlockCache) -> None:
        """A new lead: the cached blocks it does not hold leave first (O(U))."""
        fkey, held = self._fkey, lead.__contains__
        self.stale = [fkey[b] for b, c in enumerate(self.cached) if c and not held(b)]
        heapq.heapify(self.stale)

    def _pop_valid(self, heap: list[int], lead: BlockCache, stale: bool) -> int | None:
        """Pop ``heap`` down to its first valid leaf (entries outdated, or with ``stale`` held
        by ``lead``, dropped; valid non-leaves pushed back); None when there is none."""
        cached, fkey, kids, pop, mask = (
            self.cached,
            self._fkey,
            self.kids,
            heapq.heappop,
            self._mask,
        )
        held_by = lead.__contains__
        held: list[int] = []
        found = None
        while heap:
            entry = pop(heap)
            b = entry & mask
            if not cached[b] or fkey[b] != entry or (stale and held_by(b)):
                continue  # outdated entry
            if kids[b]:
                held.append(entry)
                continue
            found = b
            break
        if held:
            push = heapq.heappush
            for entry in held:
                push(heap, entry)
        return found

    def _trim(self, lead: BlockCache) -> list[int]:
        """Evict leaves until within capacity (those ``lead`` evicted or does not hold first,
        then the least recently used); the blocks evicted, in order."""
        out: list[int] = []
        cached, parent, kids, capacity = self.cached, self.parent, self.kids, self.capacity
        pop_valid, size = self._pop_valid, self.size
        while size > capacity:
            b = pop_valid(self.stale, lead, True)
            if b is None:
                b = pop_valid(self.lru, lead, False)
            if b is None:
                break
            cached[b] = False
            size -= 1
            p = parent[b]  # BlockCache._left, inlined
            if p >= 0:
                kids[p] -= 1
            out.append(b)
        self.size = size
        if len(self.lru) > 4 * capacity + 1024:
            fkey = self._fkey
            self.lru = [fkey[b] for b, c in enumerate(cached) if c]
            heapq.heapify(self.lru)
        return out
