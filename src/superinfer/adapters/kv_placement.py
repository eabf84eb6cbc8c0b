"""Prefix-cache placement plugins behind ``superinfer_kv_placement``: the reuse predictor with the
placement planner (``reuse``), and LRU / LFU / ARC / S3-FIFO through the same planner (``lru``,
``lfu``, ``arc``, ``s3fifo``), the adaptive predictor that follows the best of LRU, ARC and
S3-FIFO (``adaptive``; ``adaptive-regret`` judges them by regret), the reuse-hazard expert
(``hazard``: hit density of each node's learned time to reuse), and priority-aware LRU
(``priority``: SGLang's ``--radix-eviction-policy priority`` for any engine).

They are registered in the entry-point group ``superinfer.kv_policies`` and enabled with
``build_plugin_manager(policy, kv_policy="reuse")``. Each plugin is its pure policy of
:mod:`superinfer.policy_core.kv_placement` (the same options, state and decisions) plus the hook
implementation, which only forwards to :meth:`PlacementPolicy.decide`.
"""

from __future__ import annotations

from superinfer.adapters.hookspecs import hookimpl
from superinfer.policy_core.kv_placement import (
    ArcPlacementPolicy,
    LFUPlacementPolicy,
    LRUPlacementPolicy,
    PlacementPolicy,
    ReusePlacementPolicy,
    S3FifoPlacementPolicy,
)
from superinfer.policy_core.kv_placement_adaptive import (
    AdaptivePlacementPolicy,
    AdaptiveRegretPlacementPolicy,
)
from superinfer.policy_core.kv_placement_hazard import HazardPlacementPolicy
from superinfer.policy_core.kv_priority import PriorityPlacementPolicy
from superinfer.policy_core.types import PlacementDecision, PrefixNodeView, RequestView

__all__ = [
    "KV_POLICIES",
    "AdaptivePlacement",
    "AdaptiveRegretPlacement",
    "ArcPlacement",
    "HazardPlacement",
    "LFUPlacement",
    "LRUPlacement",
    "PriorityPlacement",
    "ReusePlacement",
    "S3FifoPlacement",
]


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


class _ArrivalHook(_PlacementHook):
    """The placement hook, and each new request passed to the policy's ``observe_request``
    (the adaptive plugins read its prompt; ``priority`` learns its class's urgency)."""

    @hookimpl
    def superinfer_request_arrived(self, request: RequestView, now_s: float) -> None:
        """Show the new request to the policy."""
        self.observe_request(request)  # type: ignore[attr-defined]


class LRUPlacement(_PlacementHook, LRUPlacementPolicy):
    """The ``lru`` plugin: :class:`~superinfer.policy_core.kv_placement.LRUPlacementPolicy`."""


class LFUPlacement(_PlacementHook, LFUPlacementPolicy):
    """The ``lfu`` plugin: :class:`~superinfer.policy_core.kv_placement.LFUPlacementPolicy`."""


class ReusePlacement(_PlacementHook, ReusePlacementPolicy):
    """The ``reuse`` plugin: :class:`~superinfer.policy_core.kv_placement.ReusePlacementPolicy`
    (its options are that class's attributes)."""


class ArcPlacement(_PlacementHook, ArcPlacementPolicy):
    """The ``arc`` plugin: :class:`~superinfer.policy_core.kv_placement.ArcPlacementPolicy`."""


class S3FifoPlacement(_PlacementHook, S3FifoPlacementPolicy):
    """The ``s3fifo`` plugin: :class:`~superinfer.policy_core.kv_placement.S3FifoPlacementPolicy`
    (S3-FIFO, Yang et al., SOSP 2023)."""


class AdaptivePlacement(_ArrivalHook, AdaptivePlacementPolicy):
    """The ``adaptive`` plugin:
    :class:`~superinfer.policy_core.kv_placement_adaptive.AdaptivePlacementPolicy` (issue 22's
    adaptive reuse predictor: the order of whichever of LRU, S3-FIFO and ARC would have hit
    most)."""


class AdaptiveRegretPlacement(_ArrivalHook, AdaptiveRegretPlacementPolicy):
    """The ``adaptive-regret`` plugin:
    :class:`~superinfer.policy_core.kv_placement_adaptive.AdaptiveRegretPlacementPolicy` (the
    adaptive predictor judging its experts by their regret on the engine's own cache)."""


class HazardPlacement(_ArrivalHook, HazardPlacementPolicy):
    """The ``hazard`` plugin:
    :class:`~superinfer.policy_core.kv_placement_hazard.HazardPlacementPolicy` (the reuse-hazard
    expert: evicts by the hit density of each node's learned time to reuse)."""


class PriorityPlacement(_ArrivalHook, PriorityPlacementPolicy):
    """The ``priority`` plugin:
    :class:`~superinfer.policy_core.kv_priority.PriorityPlacementPolicy`, which learns each SLO
    class's urgency from the requests that arrive."""


#: Placement plugins by the name their entry point has.
KV_POLICIES: dict[str, type[PlacementPolicy]] = {
    cls.name: cls
    for cls in (
        LRUPlacement,
        LFUPlacement,
        ReusePlacement,
        ArcPlacement,
        S3FifoPlacement,
        AdaptivePlacement,
        AdaptiveRegretPlacement,
        HazardPlacement,
        PriorityPlacement,
    )
}
