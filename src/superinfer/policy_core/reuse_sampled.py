"""Spatially sampled shadow caches for the adaptive reuse predictor (issue 22: its cost).

Miniature simulation (Waldspurger et al., "Cache Modeling and Optimization using Miniature
Simulations", USENIX ATC 2017; the sampling of SHARDS, Waldspurger et al., FAST 2015): a shadow
cache of ``capacity * R`` blocks that sees only the references to the blocks of a fixed spatial
sample, the blocks whose hash falls in a fraction ``R`` of the hash space, hits about ``R`` times
as many blocks as the full-size cache on the full reference stream, so comparing the experts
needs only ``R`` of their work.

Here the sample is ``splitmix64(block id) mod 2**24 < round(R * 2**24)`` (a fixed,
deterministic hash of the block's dense id, the same on every run and platform; no salted
``hash``). A request is a chain of its prefix forest (root first); its sampled blocks form a
chain of the *sampled forest*, in which a sampled block's parent is its nearest sampled
ancestor, so a shadow over the sampled forest stays prefix-closed and its prefix hits on the
sampled sub-request are its plain hits, as for the full caches.

How :class:`~superinfer.policy_core.reuse_adaptive.AdaptiveCache` uses them
(``AdaptiveConfig.sample_rate`` R < 1): each expert (and each union shadow) runs at ``capacity *
R`` blocks on the sampled references, its hits scaled by 1/R, and picks the leader. The real
cache still needs a full-size instance of the leader to follow (the blocks it evicts, its
content), so one full-size cache of the leader's policy runs on every reference (and one of the
union leader's, while that is not the cold start); on a switch it is built afresh and warmed by
replaying the last ``warm_window`` x its capacity block references (:class:`WarmLog`), so its
state (counts, ghosts, the hazard model) is that of the recent window only. While LRU leads no
full-size copy runs: the cache's own fallback order is LRU's. This was chosen over keeping
full-size experts and feeding the non-leaders only the sampled references: a full-size cache fed
a sample holds 1/R times too much of it, so it would neither score nor follow correctly. Per
request: R x the shadows' work, plus at most two full-size caches (see docs/kv-reuse.md for the
measured hit rates and cost).

Pure: stdlib and numpy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import islice

import numpy as np

from superinfer.policy_core.reuse_blocks import BlockCache

__all__ = ["SAMPLE_SPACE", "WarmLog", "in_sample", "sample_mask", "sampled_forest", "splitmix64"]

#: The hash space the sample is taken from: a block is sampled when its hash mod this is below
#: ``round(rate * SAMPLE_SPACE)``.
SAMPLE_SPACE = 1 << 24

_M64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """The splitmix64 finalizer of ``x`` (Steele et al., "Fast splittable pseudorandom number
    generators", OOPSLA 2014): a fixed 64-bit hash of an integer, in ``[0, 2**64)``."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def in_sample(block: int, rate: float) -> bool:
    """Whether block id ``block`` is in the spatial sample of rate ``rate`` (a fraction in
    (0, 1]; SHARDS' ``hash mod P < T``, Waldspurger et al., FAST 2015)."""
    return splitmix64(block) % SAMPLE_SPACE < round(rate * SAMPLE_SPACE)


def sample_mask(num_blocks: int, rate: float) -> list[bool]:
    """For block ids ``0..num_blocks-1``, whether each is in the sample of rate ``rate`` (as
    :func:`in_sample`, vectorized; O(num_blocks)).

    Raises:
        ValueError: ``rate`` not in (0, 1].
    """
    if not 0 < rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {rate}")
    x = np.arange(num_blocks, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    threshold = np.uint64(round(rate * SAMPLE_SPACE))
    return [bool(v) for v in ((x % np.uint64(SAMPLE_SPACE)) < threshold).tolist()]


def sampled_forest(parent: Sequence[int], mask: Sequence[bool]) -> list[int]:
    """The sampled forest: each block's nearest sampled proper ancestor (-1 if none), for every
    block (only the sampled ones' entries are used). Needs ``parent[b] < b`` (ids in first-use
    order, as a block trace assigns them); O(blocks).

    Raises:
        ValueError: a parent id not below its child's.
    """
    out = [-1] * len(parent)
    for b, p in enumerate(parent):
        if p >= b:
            raise ValueError(f"parent ids must be below their children's: parent[{b}] = {p}")
        if p >= 0:
            out[b] = p if mask[p] else out[p]
    return out


class WarmLog:
    """The last requests seen (blocks, arrival in s), at least ``refs`` block references, to warm
    a cache by replaying them (:meth:`replay`).

    Args:
        refs: block references kept (>= 1); the oldest requests leave once the others hold this
            many.

    Raises:
        ValueError: ``refs`` < 1.
    """

    def __init__(self, refs: int) -> None:
        if refs < 1:
            raise ValueError(f"refs must be >= 1, got {refs}")
        self.refs = refs
        self.log: deque[tuple[tuple[int, ...], float]] = deque()
        self.held = 0

    def add(self, blocks: Sequence[int], now_s: float) -> None:
        """Remember one request (O(blocks), amortized)."""
        self.log.append((tuple(blocks), now_s))
        self.held += len(blocks)
        while self.held - len(self.log[0][0]) >= self.refs:
            self.held -= len(self.log.popleft()[0])

    def replay(self, cache: BlockCache, refs: int) -> BlockCache:
        """``cache`` after serving, in order, the newest remembered requests that hold at least
        ``refs`` block references (all if fewer); O(``refs``)."""
        start, seen = len(self.log), 0
        while start > 0 and seen < refs:
            start -= 1
            seen += len(self.log[start][0])
        for blocks, now_s in islice(self.log, start, None):
            cache.request(blocks, now_s)
        return cache
