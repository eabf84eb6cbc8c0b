"""Prefix-cache placement policies: LRU, LFU, ARC, S3-FIFO and the learned reuse predictor (the
adaptive one is :mod:`superinfer.policy_core.kv_placement_adaptive`), each scoring the engine's
cached prefix nodes and letting :class:`PlacementPlanner` decide what to drop, offload to the CPU
tier, pin and prefetch (DESIGN §6).

Each keeps the access history of the nodes it is shown, by content (:attr:`PrefixNodeView.key`;
a bounded ghost table, so a node's history survives its eviction and reaches the copy the engine
inserts again). Pure: stdlib and numpy only; the pluggy plugins that answer
``superinfer_kv_placement`` with :meth:`PlacementPolicy.decide` are
``superinfer.adapters.kv_placement``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from superinfer.policy_core.kv_baselines import ArcCache, S3FifoCache
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
    "ArcPlacementPolicy",
    "S3FifoPlacementPolicy",
    "LFUPlacementPolicy",
    "LRUPlacementPolicy",
    "PlacementPolicy",
    "ReusePlacementPolicy",
    "accessed_since",
]

FloatArray = NDArray[np.float64]
_MAX_CLASSES = 4


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
        self._see(nodes, needed_hbm_blocks)
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

    def _see(self, nodes: tuple[PrefixNodeView, ...], needed_hbm_blocks: int) -> None:
        """The nodes (in ``_scores``' order) and the blocks to free, before scoring; a policy
        that needs more of the views than the history's columns keeps them here."""
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


def accessed_since(
    seen: dict[str, float], keys: NDArray[Any], last: FloatArray, depth: FloatArray
) -> list[int]:
    """Indices of the nodes whose last access ``last`` (s) is newer than ``seen`` records for
    their key, oldest first and deeper first on ties (so that a parent is more recent than its
    child): the accesses an order-keeping policy has not been fed yet. ``seen`` is not changed."""
    fresh = [i for i in range(len(keys)) if seen.get(keys[i], -np.inf) < last[i]]
    fresh.sort(key=lambda i: (last[i], -depth[i]))
    return fresh


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
        for i in accessed_since(self._seen, keys, last, cols.depth):
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


#: Placement policies by name (the names of their plugins' entry points).
PLACEMENT_POLICIES: dict[str, type[PlacementPolicy]] = {
    cls.name: cls
    for cls in (
        LRUPlacementPolicy,
        LFUPlacementPolicy,
        ReusePlacementPolicy,
        ArcPlacementPolicy,
        S3FifoPlacementPolicy,
    )
}
