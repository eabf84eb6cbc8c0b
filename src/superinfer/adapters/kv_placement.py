"""Prefix-cache placement plugins behind ``superinfer_kv_placement``: the reuse predictor with the
placement planner (``reuse``), and LRU / LFU through the same planner (``lru``, ``lfu``).

They are registered in the entry-point group ``superinfer.kv_policies`` and enabled with
``build_plugin_manager(policy, kv_policy="reuse")``. Each plugin is its pure policy of
:mod:`superinfer.policy_core.kv_placement` (the same options, state and decisions) plus the hook
implementation, which only forwards to :meth:`PlacementPolicy.decide`.
"""

from __future__ import annotations

from superinfer.adapters.hookspecs import hookimpl
from superinfer.policy_core.kv_placement import (
    LFUPlacementPolicy,
    LRUPlacementPolicy,
    PlacementPolicy,
    ReusePlacementPolicy,
)
from superinfer.policy_core.types import PlacementDecision, PrefixNodeView

__all__ = ["KV_POLICIES", "LFUPlacement", "LRUPlacement", "ReusePlacement"]


class _PlacementHook(PlacementPolicy):
    """The hook implementation every placement plugin shares."""

    @hookimpl
    def superinfer_kv_placement(
        self,
        nodes: tuple[PrefixNodeView, ...],
        now_s: float,
        free_hbm_blocks: int,
        free_cpu_blocks: int,
        needed_hbm_blocks: int,
        total_hbm_blocks: int,
    ) -> PlacementDecision:
        """Score ``nodes`` and plan; see ``hookspecs.superinfer_kv_placement``."""
        return self.decide(
            nodes,
            now_s,
            free_hbm_blocks,
            free_cpu_blocks,
            needed_hbm_blocks,
            total_hbm_blocks,
        )


class LRUPlacement(_PlacementHook, LRUPlacementPolicy):
    """The ``lru`` plugin: :class:`~superinfer.policy_core.kv_placement.LRUPlacementPolicy`."""


class LFUPlacement(_PlacementHook, LFUPlacementPolicy):
    """The ``lfu`` plugin: :class:`~superinfer.policy_core.kv_placement.LFUPlacementPolicy`."""


class ReusePlacement(_PlacementHook, ReusePlacementPolicy):
    """The ``reuse`` plugin: :class:`~superinfer.policy_core.kv_placement.ReusePlacementPolicy`
    (its options are that class's attributes)."""


#: Placement plugins by the name their entry point has.
KV_POLICIES: dict[str, type[PlacementPolicy]] = {
    cls.name: cls for cls in (LRUPlacement, LFUPlacement, ReusePlacement)
}
