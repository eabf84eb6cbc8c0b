"""The reuse-hazard expert as a prefix-cache placement policy (issue 22; plugin ``hazard``).

Offline, :class:`~superinfer.policy_core.reuse_hazard.HazardCache` learns the law of the gaps
between two reads of a block and evicts by hit density with optimal stopping; on the real SGLang
server's trace (``benchmarks/sglang_kv_placement.py``, 512 blocks) it serves 0.617 of the prompt
tokens from the cache where S3-FIFO serves 0.600 and LRU 0.560 (``results/sglang-kv-placement/
hazard/offline.csv``). :class:`HazardPlacementPolicy` is the same model over an engine's radix
nodes: it learns from what the requests read (their prompts' chunk keys at arrival, or without
them the nodes' accesses) and scores each node by the hit density of its deepest whole chunk.

Pure: stdlib and numpy.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from superinfer.policy_core.kv_placement import PlacementPolicy, accessed_since
from superinfer.policy_core.kv_placement_plan import ScoreFn
from superinfer.policy_core.reuse import NodeColumns
from superinfer.policy_core.reuse_hazard import AGE_EDGES_S, hazard_tables, rho_index
from superinfer.policy_core.types import PrefixNodeView, RequestView

__all__ = ["HazardPlacementPolicy", "HazardShadow"]

FloatArray = NDArray[np.float64]
#: Weight of the age tie-break (under any rho a fit gives: gaps are < 2.0e6 s).
_TIE = 1e-12


@dataclass
class HazardPlacementPolicy(PlacementPolicy):
    """Evict the nodes whose learned time to reuse promises the fewest hits per slot-second.

    **What it learns.** Every read of a chunk key (a 16-token piece of a prompt,
    :attr:`RequestView.prompt_chunk_keys`, read once per request at its arrival, as the offline
    replay reads a request's blocks) that was read before closes an *interval*, its gap the time
    since that key's previous read, in the class ``floor(log2(reads before))`` capped at
    ``classes - 1``; every key's current interval is open, censored at its age. Per class,
    :func:`~superinfer.policy_core.reuse_hazard.hazard_tables` (Kaplan-Meier on the log-spaced
    age bins ``AGE_EDGES_S``) gives the survival ``S`` of the gap law and
    :func:`~superinfer.policy_core.reuse_hazard.rho_index` its hit density with optimal stopping
    ``rho`` (hits per slot-second; LHD, Beckmann et al., NSDI 2018), refitted every
    ``refit_reads`` chunk reads or an eighth of the keys known, whichever is more, as
    :class:`~superinfer.policy_core.reuse_hazard.HazardCache` does. Keys are remembered by
    their last read, the ``max_keys`` most recent (a key forgotten is read next as a new one).
    An engine that gives no prompt keys has its nodes' accesses read instead (each node whose
    last access is newer than last seen, its chunks at that instant; SGLang touches a node at
    every prefix match too, so there the prompts are read).

    **What it scores.** A node is scored by its deepest whole chunk
    (:attr:`PrefixNodeView.chunks`: its ``chunk_keys``, or the node itself without a content
    key, as for TensorRT-LLM's hashed blocks): ``rho`` of that key's class at its age (time
    since its last read), interpolated; a node with no known chunk (no whole chunk, or one
    never read: the output an engine inserted, until a prompt reads it) by its own age in
    class 0. The planner evicts the lowest scores first, leaves only (equal ``rho``: the older
    first). Never pins.

    **Cold start.** Until ``min_intervals`` intervals have closed, the score is LRU's
    (``-age``, :class:`~superinfer.policy_core.kv_placement.LRUPlacementPolicy`) exactly.

    **Cost.** O(chunks) per request at arrival (dict updates and a bisection per closed gap),
    a refit (a numpy pass over the keys known plus O(classes x bins^2)) every ``refit_reads``
    reads or more, and O(nodes) numpy work per call.

    Attributes:
        classes: interval classes by reads before the interval (1: one law for every key).
        min_intervals: closed intervals needed before the scores leave LRU.
        refit_reads: least chunk reads between two refits.
        max_keys: chunk keys remembered (their last read and read count).
        fitted: the scores are the learned ones (False: LRU, the cold start).
        fits: refits done; ``num_closed``: intervals closed so far.
        from_prompts: whether it learns from the requests' prompts (after the first keyed
            prompt) rather than from the nodes' accesses.

    Raises:
        ValueError: ``classes``, ``min_intervals``, ``refit_reads`` or ``max_keys`` < 1.
    """

    name: ClassVar[str] = "hazard"
    #: Asks engines for :attr:`RequestView.prompt_chunk_keys` (see ``AdaptivePlacementPolicy``).
    reads_prompt_keys: ClassVar[bool] = True

    classes: int = 4
    min_intervals: int = 200
    refit_reads: int = 2_000
    max_keys: int = 1_000_000
    fitted: bool = field(default=False, init=False)
    fits: int = field(default=0, init=False)
    num_closed: int = field(default=0, init=False)
    from_prompts: bool = field(default=False, init=False)
    #: key -> (last read, s; reads so far), least recently read first.
    _keys: OrderedDict[str, tuple[float, int]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    closed: list[list[float]] = field(default_factory=list, init=False, repr=False)
    _since_fit: int = field(default=0, init=False, repr=False)
    _x: FloatArray = field(default_factory=lambda: np.zeros(0), init=False, repr=False)
    _rho: FloatArray = field(default_factory=lambda: np.zeros(0), init=False, repr=False)
    _seen: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _tails: list[str | None] = field(default_factory=list, init=False, repr=False)
    _nodes: tuple[PrefixNodeView, ...] = field(default=(), init=False, repr=False)
    #: The instant of the last read, s.
    now_s: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.classes, self.min_intervals, self.refit_reads, self.max_keys) < 1:
            raise ValueError("classes, min_intervals, refit_reads and max_keys must be >= 1")
        self.closed = [[0.0] * len(AGE_EDGES_S) for _ in range(self.classes)]

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        out.update(fitted=self.fitted, fits=self.fits, closed_intervals=self.num_closed,
                   keys=len(self._keys), from_prompts=self.from_prompts)  # fmt: skip
        return out

    def observe_request(self, request: RequestView) -> None:
        """Read a new request's prompt chunk keys at its arrival (``request.arrival_s``, the
        engine's clock); from the first keyed prompt on, the nodes' accesses are no longer
        read."""
        if request.prompt_chunk_keys:
            self.from_prompts = True
            self.read(request.prompt_chunk_keys, request.arrival_s)

    def read(self, chunks: tuple[str, ...], now_s: float) -> None:
        """Record one read of each of ``chunks`` at ``now_s`` (s): close the interval of every
        key read before, then refit if due."""
        self.now_s = max(self.now_s, now_s)
        keys, closed, top = self._keys, self.closed, self.classes - 1
        for key in chunks:
            last = keys.pop(key, None)
            if last is not None:
                cls = min(last[1].bit_length() - 1, top)
                i = bisect_right(AGE_EDGES_S, now_s - last[0]) - 1
                closed[cls][max(i, 0)] += 1.0
                self.num_closed += 1
            keys[key] = (now_s, 1 if last is None else last[1] + 1)
        while len(keys) > self.max_keys:
            keys.popitem(last=False)
        self._since_fit += len(chunks)
        if self._since_fit >= max(self.refit_reads, len(keys) // 8 if self.fitted else 0):
            self._since_fit = 0
            self._fit(now_s)

    def _fit(self, now_s: float) -> None:
        """Each class's ``rho`` at the age points, from the closed intervals and the open ones
        (every key known, censored at its age)."""
        lasts = np.fromiter((v[0] for v in self._keys.values()), np.float64, len(self._keys))
        cls = self._class(np.fromiter((v[1] for v in self._keys.values()), np.int64,
                                      len(self._keys)))  # fmt: skip
        nb = len(AGE_EDGES_S)
        bins = np.clip(np.searchsorted(AGE_EDGES_S, now_s - lasts, side="right") - 1, 0, nb - 1)
        rho = np.zeros((self.classes, nb + 1))
        for c in range(self.classes):
            censored = np.bincount(bins[cls == c], minlength=nb).astype(np.float64)
            self._x, s, integral = hazard_tables(np.asarray(self.closed[c]), censored)
            rho[c] = rho_index(s, integral)
        self._rho = rho
        self.fits += 1
        self.fitted = self.num_closed >= self.min_intervals

    def _see(self, nodes: tuple[PrefixNodeView, ...], needed_hbm_blocks: int) -> None:
        """Note each node's deepest whole chunk (None: it has none)."""
        self._nodes = nodes
        self._tails = [c[-1] if (c := nd.chunks) else None for nd in nodes]

    def _scores(
        self, keys: NDArray[Any], cols: NodeColumns, now_s: float, has_cpu_tier: bool
    ) -> tuple[FloatArray | ScoreFn, FloatArray | ScoreFn | None, bool]:
        if not self.from_prompts:  # learn from the nodes' accesses
            last = now_s - cols.age_s
            for i in accessed_since(self._seen, keys, last, cols.depth):
                self._seen[keys[i]] = float(last[i])
                self.read(self._nodes[i].chunks, float(last[i]))
            if len(self._seen) > 4 * len(keys):  # forget nodes no longer shown
                shown = set(keys.tolist())
                self._seen = {k: t for k, t in self._seen.items() if k in shown}
        if not self.fitted:
            return -cols.age_s, None, False
        age = np.array(cols.age_s, dtype=np.float64)
        reads = np.ones(len(keys), dtype=np.int64)
        for i, tail in enumerate(self._tails):
            known = self._keys.get(tail) if tail is not None else None
            if known is not None:
                age[i], reads[i] = now_s - known[0], known[1]
        return self._evict_score(age, reads), None, False

    def key_scores(self, keys: list[str], now_s: float) -> FloatArray:
        """Shape (N,): the eviction score at ``now_s`` of each chunk key (lowest: first to
        go): its :meth:`density` (before the model has learned, ``-age``, LRU), less the age
        tie-break; a key not known scores as one read just now."""
        table = self._keys
        last = np.fromiter((table[k][0] if k in table else now_s for k in keys), np.float64,
                           len(keys))  # fmt: skip
        age = now_s - last
        if not self.fitted:
            return -age
        reads = np.fromiter((table[k][1] if k in table else 1 for k in keys), np.int64,
                            len(keys))  # fmt: skip
        return self._evict_score(age, reads)

    def _evict_score(self, age_s: FloatArray, reads: NDArray[np.int64]) -> FloatArray:
        """:meth:`density` less the age tie-break (equal densities: the older first)."""
        out: FloatArray = self.density(age_s, reads) - _TIE * age_s / (1.0 + age_s)
        return out

    def _class(self, reads: NDArray[np.int64]) -> NDArray[np.int64]:
        """The interval class of keys read ``reads`` (>= 1) times: ``floor(log2(reads))``,
        capped at ``classes - 1`` (``read``'s ``bit_length() - 1`` for one key)."""
        out: NDArray[np.int64] = np.minimum(
            np.floor(np.log2(np.maximum(reads, 1))).astype(np.int64), self.classes - 1
        )
        return out

    def density(self, age_s: FloatArray, reads: NDArray[np.int64]) -> FloatArray:
        """Shape (N,): the last fit's ``rho`` (hits per slot-second) of keys read ``reads``
        (>= 1) times, the last ``age_s`` s ago: their class's ``rho`` interpolated linearly
        between the age points (the last point's beyond it). Zeros before the first fit."""
        if not self.fits:
            return np.zeros(len(age_s))
        cls = self._class(reads)
        out: FloatArray = cls.choose([np.interp(age_s, self._x, self._rho[c])
                                      for c in range(self.classes)])  # fmt: skip
        return out


