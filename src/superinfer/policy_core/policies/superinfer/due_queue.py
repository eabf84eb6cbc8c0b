"""The due-check queue of the ``superinfer`` policy's per-replica records (``records.py``):
one heap's pop order, held as time buckets so that a pop does not touch every queued check."""

from __future__ import annotations

import heapq

#: Width of one bucket of :class:`_DueQueue`, s.
_DUE_BUCKET_S = 1.0

_DueItem = tuple[float, int, str, int]  # (when, seq, id, check_version)


class _DueQueue:
    """The due checks of queued requests: ``(when, seq, id, check_version)`` items, popped in
    exactly the order one heap of them pops (lazily deleted like the other heaps: a superseded
    check stays until its time), held as ``_DUE_BUCKET_S``-wide buckets of ``when``, each a heap,
    under a heap of bucket numbers. Every item of an earlier bucket has a smaller ``when``, so
    the earliest bucket's top is the smallest item. A pop touches that bucket and the small heap
    of bucket numbers, not one heap of every queued request's check (at 2,560 running / 40,960
    waiting in ``benchmarks/policy_overhead.py``: ~36,000 items, ~4 µs a pop timed there with
    the machine loaded). Push and pop O(log bucket + log buckets)."""

    __slots__ = ("_keys", "_buckets")

    def __init__(self) -> None:
        self._keys: list[int] = []
        self._buckets: dict[int, list[_DueItem]] = {}

    def push(self, item: _DueItem) -> None:
        """Add ``item`` (its ``when`` finite, s)."""
        k = int(item[0] // _DUE_BUCKET_S)
        bucket = self._buckets.get(k)
        if bucket is None:
            self._buckets[k] = [item]
            heapq.heappush(self._keys, k)
        else:
            heapq.heappush(bucket, item)

    def first(self) -> _DueItem | None:
        """The smallest item, or ``None`` when empty."""
        keys = self._keys
        return self._buckets[keys[0]][0] if keys else None

    def pop(self) -> _DueItem:
        """Remove and return the smallest item (``IndexError`` when empty)."""
        keys = self._keys
        k = keys[0]
        bucket = self._buckets[k]
        item = heapq.heappop(bucket)
        if not bucket:
            del self._buckets[k]
            heapq.heappop(keys)
        return item
