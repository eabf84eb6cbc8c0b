"""Two strong eviction baselines over hashable keys: ARC and S3-FIFO, as exact state machines
(and plain LRU with the same interface, for the adaptive placement policy's shadow caches).

- **ARC** (Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST 2003):
  a recency list ``T1`` (seen once), a frequency list ``T2`` (seen twice or more), their ghost
  lists ``B1`` / ``B2`` (keys only, evicted from ``T1`` / ``T2``) and a target size ``p`` of
  ``T1`` that a ghost hit in ``B1`` raises and one in ``B2`` lowers. This is the paper's
  Figure 4, case by case (cases I-IV), with ``p`` a float.
- **S3-FIFO** (Yang et al., "FIFO queues are all you need for cache eviction", SOSP 2023): a
  small FIFO ``S`` (10% of the capacity), a main FIFO ``M`` and a ghost FIFO ``G`` (as many keys
  as ``M``'s share); a 2-bit access counter per key (capped at 3). A miss enters ``M`` if its key
  is in ``G``, else ``S``. To evict: while ``S`` holds at least its share, take ``S``'s tail: if
  it was accessed since entering ``S`` it moves to ``M``'s head with its counter cleared, else it
  leaves (its key to ``G``); otherwise take ``M``'s tail: accessed (counter > 0) it is
  reinserted at the head with the counter decremented, else it leaves. ``S`` and ``M`` share one
  capacity (``|S| + |M| <= capacity``), as in libCacheSim's ``S3FIFO``.

A prefix cache can only free a block none of whose children is cached (the block after it in a
prompt would be unreachable). Both classes take an optional ``evictable`` predicate: a victim the
algorithm picks that fails it is passed over for the next candidate in the same list (ARC: the
next key from the LRU end; S3-FIFO: the key is rotated to its queue's head, counter unchanged),
and if a list holds no evictable key the other one is used. With ``evictable=None`` (or a
predicate that always holds) they are the published algorithms; ``tests/policy_core/
test_kv_baselines.py`` checks both against hits worked out by hand. Pure stdlib.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["ArcCache", "LruCache", "S3FifoCache"]

K = TypeVar("K", bound=Hashable)


def _first(od: OrderedDict[K, None], ok: Callable[[K], bool] | None) -> K | None:
    """The first key from the LRU end of ``od`` that ``ok`` accepts (``None``: none)."""
    for key in od:
        if ok is None or ok(key):
            return key
    return None


class ArcCache(Generic[K]):
    """ARC over keys with ``capacity`` slots (each key holds one slot).

    Args:
        capacity: cached keys at most (>= 1).
        evictable: whether a key may leave now (default: every key).

    Attributes:
        t1, t2, b1, b2: the four lists, least recent first (values unused).
        p: the target size of ``T1``, in [0, capacity].

    Raises:
        ValueError: ``capacity < 1``.
    """

    def __init__(self, capacity: int, evictable: Callable[[K], bool] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.evictable = evictable
        self.p = 0.0
        self.t1: OrderedDict[K, None] = OrderedDict()
        self.t2: OrderedDict[K, None] = OrderedDict()
        self.b1: OrderedDict[K, None] = OrderedDict()
        self.b2: OrderedDict[K, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def __iter__(self) -> Iterator[K]:
        yield from self.t1
        yield from self.t2

    def access(self, key: K) -> list[K]:
        """Reference ``key``; returns the keys that left the cache (in order). A hit is a key in
        ``T1`` or ``T2`` before the call."""
        out: list[K] = []
        if key in self.t1:  # case I
            del self.t1[key]
            self.t2[key] = None
            return out
        if key in self.t2:
            self.t2.move_to_end(key)
            return out
        c = self.capacity
        if key in self.b1:  # case II
            self.p = min(float(c), self.p + max(len(self.b2) / len(self.b1), 1.0))
            self._replace(key, out)
            del self.b1[key]
            self.t2[key] = None
            return out
        if key in self.b2:  # case III
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
            self._replace(key, out)
            del self.b2[key]
            self.t2[key] = None
            return out
        l1 = len(self.t1) + len(self.b1)  # case IV
        if l1 >= c:
            if len(self.t1) < c:
                self.b1.popitem(last=False)
                self._replace(key, out)
            else:  # T1 holds the whole cache: its LRU key leaves without a ghost
                victim = _first(self.t1, self.evictable)
                if victim is None:
                    self._replace(key, out)
                else:
                    del self.t1[victim]
                    out.append(victim)
        elif l1 + len(self.t2) + len(self.b2) >= c:
            if l1 + len(self.t2) + len(self.b2) >= 2 * c:
                self.b2.popitem(last=False)
            if len(self) >= c:
                self._replace(key, out)
        self.t1[key] = None
        return out

    def _replace(self, key: K, out: list[K]) -> None:
        """REPLACE(x, p): move the LRU key of ``T1`` to ``B1`` or of ``T2`` to ``B2``."""
        n1 = len(self.t1)
        from_t1 = n1 >= 1 and ((key in self.b2 and n1 == self.p) or n1 > self.p)
        first, second = (self.t1, self.t2) if from_t1 else (self.t2, self.t1)
        victim = _first(first, self.evictable)
        src = first
        if victim is None:
            victim, src = _first(second, self.evictable), second
        if victim is None:
            return  # nothing may leave: the cache stays over capacity
        del src[victim]
        (self.b1 if src is self.t1 else self.b2)[victim] = None
        out.append(victim)

    def eviction_order(self) -> list[K]:
        """Cached keys in the order repeated REPLACE calls would take them (first = next)."""
        t1, t2 = list(self.t1), list(self.t2)
        order: list[K] = []
        i = j = 0
        n1 = len(t1)
        while i < len(t1) or j < len(t2):
            if i < len(t1) and (n1 > self.p or j >= len(t2)):
                order.append(t1[i])
                i += 1
                n1 -= 1
            else:
                order.append(t2[j])
                j += 1
        return order

    def forget(self, key: K) -> None:
        """``key`` left the cache by someone else's decision: it becomes a ghost, as if ARC had
        evicted it (the ghost lists keep their bounds)."""
        if key in self.t1:
            del self.t1[key]
            self.b1[key] = None
        elif key in self.t2:
            del self.t2[key]
            self.b2[key] = None
        while len(self.t1) + len(self.b1) > self.capacity and self.b1:
            self.b1.popitem(last=False)
        while len(self) + len(self.b1) + len(self.b2) > 2 * self.capacity and self.b2:
            self.b2.popitem(last=False)


class S3FifoCache(Generic[K]):
    """S3-FIFO over keys with ``capacity`` slots.

    Args:
        capacity: cached keys at most (>= 1).
        small_frac: ``S``'s share of the capacity (the paper's 10%); ``S`` holds at least 1.
        evictable: whether a key may leave now (default: every key).

    Attributes:
        small, main, ghost: the FIFOs, tail (oldest) first.
        freq: access counter of each cached key, in [0, 3].
        small_size: ``max(1, round(small_frac * capacity))``.
        ghost_size: ``max(1, capacity - small_size)`` keys.

    Raises:
        ValueError: ``capacity < 1`` or ``small_frac`` outside (0, 1).
    """

    MAX_FREQ = 3

    def __init__(
        self,
        capacity: int,
        small_frac: float = 0.1,
        evictable: Callable[[K], bool] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not 0.0 < small_frac < 1.0:
            raise ValueError(f"small_frac must be in (0, 1), got {small_frac}")
        self.capacity = capacity
        self.evictable = evictable
        self.small_size = max(1, round(small_frac * capacity))
        self.ghost_size = max(1, capacity - self.small_size)
        self.small: OrderedDict[K, None] = OrderedDict()
        self.main: OrderedDict[K, None] = OrderedDict()
        self.ghost: OrderedDict[K, None] = OrderedDict()
        self.freq: dict[K, int] = {}

    def __contains__(self, key: object) -> bool:
        return key in self.freq

    def __len__(self) -> int:
        return len(self.freq)

    def __iter__(self) -> Iterator[K]:
        yield from self.small
        yield from self.main

    def access(self, key: K) -> list[K]:
        """Reference ``key``; returns the keys that left the cache (in order)."""
        if key in self.freq:
            self.freq[key] = min(self.freq[key] + 1, self.MAX_FREQ)
            return []
        out: list[K] = []
        while len(self.freq) >= self.capacity:
            victim = self._evict()
            if victim is None:
                break
            out.append(victim)
        if key in self.ghost:
            del self.ghost[key]
            self.main[key] = None
        else:
            self.small[key] = None
        self.freq[key] = 0
        return out

    def _evict(self) -> K | None:
        if len(self.small) >= self.small_size or not self.main:
            victim = self._evict_small()
            return victim if victim is not None else self._evict_main()
        victim = self._evict_main()
        return victim if victim is not None else self._evict_small()

    def _evict_small(self) -> K | None:
        passed = 0
        while self.small:
            tail = next(iter(self.small))
            if self.freq[tail] >= 1:  # accessed while in S: promoted to M, counter cleared
                del self.small[tail]
                self.freq[tail] = 0
                self.main[tail] = None
                continue
            if self.evictable is not None and not self.evictable(tail):
                passed += 1
                if passed > len(self.small):
                    return None
                self.small.move_to_end(tail)
                continue
            del self.small[tail]
            del self.freq[tail]
            self.ghost[tail] = None
            if len(self.ghost) > self.ghost_size:
                self.ghost.popitem(last=False)
            return tail
        return None

    def _evict_main(self) -> K | None:
        passed = 0
        while self.main:
            tail = next(iter(self.main))
            if self.freq[tail] > 0:
                self.freq[tail] -= 1
                self.main.move_to_end(tail)
                continue
            if self.evictable is not None and not self.evictable(tail):
                passed += 1
                if passed > len(self.main):
                    return None
                self.main.move_to_end(tail)
                continue
            del self.main[tail]
            del self.freq[tail]
            return tail
        return None

    def eviction_order(self) -> list[K]:
        """Cached keys, first = evicted soonest, approximately: while ``S`` holds its share its
        unaccessed keys (tail first), then ``M`` by (counter, tail first), then ``S``'s accessed
        keys (they would move to ``M``); with ``S`` under its share, ``M`` comes first."""
        s0 = [k for k in self.small if self.freq[k] == 0]
        s1 = [k for k in self.small if self.freq[k] > 0]
        pos = {k: i for i, k in enumerate(self.main)}
        m = sorted(self.main, key=lambda k: (self.freq[k], pos[k]))
        if len(self.small) >= self.small_size:
            return s0 + m + s1
        return m + s0 + s1

    def forget(self, key: K) -> None:
        """``key`` left the cache by someone else's decision (from ``S``: its key to ``G``)."""
        if key in self.small:
            del self.small[key]
            self.ghost[key] = None
            if len(self.ghost) > self.ghost_size:
                self.ghost.popitem(last=False)
        elif key in self.main:
            del self.main[key]
        self.freq.pop(key, None)


class LruCache(Generic[K]):
    """Least recently used keys leave first, over ``capacity`` slots (the interface of
    :class:`ArcCache` and :class:`S3FifoCache`: ``access``, ``eviction_order``, ``forget``).

    Args:
        capacity: cached keys at most (>= 1).

    Attributes:
        order: the cached keys, least recent first.

    Raises:
        ValueError: ``capacity < 1``.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.order: OrderedDict[K, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self.order

    def __len__(self) -> int:
        return len(self.order)

    def access(self, key: K) -> list[K]:
        """Reference ``key``; returns the keys that left the cache (least recent first)."""
        if key in self.order:
            self.order.move_to_end(key)
            return []
        out: list[K] = []
        while len(self.order) >= self.capacity:
            out.append(self.order.popitem(last=False)[0])
        self.order[key] = None
        return out

    def eviction_order(self) -> list[K]:
        """Cached keys, least recent (next to leave) first."""
        return list(self.order)

    def forget(self, key: K) -> None:
        """``key`` left the cache by someone else's decision."""
        self.order.pop(key, None)
