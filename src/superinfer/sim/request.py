"""A request inside the simulator: its input spec and its mutable progress."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from superinfer.policy_core.types import SLO, KVLocation, KVPrecision, RequestView

if TYPE_CHECKING:
    from superinfer.sim.kv import Node

__all__ = ["RequestSpec", "RequestStatus", "SimRequest"]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload, as the simulator receives it.

    Attributes:
        request_id: unique id.
        arrival_s: arrival instant, s from the start of the workload.
        prompt_tokens: prompt length, tokens (>= 1).
        output_tokens: true output length, tokens (>= 1); hidden from policies.
        max_output_tokens: declared output cap (``max_tokens``), >= ``output_tokens``.
        slo: SLO class.
        source: where it came from (a trace or workload source name), for reporting.
        block_hashes: prefix-chained hashes of the prompt's KV blocks of ``hash_block_tokens``
            tokens each (Mooncake's ``hash_ids``); equal leading hashes mean a shared prefix.
            Empty when the workload carries no prefix information.
        hash_block_tokens: tokens per hashed block (512 for Mooncake); 0 when no hashes.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    max_output_tokens: int
    slo: SLO
    source: str = ""
    block_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = 0


class RequestStatus(str, enum.Enum):
    """Lifecycle state of a simulated request. Terminal: finished, rejected, failed."""

    PENDING = "pending"  # not arrived yet
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"
    FAILED = "failed"


class SimRequest:
    """Mutable progress of one request; the engine's own record, never shown to a policy.

    KV it holds: ``own_blocks`` only it uses (in HBM, or in CPU memory when ``location`` is CPU),
    plus the prefix-cache ``nodes`` it has locked (``shared_blocks`` in all). Policies see
    :meth:`view`, a frozen :class:`RequestView` cached until the request changes (waiting requests
    rarely change, so long queues cost little per scheduling point).
    """

    __slots__ = (
        "spec", "computed_tokens", "generated_tokens", "first_token_s", "last_token_s",
        "finish_s", "num_preemptions", "tier", "own_blocks", "shared_blocks", "reserve_blocks",
        "nodes", "location", "ready_s", "cached_tokens", "status", "reason", "replica",
        "max_itl_s", "hit_tokens", "hit_blocks", "hit_version", "precision", "_view",
        "token_gaps",
    )  # fmt: skip

    def __init__(self, spec: RequestSpec) -> None:
        self.spec = spec
        self.computed_tokens = 0
        self.generated_tokens = 0
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.finish_s: float | None = None
        self.num_preemptions = 0
        self.tier = 0
        self.own_blocks = 0
        self.shared_blocks = 0
        self.reserve_blocks = 0  # own blocks held back to completion (GUARANTEED_NO_EVICT)
        self.nodes: list[Node] = []
        self.location = KVLocation.UNALLOCATED
        self.ready_s = 0.0  # its KV is in HBM from this instant (after a copy from CPU)
        self.cached_tokens = 0
        self.status = RequestStatus.PENDING
        self.reason = ""
        self.replica = -1
        self.max_itl_s = 0.0
        self.hit_tokens = 0  # while waiting: prompt tokens the prefix cache holds now
        self.hit_blocks = 0
        self.hit_version = -1
        self.precision = KVPrecision.FP16
        self._view: RequestView | None = None
        #: With ``SimConfig.record_token_gaps``: one ``(first_gap_s, k, rest_s)`` per run that
        #: emitted tokens after the first: the gap from the previous token to the run's first
        #: step's end, the tokens the run emitted ``k``, and the time of the run's other steps.
        self.token_gaps: list[tuple[float, int, float]] | None = None

    @property
    def request_id(self) -> str:
        return self.spec.request_id

    @property
    def kv_blocks(self) -> int:
        """Blocks in its block table: its own plus the shared prefix blocks."""
        return self.own_blocks + self.shared_blocks

    @property
    def pending_tokens(self) -> int:
        """Tokens to run before the next output token."""
        return self.spec.prompt_tokens + self.generated_tokens - self.computed_tokens

    def touch(self) -> None:
        """Drop the cached view; call after every change."""
        self._view = None

    def view(self) -> RequestView:
        """The policy-facing view (cached until :meth:`touch`).

        A waiting request is shown as it would be admitted now: its prefix-cache hit counts as
        computed and as shared blocks (vLLM v1 counts cached tokens as computed the same way).
        """
        if self._view is None:
            s = self.spec
            waiting = self.status is RequestStatus.WAITING
            self._view = RequestView(
                request_id=s.request_id,
                arrival_s=s.arrival_s,
                prompt_tokens=s.prompt_tokens,
                max_output_tokens=s.max_output_tokens,
                slo=s.slo,
                computed_tokens=self.hit_tokens if waiting else self.computed_tokens,
                cached_tokens=self.hit_tokens if waiting else self.cached_tokens,
                prefix_hit_tokens=self.hit_tokens if waiting else self.cached_tokens,
                generated_tokens=self.generated_tokens,
                first_token_s=self.first_token_s,
                num_preemptions=self.num_preemptions,
                tier=self.tier,
                kv_precision=self.precision,
                kv_location=KVLocation.HBM if waiting and self.hit_blocks else self.location,
                kv_blocks=self.hit_blocks if waiting else self.kv_blocks,
                shared_kv_blocks=self.hit_blocks if waiting else self.shared_blocks,
                replica=max(self.replica, 0),
            )
        return self._view
