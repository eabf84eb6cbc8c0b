"""Prefix-cache placement policies: LRU, LFU, ARC, S3-FIFO, the learned reuse predictor and the
adaptive one (which follows whichever of LRU, ARC and S3-FIFO would have hit most lately), each
scoring the engine's cached prefix nodes and letting :class:`PlacementPlanner` decide what to
drop, offload to the CPU tier, pin and prefetch (DESIGN §6).

Each keeps the access history of the nodes it is shown, by content (:attr:`PrefixNodeView.key`;
a bounded ghost table, so a node's history survives its eviction and reaches the copy the engine
inserts again). Pure: stdlib and numpy only; the pluggy plugins that answer
``superinfer_kv_placement`` with :meth:`PlacementPolicy.decide` are
``superinfer.adapters.kv_placement``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from superinfer.policy_core.kv_baselines import ArcCache, LruCache, S3FifoCache
from superinfer.policy_core.kv_placement_plan import PlacementPlanner, ScoreFn, parent_index
from superinfer.policy_core.reuse import (
    NodeColumns,
    NodeHistory,
    ReusePredictor,
    ReusePredictorConfig,
)
from superinfer.policy_core.types import (
    KVLocation,
    Placement,
    PlacementDecision,
    PrefixNodeView,
)

__all__ = [
    "PLACEMENT_POLICIES",
    "AdaptivePlacementPolicy",
    "ArcPlacementPolicy",
    "S3FifoPlacementPolicy",
    "LFUPlacementPolicy",
    "LRUPlacementPolicy",
    "PlacementPolicy",
    "ReusePlacementPolicy",
]

FloatArray = NDArray[np.float64]
_MAX_CLASSES = 4
_log = logging.getLogger(__name__)


@dataclass
class PlacementPolicy:
    """Shared logic: node views -> access history and feature columns -> scores -> planner ->
    decision. Subclasses supply the scores.

    Attributes:
        max_pinned_frac: most HBM blocks pinned, as a fraction of the HBM blocks.
        pin_min_score: calibrated score from which a node is pinned.
        offload_min_score: calibrated score under which a victim is dropped, not offloaded.
        prefetch_reserve_frac: HBM fraction a prefetch leaves free.
        history_max_keys: node ids remembered across evictions.
    """

    name: ClassVar[str] = "base"

    max_pinned_frac: float = 0.2
    pin_min_score: float = 0.5
    offload_min_score: float = 0.0
    prefetch_reserve_frac: float = 0.05
    history_max_keys: int = 1_000_000
    planner: PlacementPlanner = field(init=False, repr=False)
    history: NodeHistory = field(init=False, repr=False)
    num_calls: int = field(default=0, init=False)
    _classes: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.planner = PlacementPlanner(
            max_pinned_frac=self.max_pinned_frac,
            pin_min_score=self.pin_min_score,
            offload_min_score=self.offload_min_score,
            prefetch_reserve_frac=self.prefetch_reserve_frac,
        )
        self.history = NodeHistory(max_keys=self.history_max_keys)

    def decide(
        self,
        nodes: tuple[PrefixNodeView, ...],
        now_s: float,
        free_hbm_blocks: int,
        free_cpu_blocks: int,
        needed_hbm_blocks: int,
        total_hbm_blocks: int,
    ) -> PlacementDecision:
        """Score ``nodes`` and plan which to drop, offload, pin and prefetch.

        Args:
            nodes: the engine's cached prefix nodes (any order; parents need not come first).
            now_s: the engine's clock, s.
            free_hbm_blocks: HBM KV blocks free now.
            free_cpu_blocks: CPU-tier KV blocks free now (0 and every node in HBM: no CPU tier).
            needed_hbm_blocks: HBM blocks the engine must free now (0: no eviction needed).
            total_hbm_blocks: the engine's HBM KV blocks (the pin cap is a fraction of them).

        Returns:
            The decision the ``superinfer_kv_placement`` hook returns (an empty one for no
            nodes); it passes ``validation.check_placement``.
        """
        self.num_calls += 1
        if not nodes:
            return PlacementDecision()
        n = len(nodes)
        ids = [nd.node_id for nd in nodes]
        history_keys = [nd.key for nd in nodes]
        slots = self.history.update(
            history_keys, (nd.last_access_s for nd in nodes), (nd.hit_count for nd in nodes)
        )
        parent = parent_index(nodes, {nid: i for i, nid in enumerate(ids)})
        in_hbm = np.fromiter((nd.location is KVLocation.HBM for nd in nodes), bool, n)
        num_blocks = np.fromiter((max(nd.num_blocks, 1) for nd in nodes), np.int64, n)
        depth = np.fromiter((nd.depth for nd in nodes), np.int64, n)
        cols = self.history.columns(
            slots,
            now_s,
            depth=depth.astype(np.float64),
            tokens_per_block=np.fromiter((nd.num_tokens for nd in nodes), np.float64, n)
            / num_blocks,
            num_children=np.bincount(parent[parent >= 0], minlength=n).astype(np.float64),
            class_mask=self._class_mask(nodes),
        )
        has_cpu_tier = free_cpu_blocks > 0 or not bool(in_hbm.all())
        keys = np.asarray(history_keys, dtype=object)
        score, cpu_score, calibrated = self._scores(keys, cols, now_s, has_cpu_tier)
        plan = self.planner.plan_arrays(
            score=score,
            cpu_score=cpu_score,
            parent=parent,
            depth=depth,
            num_blocks=num_blocks,
            in_hbm=in_hbm,
            in_use=np.fromiter((nd.in_use for nd in nodes), bool, n),
            waiting_refs=np.fromiter((nd.num_waiting_refs for nd in nodes), np.int64, n),
            needed_hbm_blocks=needed_hbm_blocks,
            free_hbm_blocks=free_hbm_blocks,
            free_cpu_blocks=free_cpu_blocks,
            total_hbm_blocks=total_hbm_blocks,
            has_cpu_tier=has_cpu_tier,
            calibrated=calibrated,
        )
        hbm_victims = np.concatenate([plan.drop[in_hbm[plan.drop]], plan.offload])
        self._observe(cols.age_s[hbm_victims], cols.age_s[plan.drop])
        actions: dict[str, Placement] = {}
        for idx, placement in (
            (plan.drop, Placement.DROP),
            (plan.offload, Placement.OFFLOAD),
            (plan.pin, Placement.PIN),
        ):
            for i in idx.tolist():
                actions[ids[i]] = placement
        return PlacementDecision(
            actions=actions, prefetch=tuple(ids[i] for i in plan.prefetch.tolist())
        )

    def metrics(self) -> dict[str, Any]:
        """Counters for logs and reports."""
        return {"policy": self.name, "num_calls": self.num_calls, "history_keys": len(self.history)}

    def _scores(
        self, keys: NDArray[Any], cols: NodeColumns, now_s: float, has_cpu_tier: bool
    ) -> tuple[FloatArray | ScoreFn, FloatArray | ScoreFn | None, bool]:
        raise NotImplementedError

    def _observe(self, hbm_ages_s: FloatArray, dropped_ages_s: FloatArray) -> None:
        return None

    def _class_mask(self, nodes: tuple[PrefixNodeView, ...]) -> FloatArray | None:
        rows: dict[tuple[str, ...], int] = {}
        which = np.fromiter(
            (rows.setdefault(nd.slo_classes, len(rows)) for nd in nodes), np.int64, len(nodes)
        )
        if len(rows) == 1 and not next(iter(rows)):
            return None  # no node carries a class
        table = np.zeros((len(rows), _MAX_CLASSES))
        for classes, r in rows.items():
            for name in classes:
                c = self._classes.setdefault(name, min(len(self._classes), _MAX_CLASSES - 1))
                table[r, c] = 1.0
        mask: FloatArray = table[which]
        return mask


@dataclass
class LRUPlacementPolicy(PlacementPolicy):
    """Least recently used nodes leave HBM first (deeper first on ties); never pins."""

    name: ClassVar[str] = "lru"

    def _scores(
        self, keys: NDArray[Any], cols: NodeColumns, now_s: float, has_cpu_tier: bool
    ) -> tuple[FloatArray | ScoreFn, FloatArray | ScoreFn | None, bool]:
        return -cols.age_s, None, False


@dataclass
class LFUPlacementPolicy(PlacementPolicy):
    """Least frequently used nodes (accesses remembered, evictions notwithstanding) leave HBM
    first, ties by recency; never pins."""

    name: ClassVar[str] = "lfu"

    def _scores(
        self, keys: NDArray[Any], cols: NodeColumns, now_s: float, has_cpu_tier: bool
    ) -> tuple[FloatArray | ScoreFn, FloatArray | ScoreFn | None, bool]:
        return cols.num_accesses + 1.0 / (1.0 + cols.age_s), None, False


@dataclass
class ReusePlacementPolicy(PlacementPolicy):
    """The reuse predictor (one model for HBM, one for the CPU tier) with the placement planner.

    Attributes:
        fallback: cold-start order, ``lru`` or ``lfu``.
        min_labels: labels before the model replaces the fallback.
        min_labels_per_class: of those, positives and negatives each.
        samples_per_call: training examples sampled per call.
        learning_rate: AdaGrad step size.
        horizon_scale: label horizon as a multiple of the tier's characteristic time.
        initial_horizon_s: label horizon before the first eviction, in s.
        seed: sampling seed.
    """

    name: ClassVar[str] = "reuse"

    fallback: str = "lru"
    min_labels: int = 1000
    min_labels_per_class: int = 50
    samples_per_call: int = 16
    learning_rate: float = 0.1
    horizon_scale: float = 1.0
    initial_horizon_s: float = 60.0
    seed: int = 0
    hbm_model: ReusePredictor = field(init=False, repr=False)
    cpu_model: ReusePredictor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.hbm_model = ReusePredictor(
            ReusePredictorConfig(
                fallback=self.fallback,
                min_labels=self.min_labels,
                min_labels_per_class=self.min_labels_per_class,
                samples_per_call=self.samples_per_call,
                learning_rate=self.learning_rate,
                horizon_scale=self.horizon_scale,
                initial_horizon_s=self.initial_horizon_s,
                seed=self.seed,
            )
        )

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        out["hbm_model"] = self.hbm_model.metrics()
        out["cpu_model"] = self.cpu_model.metrics() if self.cpu_model else None
        return out

    def _scores(
        self, keys: NDArray[Any], cols: NodeColumns, now_s: float, has_cpu_tier: bool
    ) -> tuple[FloatArray | ScoreFn, FloatArray | ScoreFn | None, bool]:
        if has_cpu_tier and self.cpu_model is None:
            cfg = self.hbm_model.config
            self.cpu_model = ReusePredictor(replace(cfg, seed=cfg.seed + 1))
        hbm = self._learn_and_score(self.hbm_model, keys, cols, now_s)
        cpu = None
        if self.cpu_model is not None:
            cpu = self._learn_and_score(self.cpu_model, keys, cols, now_s)
        return hbm, cpu, self.hbm_model.calibrated

    def _learn_and_score(
        self, model: ReusePredictor, keys: NDArray[Any], cols: NodeColumns, now_s: float
    ) -> FloatArray:
        model.learn(now_s, self.history.last_access_of)
        idx = model.sample_indices(len(keys))
        model.add_samples(keys[idx], cols.take(idx), now_s)
        return model.scores(cols)

    def _observe(self, hbm_ages_s: FloatArray, dropped_ages_s: FloatArray) -> None:
        self.hbm_model.observe_evictions(hbm_ages_s)
        if self.cpu_model is not None:
            self.cpu_model.observe_evictions(dropped_ages_s)


@dataclass
class _OrderPlacementPolicy(PlacementPolicy):
    """A :mod:`~superinfer.policy_core.kv_baselines` algorithm kept over node ids: the nodes
    whose last access is newer than last seen are fed to it as accesses (oldest first, deeper
    first on ties, so a parent is more recent than its child), nodes gone from the view leave
    it as the engine's evictions (``forget``), and the score is the node's position in the
    algorithm's eviction order (0: next to go), so the planner evicts leaves in that order. Its
    capacity follows the most nodes shown at once. Never pins."""

    _algo: Any = field(default=None, init=False, repr=False)
    _seen: dict[str, float] = field(default_factory=dict, init=False, repr=False)

    def _make(self, capacity: int) -> Any:
        raise NotImplementedError

    def _scores(
        self, keys: NDArray[Any], cols: NodeColumns, now_s: float, has_cpu_tier: bool
    ) -> tuple[FloatArray | ScoreFn, FloatArray | ScoreFn | None, bool]:
        n = len(keys)
        if self._algo is None:
            self._algo = self._make(max(n, 1))
        self._algo.capacity = max(n, 1, self._algo.capacity)
        last = now_s - cols.age_s
        present = set(keys.tolist())
        for key in [k for k in self._seen if k not in present]:
            self._algo.forget(key)
            del self._seen[key]
        fresh = [i for i in range(n) if self._seen.get(keys[i], -np.inf) < last[i]]
        fresh.sort(key=lambda i: (last[i], -cols.depth[i]))
        for i in fresh:
            key = keys[i]
            self._seen[key] = float(last[i])
            for gone in self._algo.access(key):
                self._seen.pop(gone, None)
        rank = {k: r for r, k in enumerate(self._algo.eviction_order())}
        score = np.fromiter((rank.get(k, len(rank)) for k in keys.tolist()), np.float64, n)
        return score, None, False


@dataclass
class ArcPlacementPolicy(_OrderPlacementPolicy):
    """ARC (Megiddo & Modha, FAST 2003) order over the engine's prefix nodes."""

    name: ClassVar[str] = "arc"

    def _make(self, capacity: int) -> Any:
        return ArcCache(capacity)


