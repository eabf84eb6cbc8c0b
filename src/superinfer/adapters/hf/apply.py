"""Decisions -> engine: carry out a checked :class:`ScheduleDecision` on the engine's scheduler.

Order as the decision type specifies: reject, preempt, admit, then the tokens to run. Preemption
is by recompute, done the way the engine's own ``OffloadingManager`` does a "soft reset"
(``transformers/generation/continuous_batching/offloading_manager.py``, transformers 5.24): the
request's blocks are freed and an equivalent request (prompt + tokens generated so far, same id)
goes back to the waiting queue, at its head as vLLM puts preempted requests. Swap (CPU offload)
is not offered: the engine's swap pool is pinned host memory, which needs an accelerator, and on
a CPU device there is no second tier to swap to.

The step's batch is formed with the engine's own ``Scheduler._schedule_request``, so a request's
status, ``tokens_to_process`` and ``remaining_prefill_tokens`` change exactly as under the
engine's FIFO scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers.generation.continuous_batching.requests import (
    FutureRequestState,
    RequestState,
    RequestStatus,
)
from transformers.generation.continuous_batching.scheduler import Scheduler

from superinfer.adapters.hf.view import TrackedRequest, generated_tokens, pending_engine_tokens
from superinfer.policy_core.types import ScheduleDecision

__all__ = ["AppliedStep", "Piece", "apply_decision"]


@dataclass(frozen=True, slots=True)
class Piece:
    """One request's part of a step.

    Attributes:
        request_id: the request.
        computed_tokens: tokens with KV before the step.
        num_tokens: tokens the step runs for it.
        samples: whether the step ends with a sampled output token for it.
        decode: whether the piece is a decode (one token of a request that has output already).
    """

    request_id: str
    computed_tokens: int
    num_tokens: int
    samples: bool
    decode: bool


@dataclass(frozen=True, slots=True)
class AppliedStep:
    """What :func:`apply_decision` did.

    Attributes:
        batch: the engine's batch for this step (empty when the decision runs nothing).
        pieces: per scheduled request, what it runs.
        rejected: request id -> reason, for requests the decision rejected.
        preempted: ids preempted (by recompute).
        num_q_tokens: query tokens of the step.
        max_kv_read: KV tokens the step reads (sum of the requests' past lengths), as the engine's
            own schedulers report it.
    """

    batch: list[FutureRequestState]
    pieces: tuple[Piece, ...]
    rejected: dict[str, str]
    preempted: tuple[str, ...]
    num_q_tokens: int
    max_kv_read: int


def _take_waiting(scheduler: Scheduler, request_id: str) -> RequestState:
    state = scheduler.waiting_requests.pop(request_id)
    scheduler.waiting_requests_order.remove(request_id)
    return state


def apply_decision(
    scheduler: Scheduler, decision: ScheduleDecision, tracked: dict[str, TrackedRequest]
) -> AppliedStep:
    """Apply ``decision`` (already passed ``check_decision``) to ``scheduler``'s queues and cache.

    Args:
        scheduler: the engine scheduler whose ``waiting_requests`` / ``active_requests`` and
            ``cache`` are changed in place.
        decision: the checked decision.
        tracked: the adapter's records; preemptions and tiers are recorded there.

    Returns:
        The step's batch and what happened.

    Raises:
        RuntimeError: the engine disagrees with the view the decision was made on (a pending-token
            count differs, or the cache refuses blocks the view showed as free): an adapter bug.
    """
    rejected: dict[str, str] = {}
    for rid, reason in decision.reject.items():
        _take_waiting(scheduler, rid)
        rejected[rid] = reason

    for rid in decision.preempt:  # check_decision allows only RECOMPUTE on this engine
        state = scheduler.active_requests.pop(rid)
        scheduler.cache.free_blocks(rid, no_cache=True)
        scheduler.waiting_requests[rid] = state.create_equivalent_initial_request()
        scheduler.waiting_requests_order.appendleft(rid)
        tracked[rid].num_preemptions += 1

    for rid in decision.admit:
        scheduler.active_requests[rid] = _take_waiting(scheduler, rid)

    for rid, tier in decision.tiers.items():
        tracked[rid].tier = tier

    batch: list[FutureRequestState] = []
    pieces: list[Piece] = []
    num_q_tokens = max_kv_read = 0
    for rid, n in decision.num_tokens.items():
        state = scheduler.active_requests[rid]
        rec = tracked[rid]
        past = state.position_offset
        pending = rec.prompt_tokens + generated_tokens(state, rec.prompt_tokens) - past
        if pending_engine_tokens(state) != pending:
            raise RuntimeError(
                f"hf adapter out of sync on {rid!r}: engine has {pending_engine_tokens(state)} "
                f"tokens to run, the view {pending}"
            )
        if not scheduler.cache.can_store_request_tokens(state, n):
            raise RuntimeError(f"hf adapter: the cache refused {n} tokens for {rid!r}")
        decoding = state.status == RequestStatus.DECODING
        tokens = state.tokens_to_process if decoding else state.remaining_prefill_tokens
        scheduler._schedule_request(state, tokens, n, set())
        samples = not state.remaining_prefill_tokens
        batch.append(FutureRequestState(state, samples, {}, n))
        decode = n == 1 and generated_tokens(state, rec.prompt_tokens) > 0
        pieces.append(Piece(rid, past, n, samples, decode))
        num_q_tokens += n
        max_kv_read += past
    return AppliedStep(
        batch, tuple(pieces), rejected, tuple(decision.preempt), num_q_tokens, max_kv_read
    )
