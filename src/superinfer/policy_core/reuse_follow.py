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
from typing import cast

from superinfer.policy_core.reuse_blocks import BlockCache

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
        self.stale: list[tuple[float, int, int]] = []  # (last access, -depth, block)
        self.lru: list[tuple[float, int, int]] = []  # every cached block (fallback)

    def __contains__(self, block: object) -> bool:
        return bool(self.cached[cast(int, block)])

    def _touch(self, blocks: Sequence[int], now_s: float) -> None:
        """Cache every block of a request, accessed at ``now_s`` (may exceed the capacity)."""
        for b in blocks:
            if not self.cached[b]:
                self.cached[b] = True
                self.size += 1
                self._entered(b)
            self.last[b] = now_s
            heapq.heappush(self.lru, (now_s, -self.depth[b], b))

    def _lead_evicted(self, gone: Sequence[int]) -> None:
        """The lead evicted ``gone``: those cached here leave first."""
        for v in gone:
            if self.cached[v]:
                heapq.heappush(self.stale, (self.last[v], -self.depth[v], v))

    def _restale(self, lead: BlockCache) -> None:
        """A new lead: the cached blocks it does not hold leave first (O(U))."""
        self.stale = [
            (self.last[b], -self.depth[b], b)
            for b in range(len(self.cached))
            if self.cached[b] and b not in lead
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

    def _trim(self, lead: BlockCache) -> list[int]:
        """Evict leaves until within capacity (those ``lead`` evicted or does not hold first,
        then the least recently used); the blocks evicted, in order."""
        out: list[int] = []
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