@dataclass
class S3FifoPlacementPolicy(_OrderPlacementPolicy):
    """S3-FIFO (Yang et al., SOSP 2023) order over the engine's prefix nodes."""

    name: ClassVar[str] = "s3fifo"

    def _make(self, capacity: int) -> Any:
        return S3FifoCache(capacity)


#: The shadow caches :class:`AdaptivePlacementPolicy` may run, and the placement policies that
#: order the engine's nodes while each leads, by expert name.
_SHADOWS: dict[str, type[Any]] = {"lru": LruCache, "arc": ArcCache, "s3fifo": S3FifoCache}
_ORDERS: dict[str, type[PlacementPolicy]] = {
    "lru": LRUPlacementPolicy,
    "arc": ArcPlacementPolicy,
    "s3fifo": S3FifoPlacementPolicy,
}


@dataclass
class AdaptivePlacementPolicy(PlacementPolicy):
    """Issue 22's adaptive reuse predictor in the placement hook: the engine's nodes leave in
    the order of whichever simple policy would have served the most prompt tokens lately.

    The offline form (:class:`~superinfer.policy_core.reuse_adaptive.AdaptiveCache`) sees whole
    requests over a known block forest; this one sees only what the hook shows, the engine's
    cached nodes at each eviction. It keeps one shadow cache per expert (keys only, no KV) over
    the nodes' chunks (:attr:`PrefixNodeView.chunk_keys`, content keys of fixed-size pieces that
    an engine's split of a node does not change; a node without them is one chunk keyed
    :attr:`PrefixNodeView.key`), each shadow as many chunks as the engine has shown at once, so
    that a prefix the engine evicted and inserted again, or split, is a hit in a shadow that
    kept it. At each call the nodes accessed since the last one (last access newer than last
    seen; oldest first, deeper first on ties) are fed to every shadow, each node's chunks last
    first (so that a parent is more recent than its child, as offline); each access of a chunk
    adds its tokens (the node's tokens over its chunks) to the score of every shadow that held
    it (the tokens that policy would have served from its cache), and all scores halve every
    ``half_life_tokens`` tokens accessed. The shadows never hear of the engine's evictions: each
    is its own policy's whole cache.

    The shadows only choose the leader. The nodes are ordered by the leader's own placement
    policy (:class:`LRUPlacementPolicy`, :class:`ArcPlacementPolicy`,
    :class:`S3FifoPlacementPolicy`), one of each kept in step with the engine on every call
    (fed the same accesses and the engine's evictions, as the ``lru``, ``arc`` and ``s3fifo``
    plugins are), so that with one leader throughout the decisions are that plugin's exactly;
    a shadow, which never hears of the engine's evictions, holds other content than the
    engine. The first expert leads at the start (cold start: LRU's order exactly); another
    takes the lead when its score exceeds the leader's by
    ``switch_margin`` of the decayed tokens accessed (a lead in token hit rate) and by
    ``min_lead_tokens``, so near-tied experts are not chased. Never pins. Work per call:
    O(accessed chunks x experts) for the shadows and each expert plugin's own work.

    Attributes:
        experts: shadow policies, among ``lru``, ``arc``, ``s3fifo``; the first is the cold start.
        half_life_tokens: half-life of the scores, in tokens accessed.
        switch_margin: lead in decayed token hit rate needed to take the lead.
        min_lead_tokens: lead in decayed hit tokens needed to take the lead.
        leader: the expert followed now.
        scores: decayed hit tokens of each shadow; ``accessed``: decayed tokens accessed.
        switches: (call number, old leader, new leader) of each change of leader.

    Raises:
        ValueError: an unknown or repeated expert, or a value out of range.
    """

    name: ClassVar[str] = "adaptive"

    experts: tuple[str, ...] = ("lru", "s3fifo", "arc")
    half_life_tokens: float = 65_536.0
    switch_margin: float = 0.005
    min_lead_tokens: float = 256.0
    leader: str = field(default="", init=False)
    scores: dict[str, float] = field(default_factory=dict, init=False)
    accessed: float = field(default=0.0, init=False)
    switches: list[tuple[int, str, str]] = field(default_factory=list, init=False)
    _shadows: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    _orders: dict[str, PlacementPolicy] = field(default_factory=dict, init=False, repr=False)
    _seen: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _chunks: dict[str, tuple[tuple[str, ...], float]] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if (
            not self.experts
            or len(set(self.experts)) < len(self.experts)
            or any(e not in _SHADOWS for e in self.experts)
        ):
            raise ValueError(f"experts must be distinct names among {sorted(_SHADOWS)}, "
                             f"got {self.experts}")  # fmt: skip
        if not self.half_life_tokens > 0:
            raise ValueError(f"half_life_tokens must be > 0, got {self.half_life_tokens}")
        if min(self.switch_margin, self.min_lead_tokens) < 0:
            raise ValueError("switch_margin and min_lead_tokens must be >= 0")
        self.leader = self.experts[0]
        self.scores = dict.fromkeys(self.experts, 0.0)
        self._orders = {e: _ORDERS[e]() for e in self.experts}

    def decide(
        self,
        nodes: tuple[PrefixNodeView, ...],
        now_s: float,
        free_hbm_blocks: int,
        free_cpu_blocks: int,
        needed_hbm_blocks: int,
        total_hbm_blocks: int,
    ) -> PlacementDecision:
        """:meth:`PlacementPolicy.decide`, after noting each node's chunks and their tokens."""
        self._chunks = {}
        for nd in nodes:
            chunks = nd.chunk_keys or (nd.key,)
            self._chunks[nd.key] = chunks, nd.num_tokens / len(chunks)
        return super().decide(
            nodes, now_s, free_hbm_blocks, free_cpu_blocks, needed_hbm_blocks, total_hbm_blocks
        )

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        out.update(leader=self.leader, switches=len(self.switches), scores=dict(self.scores),
                   accessed_tokens=self.accessed)  # fmt: skip
        return out

    def _scores(
        self, keys: NDArray[Any], cols: NodeColumns, now_s: float, has_cpu_tier: bool
    ) -> tuple[FloatArray | ScoreFn, FloatArray | ScoreFn | None, bool]:
        n = len(keys)
        shown = max(sum(len(c) for c, _ in self._chunks.values()), 1)
        if not self._shadows:
            self._shadows = {e: _SHADOWS[e](shown) for e in self.experts}
        for shadow in self._shadows.values():
            shadow.capacity = max(shown, shadow.capacity)
        last = now_s - cols.age_s
        fresh = [i for i in range(n) if self._seen.get(keys[i], -np.inf) < last[i]]
        fresh.sort(key=lambda i: (last[i], -cols.depth[i]))
        hits = dict.fromkeys(self.experts, 0.0)
        total = 0.0
        for i in fresh:
            self._seen[keys[i]] = float(last[i])
            chunks, tokens = self._chunks[keys[i]]
            for chunk in reversed(chunks):
                total += tokens
                for name, shadow in self._shadows.items():
                    if chunk in shadow:
                        hits[name] += tokens
                    shadow.access(chunk)
        self._update_leader(hits, total)
        orders = {e: p._scores(keys, cols, now_s, has_cpu_tier) for e, p in self._orders.items()}
        score = orders[self.leader][0]
        if len(self._seen) > 4 * n:  # forget nodes accessed long ago
            self._seen = {k: t for k, t in self._seen.items() if k in self._chunks}
        return score, None, False

    def _update_leader(self, hits: dict[str, float], total: float) -> None:
        decay = 0.5 ** (total / self.half_life_tokens)
        for name in self.experts:
            self.scores[name] = self.scores[name] * decay + hits[name]
        self.accessed = self.accessed * decay + total
        best = max(self.experts, key=lambda e: self.scores[e])  # first expert wins a tie
        lead = self.scores[best] - self.scores[self.leader]
        if lead > self.switch_margin * self.accessed and lead > self.min_lead_tokens:
            self.switches.append((self.num_calls, self.leader, best))
            _log.warning("adaptive placement: %s leads %s at call %d (%.0f vs %.0f of %.0f "
                         "decayed tokens)", best, self.leader, self.num_calls, self.scores[best],
                         self.scores[self.leader], self.accessed)  # fmt: skip
            self.leader = best


#: Placement policies by name (the names of their plugins' entry points).
PLACEMENT_POLICIES: dict[str, type[PlacementPolicy]] = {
    cls.name: cls
    for cls in (
        LRUPlacementPolicy,
        LFUPlacementPolicy,
        ReusePlacementPolicy,
        ArcPlacementPolicy,
        S3FifoPlacementPolicy,
        AdaptivePlacementPolicy,
    )
}
