"""KV placement planner (DESIGN §6): from HBM / CPU capacities and keep-scores, pin, offload or
drop prefix-cache nodes.

Nodes form a forest (``parent`` links); a node is only useful while its whole prefix is cached,
so eviction always takes leaves, as SGLang's radix cache does (``RadixCache.evict``, v0.5): a
node leaves HBM only when none of its children is in HBM, and leaves the cache only when none of
its children is cached anywhere. Among leaves the lowest score goes first.

::

    need = needed_hbm_blocks            HBM leaves, lowest score first, until need is met
      victims --(CPU tier?)--> offload  (CPU over capacity? drop its lowest-score leaves,
                                          victims included, until the rest fits)
      no CPU tier -----------> drop
    pins: highest path score first (ancestor-closed), >= pin_min_score, <= max_pinned_frac
    prefetch: CPU nodes queued requests wait for, parents first, within free HBM
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from superinfer.policy_core.types import KVLocation, Placement, PlacementDecision, PrefixNodeView

__all__ = ["ScoreFn", "PlacementPlan", "PlacementPlanner", "eviction_order", "parent_index"]

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
#: Scores of the nodes at the given indices, shape (M,) -> (M,).
ScoreFn = Callable[[IntArray], FloatArray]


@dataclass(frozen=True, slots=True)
class PlacementPlan:
    """A plan as indices into the node arrays it was made from (each sorted ascending).

    Attributes:
        drop: nodes to free (from HBM or CPU).
        offload: HBM nodes to move to CPU memory.
        pin: HBM nodes the engine must not evict until the next plan.
        prefetch: CPU nodes to load back to HBM, in load order (parents first).
    """

    drop: IntArray
    offload: IntArray
    pin: IntArray
    prefetch: IntArray


@dataclass(frozen=True, slots=True)
class PlacementPlanner:
    """Decides pin / offload / drop per node from keep-scores and the HBM and CPU capacities.

    Attributes:
        max_pinned_frac: most HBM blocks pinned, as a fraction of ``total_hbm_blocks``; the rest
            of HBM stays reclaimable, so running requests never starve behind pins.
        pin_min_score: calibrated score (P(reuse within the horizon)) from which a node is
            pinned; pins are made only from calibrated scores.
        offload_min_score: calibrated score under which an evicted node is dropped rather than
            offloaded (not worth the transfer); 0 offloads every victim that fits.
        prefetch_reserve_frac: HBM fraction a prefetch leaves free for new allocations.

    Raises:
        ValueError: a fraction outside [0, 1].
    """

    max_pinned_frac: float = 0.2
    pin_min_score: float = 0.5
    offload_min_score: float = 0.0
    prefetch_reserve_frac: float = 0.05

    def __post_init__(self) -> None:
        for key in (
            "max_pinned_frac",
            "pin_min_score",
            "offload_min_score",
            "prefetch_reserve_frac",
        ):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{key} must be in [0, 1], got {value}")

    def plan_arrays(
        self,
        *,
        score: FloatArray | ScoreFn,
        parent: IntArray,
        depth: IntArray,
        num_blocks: IntArray,
        in_hbm: BoolArray,
        needed_hbm_blocks: int,
        free_hbm_blocks: int,
        free_cpu_blocks: int,
        total_hbm_blocks: int,
        has_cpu_tier: bool,
        calibrated: bool,
        in_use: BoolArray | None = None,
        waiting_refs: IntArray | None = None,
        cpu_score: FloatArray | ScoreFn | None = None,
        pins: bool = True,
    ) -> PlacementPlan:
        """Plan for N nodes given as arrays of shape (N,).

        Args:
            score: keep-priority (higher = keep), probabilities when ``calibrated``; or a
                function from node indices, shape (M,), to their scores, called only for the
                nodes the plan looks at (eviction candidates, and every HBM node for pins).
            parent: index of each node's parent in these arrays, -1 for a root.
            depth: nodes between the root and the node (tie-break: deeper leaves go first).
            num_blocks: KV blocks each node holds.
            in_hbm: True for HBM nodes, False for CPU nodes.
            needed_hbm_blocks: HBM blocks to free now (0: only pins and prefetches).
            free_hbm_blocks: free HBM blocks before this plan.
            free_cpu_blocks: free CPU blocks before this plan.
            total_hbm_blocks: HBM capacity in blocks (the pin cap is a fraction of it).
            has_cpu_tier: whether offload and prefetch are possible.
            calibrated: whether ``score`` is a probability (pins and ``offload_min_score`` need it).
            in_use: nodes running requests reference: never dropped nor offloaded (default none).
            waiting_refs: queued requests waiting on each node: evicted only as a last resort,
                and prefetched from CPU (default none).
            cpu_score: keep-priority for the CPU tier's own evictions (default ``score``).
            pins: whether to compute pins (an offline replay has no engine eviction to guard).

        Returns:
            The plan. It frees fewer than ``needed_hbm_blocks`` only when every HBM node that is
            not in use is already a victim.
        """
        n = len(parent)
        hbm_score = _Scores(score, parent)
        protected = (
            np.zeros(n, dtype=bool) if waiting_refs is None else np.asarray(waiting_refs) > 0
        )
        eligible = in_hbm if in_use is None else in_hbm & ~in_use
        victims = _evict_leaves(
            hbm_score,
            depth,
            parent,
            num_blocks,
            protected,
            member=in_hbm,
            eligible=eligible,
            need=needed_hbm_blocks,
        )
        victim_mask = np.zeros(n, dtype=bool)
        victim_mask[victims] = True
        drop_mask = np.zeros(n, dtype=bool)
        offload_mask = np.zeros(n, dtype=bool)
        if has_cpu_tier and len(victims):
            if calibrated and self.offload_min_score > 0.0:
                low = hbm_score.of(victims) < self.offload_min_score
                drop_mask[victims[low]] = True
            to_cpu = victim_mask & ~drop_mask
            overflow = int(num_blocks[to_cpu].sum()) - free_cpu_blocks
            if overflow > 0:
                cached = ~drop_mask
                cpu_drops = _evict_leaves(
                    hbm_score if cpu_score is None else _Scores(cpu_score, parent),
                    depth,
                    parent,
                    num_blocks,
                    protected,
                    member=cached,
                    eligible=cached & (~in_hbm | to_cpu),
                    need=overflow,
                )
                drop_mask[cpu_drops] = True
            offload_mask = victim_mask & ~drop_mask
        else:
            drop_mask = victim_mask
        freed_hbm = int(num_blocks[victim_mask].sum())
        pin = np.zeros(0, dtype=np.int64)
        if pins and calibrated and total_hbm_blocks > 0:
            cap = int(self.max_pinned_frac * total_hbm_blocks)
            keep = in_hbm & ~victim_mask
            pin = _top_closed(
                hbm_score.all_of(keep),
                parent,
                depth,
                num_blocks,
                keep,
                min_score=self.pin_min_score,
                budget=cap,
            )
        prefetch = np.zeros(0, dtype=np.int64)
        if has_cpu_tier and waiting_refs is not None:
            reserve = int(self.prefetch_reserve_frac * total_hbm_blocks)
            budget = free_hbm_blocks + freed_hbm - needed_hbm_blocks - reserve
            wanted = ~in_hbm & protected & ~drop_mask
            if budget > 0 and wanted.any():
                prefetch = _best_first(
                    np.asarray(waiting_refs, dtype=np.float64),
                    parent,
                    num_blocks,
                    wanted,
                    min_score=0.0,
                    budget=budget,
                    strict=True,
                    reachable=in_hbm & ~victim_mask,
                )
        return PlacementPlan(
            drop=np.flatnonzero(drop_mask),
            offload=np.flatnonzero(offload_mask),
            pin=np.sort(pin),
            prefetch=prefetch,
        )

    def plan(
        self,
        nodes: Sequence[PrefixNodeView],
        scores: FloatArray,
        *,
        needed_hbm_blocks: int,
        free_hbm_blocks: int,
        free_cpu_blocks: int,
        total_hbm_blocks: int,
        calibrated: bool,
    ) -> PlacementDecision:
        """:meth:`plan_arrays` on engine views; returns the decision the hook hands back.

        A CPU tier exists when CPU blocks are free or some node is in CPU memory.
        """
        index = {node.node_id: i for i, node in enumerate(nodes)}
        parent = parent_index(nodes, index)
        in_hbm = np.fromiter((nd.location is KVLocation.HBM for nd in nodes), bool, len(nodes))
        plan = self.plan_arrays(
            score=scores,
            parent=parent,
            depth=np.fromiter((nd.depth for nd in nodes), np.int64, len(nodes)),
            num_blocks=np.fromiter((nd.num_blocks for nd in nodes), np.int64, len(nodes)),
            in_hbm=in_hbm,
            in_use=np.fromiter((nd.in_use for nd in nodes), bool, len(nodes)),
            waiting_refs=np.fromiter((nd.num_waiting_refs for nd in nodes), np.int64, len(nodes)),
            needed_hbm_blocks=needed_hbm_blocks,
            free_hbm_blocks=free_hbm_blocks,
            free_cpu_blocks=free_cpu_blocks,
            total_hbm_blocks=total_hbm_blocks,
            has_cpu_tier=free_cpu_blocks > 0 or not bool(in_hbm.all()),
            calibrated=calibrated,
        )
        actions: dict[str, Placement] = {}
        for idx, placement in (
            (plan.drop, Placement.DROP),
            (plan.offload, Placement.OFFLOAD),
            (plan.pin, Placement.PIN),
        ):
            for i in idx.tolist():
                actions[nodes[i].node_id] = placement
        prefetch = tuple(nodes[i].node_id for i in plan.prefetch.tolist())
        return PlacementDecision(actions=actions, prefetch=prefetch)


def parent_index(nodes: Sequence[PrefixNodeView], index: Mapping[str, int]) -> IntArray:
    """Shape (N,): each node's parent's position in ``nodes``; -1 for a root or unlisted parent."""
    return np.fromiter(
        (index.get(nd.parent_id, -1) if nd.parent_id is not None else -1 for nd in nodes),
        np.int64,
        len(nodes),
    )


def eviction_order(
    score: FloatArray | ScoreFn, parent: IntArray, depth: IntArray, need: int
) -> IntArray:
    """The first ``need`` nodes (one block each, all in HBM, none in use) that repeated leaf
    eviction takes, in the order it takes them: what :meth:`PlacementPlanner.plan_arrays` drops
    for ``needed_hbm_blocks=need`` without a CPU tier, ordered (its first ``k`` are the plan for
    ``k``, as the eviction is greedy). Shapes as in :meth:`PlacementPlanner.plan_arrays`; fewer
    than ``need`` when fewer nodes exist."""
    n = len(parent)
    every = np.ones(n, dtype=bool)
    return _evict_leaves(
        _Scores(score, parent),
        depth,
        parent,
        np.ones(n, dtype=np.int64),
        np.zeros(n, dtype=bool),
        member=every,
        eligible=every,
        need=need,
    )


class _Scores:
    """Scores of the nodes, computed on first use when given as a function."""

    #: Ancestors scored together with an exposed node (a chain is usually evicted whole).
    CHAIN = 64

    def __init__(self, score: FloatArray | ScoreFn, parent: IntArray) -> None:
        self._parent = parent
        if callable(score):
            self._fn: ScoreFn | None = score
            self._val = np.full(len(parent), np.nan)
        else:
            self._fn = None
            self._val = np.asarray(score, dtype=np.float64)
            if self._val.shape != parent.shape:
                raise ValueError(f"score has shape {self._val.shape}, expected {parent.shape}")

    def of(self, idx: IntArray) -> FloatArray:
        if self._fn is not None:
            missing = idx[np.isnan(self._val[idx])]
            if len(missing):
                self._val[missing] = self._fn(missing)
        return self._val[idx]

    def all_of(self, mask: BoolArray) -> FloatArray:
        """Scores of every node, shape (N,), computed where ``mask`` (others may be NaN)."""
        self.of(np.flatnonzero(mask))
        return self._val

    def one(self, i: int) -> float:
        value = float(self._val[i])
        if value != value and self._fn is not None:  # NaN: not scored yet
            chain = [i]
            up = int(self._parent[i])
            while up >= 0 and len(chain) < self.CHAIN and self._val[up] != self._val[up]:
                chain.append(up)
                up = int(self._parent[up])
            self._val[chain] = self._fn(np.asarray(chain, dtype=np.int64))
            value = float(self._val[i])
        return value


def _evict_leaves(
    score: _Scores,
    depth: IntArray,
    parent: IntArray,
    num_blocks: IntArray,
    protected: BoolArray,
    *,
    member: BoolArray,
    eligible: BoolArray,
    need: int,
) -> IntArray:
    """Greedy leaf eviction: repeatedly take the eligible ``member`` leaf (no ``member`` child)
    with the lowest key (protected, score, -depth, index) until ``need`` blocks are taken."""
    if need <= 0:
        return np.zeros(0, dtype=np.int64)
    has_parent = member & (parent >= 0)
    children = np.bincount(parent[has_parent], minlength=len(parent))
    leaves = np.flatnonzero(eligible & (children == 0))
    leaf_score = score.of(leaves)
    order = np.lexsort((leaves, -depth[leaves], leaf_score, protected[leaves]))
    ranked = leaves[order]
    ranked_score = leaf_score[order]
    exposed: list[tuple[bool, float, int, int]] = []
    taken: list[int] = []
    freed, j = 0, 0
    next_key = _leaf_key(ranked, ranked_score, protected, depth, j)
    while freed < need:
        if exposed and (next_key is None or exposed[0] < next_key):
            node = heapq.heappop(exposed)[3]
        elif next_key is not None:
            node = next_key[3]
            j += 1
            next_key = _leaf_key(ranked, ranked_score, protected, depth, j)
        else:
            break
        taken.append(node)
        freed += int(num_blocks[node])
        up = int(parent[node])
        if up >= 0 and member[up]:
            children[up] -= 1
            if children[up] == 0 and eligible[up]:
                key = (bool(protected[up]), score.one(up), -int(depth[up]), up)
                heapq.heappush(exposed, key)
    return np.asarray(taken, dtype=np.int64)


def _leaf_key(
    ranked: IntArray, ranked_score: FloatArray, protected: BoolArray, depth: IntArray, j: int
) -> tuple[bool, float, int, int] | None:
    if j >= len(ranked):
        return None
    i = int(ranked[j])
    return (bool(protected[i]), float(ranked_score[j]), -int(depth[i]), i)


def _top_closed(
    score: FloatArray,
    parent: IntArray,
    depth: IntArray,
    num_blocks: IntArray,
    member: BoolArray,
    *,
    min_score: float,
    budget: int,
) -> IntArray:
    """The longest prefix of ``member`` nodes in order of (path score desc, depth, index) with
    path score >= ``min_score`` and blocks <= ``budget``, where a node's path score is the least
    score on its path from its root (members only). A parent's path score is >= its child's and
    it is shallower, so every prefix is ancestor-closed. O(N log depth) numpy work."""
    path = np.where(member, score, -np.inf)
    up = np.where(member, parent, -1)
    up = np.where((up >= 0) & member[np.maximum(up, 0)], up, -1)
    while True:  # pointer jumping: after k rounds, path covers 2^k ancestors
        has = up >= 0
        if not has.any():
            break
        anc = np.maximum(up, 0)
        path = np.where(has, np.minimum(path, path[anc]), path)
        up = np.where(has, up[anc], -1)
    cand = np.flatnonzero(path >= min_score)
    order = cand[np.lexsort((cand, depth[cand], -path[cand]))]
    fits = np.cumsum(num_blocks[order]) <= budget
    stop = int(np.argmin(fits)) if not fits.all() else len(order)
    chosen: np.ndarray = order[:stop]
    return chosen


def _best_first(
    score: FloatArray,
    parent: IntArray,
    num_blocks: IntArray,
    member: BoolArray,
    *,
    min_score: float,
    budget: int,
    strict: bool = False,
    reachable: BoolArray | None = None,
) -> IntArray:
    """Grow an ancestor-closed set of ``member`` nodes from the roots, highest score first,
    taking nodes with score >= ``min_score`` (> if ``strict``) while their blocks fit ``budget``.

    A root is a member whose parent is -1 or (with ``reachable``) a reachable node. A node whose
    blocks do not fit is skipped with its subtree. Returns the nodes in the order taken, so
    parents always come before their children.
    """
    children_of: dict[int, list[int]] = {}
    members = np.flatnonzero(member)
    for i, p in zip(members.tolist(), parent[members].tolist(), strict=True):
        children_of.setdefault(p, []).append(i)
    heap = [
        (-float(score[i]), i)
        for i in members.tolist()
        if parent[i] < 0 or (reachable is not None and bool(reachable[parent[i]]))
    ]
    heapq.heapify(heap)
    taken: list[int] = []
    used = 0
    while heap:
        neg, i = heapq.heappop(heap)
        if -neg < min_score or (strict and -neg <= min_score):
            break  # every node left in the heap or below it scores lower
        if used + int(num_blocks[i]) > budget:
            continue
        used += int(num_blocks[i])
        taken.append(i)
        for c in children_of.get(i, ()):
            heapq.heappush(heap, (-float(score[c]), c))
    return np.asarray(taken, dtype=np.int64)
