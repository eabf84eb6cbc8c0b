"""Pure policy logic: value types, SLOs, scheduling policies. Imports only the stdlib and numpy."""

from superinfer.policy_core.protocols import BasePolicy, SchedulerPolicy
from superinfer.policy_core.types import (
    SLO,
    KVLocation,
    KVPrecision,
    Placement,
    PlacementDecision,
    PreemptMode,
    PrefixNodeView,
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)

__all__ = [
    "SLO",
    "BasePolicy",
    "KVLocation",
    "KVPrecision",
    "Placement",
    "PlacementDecision",
    "PreemptMode",
    "PrefixNodeView",
    "RequestView",
    "ScheduleDecision",
    "SchedulerPolicy",
    "StepState",
    "StepStats",
]
