"""Priority-aware prefix-cache eviction: the nodes of the least urgent requests leave HBM first,
least recently used first among nodes of the same urgency.

This is SGLang 0.5.23's ``--radix-eviction-policy priority``
(``sglang/srt/mem_cache/evict_policy.py`` ``PriorityStrategy``: victims ordered by
``(node.priority, node.last_access_time)``, a node's priority the highest of the requests that
inserted or matched it, ``radix_cache.py``) and TensorRT-LLM's prioritized LRU
(``KvCacheRetentionConfig``), offered to every engine with a prefix cache through the
``superinfer_kv_placement`` hook. A node's urgency is that of the most urgent SLO class among the
requests that touched it (``PrefixNodeView.slo_classes``); a class's urgency is the most urgent
``SLO.priority`` (lower is more urgent) the policy has seen a request of that class arrive with.
Beyond that order (which alone kept only 25% of ``kv_retention``'s prefix under ``superinfer``
on ``sim:vllm`` in a development run), the most urgent class's nodes, most recently used first,
are pinned up to ``max_pinned_frac`` of HBM once requests of a less urgent class have arrived:
the engine then frees the rest among unpinned nodes and, if still short, preempts
(``hookspecs.superinfer_kv_placement``), so a high-priority shared prefix survives low-priority
pressure (conformance ``kv_retention``, vLLM #47802) while lower-priority work keeps the rest of
HBM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from superinfer.policy_core.kv_placement import FloatArray, PlacementPolicy
from superinfer.policy_core.kv_placement_plan import ScoreFn
from superinfer.policy_core.reuse import NodeColumns
from superinfer.policy_core.types import (
    KVLocation,
    Placement,
    PlacementDecision,
    PrefixNodeView,
    RequestView,
)

__all__ = ["PriorityPlacementPolicy"]

#: Score distance between two urgency ranks, larger than any node age in s (a year), so that rank
#: orders first and age (LRU) only within a rank.
_RANK_SPAN = 3.2e7


@dataclass
class PriorityPlacementPolicy(PlacementPolicy):
    """Evict by (urgency of the node's most urgent SLO class, least recently used).

    A node none of whose classes has been seen arriving (or with no class) ranks below every
    known class: it goes first.
    """

    name: ClassVar[str] = "priority"

    _rank: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _ranks: NDArray[np.float64] | None = field(default=None, init=False, repr=False)

    def observe_request(self, request: RequestView) -> None:
        """Learn the urgency of ``request``'s SLO class (its ``slo.priority``; lower is more
        urgent); the most urgent seen for a class is kept."""
        slo = request.slo
        known = self._rank.get(slo.name)
        if known is None or slo.priority < known:
            self._rank[slo.name] = slo.priority

    def decide(
        self,
        nodes: tuple[PrefixNodeView, ...],
        now_s: float,
        free_hbm_blocks: int,
        free_cpu_blocks: int,
        needed_hbm_blocks: int,
        total_hbm_blocks: int,
    ) -> PlacementDecision:
        """:meth:`PlacementPolicy.decide` with scores from each node's class urgency."""
        ranks = self._ranks = self.node_ranks(nodes)  # read by _scores, once per call
        try:
            decision = super().decide(
                nodes, now_s, free_hbm_blocks, free_cpu_blocks, needed_hbm_blocks, total_hbm_blocks
            )
        finally:
            self._ranks = None
        pins = self._urgent_pins(nodes, ranks, total_hbm_blocks)
        if not pins:
            return decision
        actions = dict(decision.actions)
        actions.update((node_id, Placement.PIN) for node_id in pins)
        return PlacementDecision(actions=actions, prefetch=decision.prefetch)

    def _urgent_pins(
        self, nodes: tuple[PrefixNodeView, ...], ranks: NDArray[np.float64], total_hbm_blocks: int
    ) -> list[str]:
        """Ids of the most urgent class's HBM nodes to pin (``ranks``: :meth:`node_ranks` of
        ``nodes``): most recently used first (parents before children on ties), while their
        blocks fit ``max_pinned_frac`` of HBM; none until a request of a less urgent class has
        arrived."""
        if not nodes:
            return []
        top = ranks.min()
        if top >= max(self._rank.values(), default=0):
            return []  # no less urgent class has arrived: nothing to protect these nodes from
        urgent = [
            i for i, nd in enumerate(nodes) if ranks[i] == top and nd.location is KVLocation.HBM
        ]
        urgent.sort(key=lambda i: (-nodes[i].last_access_s, nodes[i].depth, nodes[i].node_id))
        budget = int(self.max_pinned_frac * total_hbm_blocks)
        pins = []
        for i in urgent:
            blocks = max(nodes[i].num_blocks, 1)
            if blocks <= budget:
                budget -= blocks
                pins.append(nodes[i].node_id)
        return pins

    def node_ranks(self, nodes: tuple[PrefixNodeView, ...]) -> NDArray[np.float64]:
        """Urgency rank per node, shape ``(len(nodes),)``: the smallest ``SLO.priority`` among
        its known classes, or one past the largest known for a node with none known."""
        rank = self._rank
        unknown = float(max(rank.values(), default=0) + 1)
        return np.fromiter(
            (min((float(rank[c]) for c in nd.slo_classes if c in rank), default=unknown)
             for nd in nodes),
            np.float64,
            len(nodes),
        )  # fmt: skip

    def _scores(
        self, keys: NDArray[Any], cols: NodeColumns, now_s: float, has_cpu_tier: bool
    ) -> tuple[FloatArray | ScoreFn, FloatArray | ScoreFn | None, bool]:
        assert self._ranks is not None, "_scores runs inside decide"
        score: FloatArray = -self._ranks * _RANK_SPAN - cols.age_s
        return score, None, False
