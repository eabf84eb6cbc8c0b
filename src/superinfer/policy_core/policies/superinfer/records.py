"""What the ``superinfer`` policy remembers: one record per live request, per-replica queues
(waiting and swapped heaps per tier, the aged and due heaps, the stride passes) and the decision
being built for one call. Data only; the classes that use them are the other modules here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from superinfer.policy_core.types import PreemptMode, RequestView, StepState

_WAITING, _RUNNING, _SWAPPED, _GONE = 0, 1, 2, 3
_INF = math.inf


def _decode_blocks(v: RequestView, bs: int) -> int:
    """HBM blocks a running request's next decode token takes, as ``step_blocks(v, 1, state,
    admit=False)`` counts them (the engines' decision check): the FP16 pages its tokens fill minus
    the blocks it holds. For a request whose KV is quantized that overstates its growth (its
    blocks hold more tokens), the same way for the policy and the check."""
    return -(-(v.computed_tokens + 1) // bs) - v.kv_blocks


#: In-tier key offset that puts best-effort requests behind every feasible one (keys are instants,
#: s; 1e9 s is beyond any trace).
_BEST_EFFORT_KEY = 1e9


class _Entry:
    """What the policy remembers about one live request."""

    __slots__ = (
        "rid",
        "slo_name",
        "weight",
        "arrival_s",
        "ttft_s",
        "tpot_s",
        "deadline_s",
        "replica",
        "where",
        "view",
        "stale",
        "tier",
        "reported_tier",
        "version",
        "check_version",
        "key",
        "queued_s",
        "lost_tokens",
        "demote_at",
        "resident_service",
        "best_effort",
        "aged",
        "next_check_s",
    )

    def __init__(self, view: RequestView) -> None:
        slo = view.slo
        self.rid = view.request_id
        self.slo_name = slo.name
        self.weight = slo.weight
        self.arrival_s = view.arrival_s
        self.ttft_s = None if slo.ttft_ms is None else slo.ttft_ms / 1e3
        self.tpot_s = None if slo.tpot_ms is None else slo.tpot_ms / 1e3
        self.deadline_s = None if slo.deadline_s is None else view.arrival_s + slo.deadline_s
        self.replica = view.replica
        self.where = _WAITING
        self.view = view
        self.stale = False
        self.tier = 0
        self.reported_tier = view.tier
        self.version = 0
        self.check_version = 0
        self.key = 0.0
        self.queued_s = view.arrival_s
        self.lost_tokens = 0
        self.demote_at: float = _INF
        self.resident_service = 0
        self.best_effort = False
        self.aged = False
        self.next_check_s = _INF


def _entry_key(e: _Entry) -> float:
    return e.key


class _Replica:
    """Per-replica queues: waiting and swapped heaps per tier, aged and due heaps."""

    def __init__(self, index: int, num_tiers: int) -> None:
        self.index = index
        self.waiting: dict[str, _Entry] = {}
        self.swapped: dict[str, _Entry] = {}
        self.heaps: list[list[tuple[float, int, str, int]]] = [[] for _ in range(num_tiers)]
        self.swap_heaps: list[list[tuple[float, int, str, int]]] = [[] for _ in range(num_tiers)]
        self.shed_heaps: list[list[tuple[int, float, float, int, str, int]]] = [
            [] for _ in range(num_tiers)
        ]
        self.count = [0] * num_tiers  # waiting (not aged) per tier
        self.feasible = [0] * num_tiers  # waiting, neither aged nor best effort, per tier
        self.aged: list[tuple[float, int, str, int]] = []
        self.due: list[tuple[float, int, str, int]] = []
        self.passes = [0.0] * num_tiers
        self.active = [False] * num_tiers
        self.num_stale = 0
        self.prefill_chunk_tokens = 0.0  # last step's prefill allowance (for estimates)
        self.num_decodes = 0
        self.next_running_check_s = _INF
        self.run_due: list[tuple[float, str, int]] = []  # running checks: (when, id, version)
        self.unreported: list[_Entry] = []  # new entries whose tier the engine has not seen
        self.token_budget = 1 << 30  # the replica's step token budget, once a state showed it


@dataclass
class _Step:
    """The decision being built for one call (mutable scratch)."""

    state: StepState
    free: int
    budget: int
    seats: int
    free_cpu: int
    swap_out_bytes: float
    swap_in_bytes: float
    tokens: dict[str, int] = field(default_factory=dict)
    new_blocks: dict[str, int] = field(default_factory=dict)
    admit: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)
    preempt: dict[str, PreemptMode] = field(default_factory=dict)
    reject: dict[str, str] = field(default_factory=dict)
    prefetch: list[str] = field(default_factory=list)
    changed: list[_Entry] = field(default_factory=list)
    queued_views: dict[str, RequestView] | None = None  # built on the first admission attempt
    worst_tier: int = -1  # worst tier among running requests (nothing to preempt below it)
