"""The reuse-hazard expert: evict the blocks whose learned time-to-reuse promises the fewest hits.

:class:`HazardCache` is a request-level block cache (:class:`~superinfer.policy_core.reuse_blocks.
BlockCache`) that learns, online and only from what a cache sees, the distribution of the gaps
between two accesses of a block, and evicts by **hit density with optimal stopping**:

- **What it learns.** Every access of a block that was accessed before closes an *interval* (its
  gap: now minus the block's previous access, remembered for every block ever seen, cached or
  not, so evictions do not censor it); every block's current interval is open (censored at its
  age). Intervals are split into classes by the block's accesses before the interval (``1``,
  ``2-3``, ``4-7``, ``8+``: ``floor(log2(accesses))``, capped), so that shared blocks touched
  every few seconds (system prompts, tool contexts) do not hide the gap law of the others. Per
  class, the Kaplan-Meier estimator on log-spaced age bins (``AGE_EDGES_S``) gives the survival
  ``S(x)`` = P(gap > x), a block never reused again counting as an interval still open (so
  ``S`` levels off at the share of dead blocks), and its integral ``I(x) = int_0^x S``.
- **What it scores.** A block of age ``a`` (time since its last access) kept until age ``A``
  (or its reuse, if sooner) is hit with probability ``(S(a) - S(A)) / S(a)`` and holds its slot
  ``(I(A) - I(a)) / S(a)`` seconds in expectation; its score is the best ratio over ``A > a``,

      rho(a) = max_{A > a} (S(a) - S(A)) / (I(A) - I(a))      [hits per block-second]

  (the hit density of LHD, Beckmann et al., NSDI 2018, here with the eviction age chosen
  optimally per age rather than taken from the cache's own eviction ages; ``rho`` is the
  Gittins-style index of a renewal process with one reward at its next event). A conversation
  touched 3 s ago, which cannot come back before the minimum think time, has a low ``rho`` only
  if its whole future is worth less than the others': the maximum looks past the dead zone. A
  block idle far past the gaps the class ever showed has ``rho`` near 0. ``rho`` is computed on
  the bin edges (``O(bins^2)`` per class per refit) and interpolated in between.
- **How it evicts.** A request's blocks share their last access, so the cache keeps one
  *bucket* per request (its blocks root first; a block moves to its newest request's bucket) and
  scores a bucket by the class of its deepest cached block; it evicts from the bucket with the
  least score (ties: the oldest), deepest block first, while that block is a leaf of the same
  class, then rescores. A parent is accessed whenever its child is, so it is never in an older
  bucket than its child, and a bucket's tail is a leaf unless an older request went deeper along
  the same path (then the bucket is passed over).
- **Cold start.** Until ``min_intervals`` intervals have closed and the first fit, every score
  is ``-age``: LRU, deeper first inside a request.
- **Cost.** ``O(1)`` per block of a request (a bisection for the closed gap's bin), a numpy
  pass over the live buckets per eviction round (``O(live requests)`` vector work), and a refit
  (a numpy pass over every block seen plus ``O(classes x bins^2)``) every ``refit_blocks`` block
  references or an eighth of the blocks seen, whichever is more.

It is one of :class:`~superinfer.policy_core.reuse_adaptive.AdaptiveCache`'s shadow experts
(name ``hazard``), so it is followed only while it leads the others in recent hits. Pure: stdlib
and numpy.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

from superinfer.policy_core.reuse_blocks import BlockCache

__all__ = ["AGE_EDGES_S", "HazardCache", "hazard_tables", "rho_index"]

#: Left edges of the age bins, s: 0, then 0.25 s x 2^(k/4) for k = 0..91 (up to ~2.0e6 s).
AGE_EDGES_S: tuple[float, ...] = (0.0, *(0.25 * 2.0 ** (k / 4) for k in range(92)))


def hazard_tables(
    closed: np.ndarray, censored: np.ndarray, edges: Sequence[float] = AGE_EDGES_S
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Kaplan-Meier survival of the gap law on binned ages, and its integral.

    Args:
        closed: shape (B,), intervals that closed with a gap in bin ``i`` (``[edges[i],
            edges[i+1])``, the last bin open-ended).
        censored: shape (B,), intervals still open whose age is in bin ``i``.
        edges: the B left edges, s (increasing, ``edges[0] = 0``).

    Returns:
        ``(x, S, I)``, each of shape (B + 1,): ``x`` the edges plus one more (the last bin
        closed at ``edges[-1] * 2^(1/4)``), ``S[i]`` = P(gap >= x[i]) (``S[0] = 1``; the hazard
        of bin ``i`` is ``closed[i] / at_risk[i]``, ``at_risk[i]`` the intervals reaching bin
        ``i``, closed or open), ``I[i]`` = the integral of ``S`` from 0 to ``x[i]``
        (trapezoids), s.
    """
    d = np.asarray(closed, dtype=np.float64)
    c = np.asarray(censored, dtype=np.float64)
    at_risk = np.cumsum((d + c)[::-1])[::-1]
    h = np.divide(d, at_risk, out=np.zeros_like(d), where=at_risk > 0)
    s = np.concatenate([[1.0], np.cumprod(1.0 - h)])
    e = np.asarray(edges, dtype=np.float64)
    x = np.concatenate([e, [e[-1] * 2.0**0.25]])
    integral = np.concatenate([[0.0], np.cumsum(0.5 * (s[1:] + s[:-1]) * np.diff(x))])
    return x, s, integral