class HazardShadow:
    """The hazard expert as a shadow cache of :class:`AdaptivePlacementPolicy
    <superinfer.policy_core.kv_placement_adaptive.AdaptivePlacementPolicy>`: chunk keys, at
    most ``capacity`` after each read, the keys with the lowest
    :meth:`HazardPlacementPolicy.key_scores` of ``model`` (the ``hazard`` order the adaptive
    policy keeps, which reads the same prompts) leaving first.

    Unlike the key caches of :mod:`~superinfer.policy_core.kv_baselines`, which evict at each
    access, :meth:`access` only adds a key and :meth:`settle` trims once per read (a request's
    chunks enter together, as the offline ``HazardCache`` takes a request's blocks and then
    trims), so a trim costs one O(keys held) numpy pass per request read.

    Args:
        capacity: keys held after a read (>= 1).
        model: the learned gap law and the keys' reads.

    Raises:
        ValueError: ``capacity < 1``.
    """

    def __init__(self, capacity: int, model: HazardPlacementPolicy) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.model = model
        self._held: dict[str, None] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def __len__(self) -> int:
        return len(self._held)

    def access(self, key: str) -> list[str]:
        """Hold ``key`` (no trim: :meth:`settle` trims); returns no victims."""
        self._held[key] = None
        return []

    def settle(self) -> list[str]:
        """Trim to ``capacity`` keys at the model's last read; returns the keys that left."""
        excess = len(self._held) - self.capacity
        if excess <= 0:
            return []
        keys = list(self._held)
        score = self.model.key_scores(keys, self.model.now_s)
        gone = [keys[i] for i in np.argsort(score, kind="stable")[:excess].tolist()]
        for key in gone:
            del self._held[key]
        return gone
