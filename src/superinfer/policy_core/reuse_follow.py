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
        return bool(self.cached[block])  # type: ignore[call-overload]

    def _touch(self, blocks: Sequence[int], now_s: float) -> None:
        """Cache every block of a request, accessed at ``now_s`` (may exceed the capacity)."""
        cached, last, depth, parent, kids = (
            self.cached,
            self.last,
            self.depth,
            self.parent,
            self.kids,
        )
        lru, push, entered = self.lru, heapq.heappush, 0
        for b in blocks:
            if not cached[b]:
                cached[b] = True
                entered += 1
                p = parent[b]  # BlockCache._entered, inlined
                if p >= 0:
                    kids[p] += 1
            last[b] = now_s
            push(lru, (now_s, -depth[b], b))
        self.size += entered

    def _lead_evicted(self, gone: Sequence[int]) -> None:
        """The lead evicted ``gone``: those cached here leave first."""
        cached, last, depth, stale, push = (
            self.cached,
            self.last,
            self.depth,
            self.stale,
            heapq.heappush,
        )
        for v in gone:
            if cached[v]:
                push(stale, (last[v], -depth[v], v))

    def _restale(self, lead: BlockCache) -> None:
        """A new lead: the cached blocks it does not hold leave first (O(U))."""
        last, depth, held = self.last, self.depth, lead.__contains__
        self.stale = [
            (last[b], -depth[b], b) for b, c in enumerate(self.cached) if c and not held(b)
        ]
        heapq.heapify(self.stale)

    def _pop_valid(
        self, heap: list[tuple[float, int, int]], lead: BlockCache, stale: bool
    ) -> int | None:
        """Pop ``heap`` down to its first valid leaf (entries outdated, or with ``stale`` held
        by ``lead``, dropped; valid non-leaves pushed back); None when there is none."""
        cached, last, kids, pop = self.cached, self.last, self.kids, heapq.heappop
        held_by = lead.__contains__
        held: list[tuple[float, int, int]] = []
        found = None
        while heap:
            entry = pop(heap)
            b = entry[2]
            if not cached[b] or last[b] != entry[0] or (stale and held_by(b)):
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
            last, depth = self.last, self.depth
            self.lru = [(last[b], -depth[b], b) for b, c in enumerate(cached) if c]
            heapq.heapify(self.lru)
        return out