def rho_index(s: np.ndarray, integral: np.ndarray) -> np.ndarray:
    """Shape (N,): ``rho[i] = max_{j > i} (s[i] - s[j]) / (integral[j] - integral[i])``, the
    best hit density (hits per block-second) from age ``x[i]`` over every stopping age
    ``x[j]`` (0 where no later point has a positive duration, and 0 at the last point).

    Args:
        s: shape (N,), survival at the points (non-increasing).
        integral: shape (N,), its integral at the points (increasing).
    """
    num = s[:, None] - s[None, :]
    den = integral[None, :] - integral[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        dens = np.where(den > 1e-12, num / den, 0.0)
    dens = np.triu(dens, 1)  # only j > i
    out: np.ndarray = np.maximum(dens.max(axis=1), 0.0)
    return out


class HazardCache(BlockCache):
    """Hit density with optimal stopping over a learned, per-class gap law (module docstring).

    Args:
        capacity, parent, depth: as :class:`BlockCache`.
        classes: interval classes by accesses before the interval, ``floor(log2(accesses))``
            capped at ``classes - 1`` (1: one law for every block).
        min_intervals: closed intervals needed before the scores leave LRU.
        refit_blocks: least block references between two refits.

    Attributes:
        fitted: the scores are the learned ones (False: LRU, the cold start).
        fits: refits done.
        rho: shape (classes, B + 1): each class's ``rho`` at the points ``x`` (hits per
            block-second), the last fit's.
        x: shape (B + 1,): the points, s.

    Raises:
        ValueError: ``classes < 1``, ``min_intervals < 1`` or ``refit_blocks < 1``.
    """

    name = "hazard"

    def __init__(
        self,
        capacity: int,
        parent: Sequence[int],
        depth: Sequence[int],
        *,
        classes: int = 4,
        min_intervals: int = 200,
        refit_blocks: int = 2000,
    ) -> None:
        super().__init__(capacity, parent, depth)
        if classes < 1 or min_intervals < 1 or refit_blocks < 1:
            raise ValueError("classes, min_intervals and refit_blocks must be >= 1")
        u = len(self.parent)
        self.classes = classes
        self.min_intervals = min_intervals
        self.refit_blocks = refit_blocks
        self.last = [0.0] * u  # last access of every block ever seen, s
        self.count = [0] * u  # accesses ever
        self.cached = bytearray(u)
        self.bucket_of = [-1] * u  # the request (bucket id) of the block's last access
        self.size = 0
        # closed intervals per class and gap bin (Python floats: one += per block is cheaper
        # than on a numpy array; _fit reads them as arrays)
        self.closed = [[0.0] * len(AGE_EDGES_S) for _ in range(classes)]
        self.num_closed = 0
        self._edges = list(AGE_EDGES_S)
        self._since_fit = 0
        self.fitted = False
        self.fits = 0
        self.x = np.zeros(len(AGE_EDGES_S) + 1)
        self.rho = np.zeros((classes, len(AGE_EDGES_S) + 1))
        self._x: list[float] = []  # self.x and self.rho as lists (scalar scores)
        self._rho: list[list[float]] = []
        # Buckets: one per request, id = request number; blocks root first.
        self._blocks: dict[int, list[int]] = {}  # live buckets, in id order
        self._time = np.zeros(1024)  # by bucket id: the request's instant, s
        self._tail_cls = np.zeros(1024, dtype=np.int64)  # class of its deepest cached block
        self._num_buckets = 0
        self._dirty: set[int] = set()  # buckets whose tail may have changed
        self.num_seen = 0
        # The live buckets as a mask by bucket id (an id array in id order without a pass over
        # the dict); ids below _lo are dead.
        self._alive = np.zeros(1024, dtype=np.bool_)
        self._lo = 0
        # ``count`` and ``last`` as arrays for _fit, brought up to date there from the blocks
        # referenced since (_touched) rather than converted whole at every refit.
        self._count_np = np.zeros(u, dtype=np.int64)
        self._last_np = np.zeros(u, dtype=np.float64)
        self._touched: list[int] = []

    def __contains__(self, block: object) -> bool:
        return bool(self.cached[block])  # type: ignore[call-overload]

    def block_class(self, accesses: int) -> int:
        """The interval class of a block accessed ``accesses`` (>= 1) times."""
        return min(int(math.log2(accesses)), self.classes - 1) if accesses > 0 else 0

    def cached_class(self, b: int) -> int:
        """The class whose ``rho`` scores cached block ``b`` now (by its accesses so far; a
        subclass may classify otherwise, e.g. ``benchmarks/cache_predictability.py``)."""
        return min(self.count[b].bit_length() - 1, self.classes - 1)

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        bid = self._num_buckets
        self._num_buckets += 1
        if bid == len(self._time):
            self._time = np.concatenate([self._time, np.zeros(bid)])
            self._tail_cls = np.concatenate([self._tail_cls, np.zeros(bid, dtype=np.int64)])
            self._alive = np.concatenate([self._alive, np.zeros(bid, dtype=np.bool_)])
        self._time[bid] = now_s
        self._alive[bid] = True
        self._touched.extend(blocks)
        last, count, cached, bucket_of = self.last, self.count, self.cached, self.bucket_of
        closed, edges, dirty = self.closed, self._edges, self._dirty
        parent, kids, add = self.parent, self.kids, dirty.add
        top = self.classes - 1
        num_closed = num_new = entered = 0
        for b in blocks:
            n = count[b]
            if n:
                cls = n.bit_length() - 1
                i = bisect_right(edges, now_s - last[b]) - 1
                closed[cls if cls < top else top][i if i > 0 else 0] += 1.0
                num_closed += 1
                add(bucket_of[b])
            else:
                num_new += 1
            last[b] = now_s
            count[b] = n + 1
            bucket_of[b] = bid
            if not cached[b]:
                cached[b] = 1
                entered += 1
                p = parent[b]  # BlockCache._entered, inlined
                if p >= 0:
                    kids[p] += 1
        self.num_seen += num_new
        self.size += entered
        self.num_closed += num_closed
        self._blocks[bid] = list(blocks)
        dirty.add(bid)
        self._since_fit += len(blocks)
        if self._since_fit >= max(self.refit_blocks, self.num_seen // 8 if self.fitted else 0):
            self._since_fit = 0
            self._fit(now_s)
        return self._trim(now_s)

    def _sync_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``count`` and ``last`` as arrays (equal to the lists), updated for the blocks
        referenced since the last call."""
        touched = self._touched
        if touched:
            n = len(touched)
            self._count_np[touched] = np.fromiter(map(self.count.__getitem__, touched),
                                                  dtype=np.int64, count=n)  # fmt: skip
            self._last_np[touched] = np.fromiter(map(self.last.__getitem__, touched),
                                                 dtype=np.float64, count=n)  # fmt: skip
            self._touched = []
        return self._count_np, self._last_np

    def _fit(self, now_s: float) -> None:
        count, last = self._sync_arrays()
        seen = np.flatnonzero(count > 0)
        ages = now_s - last[seen]
        n = count[seen]
        cls = np.minimum(np.floor(np.log2(n)).astype(np.int64), self.classes - 1)
        nb = len(AGE_EDGES_S)
        bins = np.clip(np.searchsorted(np.asarray(AGE_EDGES_S), ages, side="right") - 1, 0, nb - 1)
        for c in range(self.classes):
            censored = np.bincount(bins[cls == c], minlength=nb).astype(np.float64)
            x, s, integral = hazard_tables(np.asarray(self.closed[c]), censored)
            self.rho[c] = rho_index(s, integral)
            self.x = x
        self.fits += 1
        self.fitted = self.num_closed >= self.min_intervals
        self._x = self.x.tolist()
        self._rho = self.rho.tolist()

    def _retail(self, bid: int) -> bool:
        """Drop the bucket's blocks that left it (from the deep end) and record its tail's
        class; False (and the bucket deleted) when none is left."""
        lst = self._blocks.get(bid)
        if lst is None:
            return False
        cached, bucket_of = self.cached, self.bucket_of
        while lst:
            b = lst[-1]
            if cached[b] and bucket_of[b] == bid:
                self._tail_cls[bid] = self.cached_class(b)
                return True
            lst.pop()
        del self._blocks[bid]
        self._alive[bid] = False
        return False

    def _scores(self, ids: np.ndarray, now_s: float) -> np.ndarray:
        ages: np.ndarray = now_s - self._time[ids]
        if not self.fitted:
            return -ages
        cls = self._tail_cls[ids]
        if self.classes <= 8:
            # every class's table at every age, then each bucket's own class (np.interp is
            # elementwise: the same values as interpolating each class's buckets apart)
            x, rho = self.x, self.rho
            out: np.ndarray = cls.choose([np.interp(ages, x, rho[c]) for c in range(self.classes)])
            return out
        out = np.empty(len(ids))
        for c in range(self.classes):
            m = cls == c
            if m.any():
                out[m] = np.interp(ages[m], self.x, self.rho[c])
        return out

    def _score_one(self, bid: int, now_s: float) -> float:
        """:meth:`_scores` of one bucket, in Python (the same interpolation)."""
        age = now_s - float(self._time[bid])
        if not self.fitted:
            return -age
        x, rho = self._x, self._rho[int(self._tail_cls[bid])]
        i = bisect_right(x, age) - 1
        if i >= len(x) - 1:
            return rho[-1]
        i = max(i, 0)
        w = (age - x[i]) / (x[i + 1] - x[i])
        return rho[i] + w * (rho[i + 1] - rho[i])

    def _trim(self, now_s: float) -> list[int]:
        out: list[int] = []
        if self.size <= self.capacity:
            return out
        for bid in self._dirty:
            self._retail(bid)
        self._dirty.clear()
        alive, lo, hi = self._alive, self._lo, self._num_buckets
        while lo < hi and not alive[lo]:
            lo += 1
        self._lo = lo
        ids = np.flatnonzero(alive[lo:hi])  # the live buckets, in id order
        if lo:
            ids += lo
        if not len(ids):
            return out
        score = self._scores(ids, now_s)
        cached, kids, bucket_of, parent = self.cached, self.kids, self.bucket_of, self.parent
        # cached_class, inlined unless a subclass classifies otherwise
        own_class = type(self).cached_class is HazardCache.cached_class
        cached_class, count, top = self.cached_class, self.count, self.classes - 1
        blocks_of, tail_cls, retail = self._blocks, self._tail_cls, self._retail
        capacity, size, inf = self.capacity, self.size, math.inf
        while size > capacity:
            j = int(score.argmin())  # ties: the first, the oldest bucket
            if score[j] == inf:
                break  # every bucket is passed over
            bid = int(ids[j])
            lst = blocks_of[bid]
            cls = int(tail_cls[bid])
            evicted = False
            while size > capacity and lst:
                b = lst[-1]
                if not (cached[b] and bucket_of[b] == bid):
                    lst.pop()
                    continue
                if kids[b]:
                    break
                if own_class:
                    c = count[b].bit_length() - 1
                    if (c if c < top else top) != cls:
                        break
                elif cached_class(b) != cls:
                    break
                lst.pop()
                cached[b] = 0
                size -= 1
                p = parent[b]  # BlockCache._left, inlined
                if p >= 0:
                    kids[p] -= 1
                out.append(b)
                evicted = True
            self.size = size
            if not retail(bid):
                score[j] = inf
            elif not evicted and kids[lst[-1]]:
                score[j] = inf  # its tail has a cached child in an older bucket
            else:
                score[j] = self._score_one(bid, now_s)
        self.size = size
        return out
