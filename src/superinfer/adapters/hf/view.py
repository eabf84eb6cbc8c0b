"""Engine -> views: transformers continuous-batching requests and paged cache as policy views.

The engine (``transformers/generation/continuous_batching``, transformers 5.24) keeps per request a
``RequestState``: its prompt (``initial_tokens``), the tokens generated so far
(``generated_tokens``), the tokens whose KV is written (``position_offset``) and the prompt tokens
still to prefill (``remaining_prefill_tokens``). Its paged cache hands out blocks of
``page_size`` tokens (one page per layer) from a pool; a request holds the blocks listed in the
full-attention allocator's ``block_table``.

Our views use vLLM v1's accounting (:class:`RequestView`). The two agree as follows:

* ``computed_tokens = position_offset``;
* ``generated_tokens = len(initial_tokens) + len(generated_tokens) - prompt_tokens``: a recompute
  preemption (the engine's "soft reset", ``RequestState.create_equivalent_initial_request``) folds
  the tokens generated so far into a new prompt, so they are counted back out here;
* ``pending_tokens`` then equals ``len(remaining_prefill_tokens)`` for a waiting or prefilling
  request and 1 for a decoding one, which :func:`pending_engine_tokens` checks.

The device holding the KV pool is reported as ``KVLocation.HBM`` ("the engine's device pool"),
even when that device is the CPU: there is no second tier here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.generation.continuous_batching.cache_allocators import (
    FULL_ATTENTION,
    CacheAllocator,
)
from transformers.generation.continuous_batching.requests import RequestState, RequestStatus

from superinfer.policy_core.types import SLO, KVLocation, KVPrecision, RequestView, StepState

__all__ = [
    "TrackedRequest",
    "free_blocks",
    "full_attention_allocator",
    "generated_tokens",
    "kv_blocks",
    "pending_engine_tokens",
    "request_view",
    "step_state",
    "total_blocks",
]


@dataclass(slots=True)
class TrackedRequest:
    """What the adapter knows about a request that the engine does not.

    Attributes:
        request_id: the engine's request id.
        arrival_s: arrival instant on the session clock, s.
        prompt_tokens: length of the original prompt, tokens.
        max_output_tokens: the request's declared output cap (``max_tokens``).
        slo: its SLO class.
        tier: last tier the policy assigned (``ScheduleDecision.tiers``).
        num_preemptions: times the policy preempted it.
        first_token_s: end of the step that produced its first token (session clock), or ``None``.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    max_output_tokens: int
    slo: SLO
    tier: int = 0
    num_preemptions: int = 0
    first_token_s: float | None = None


def full_attention_allocator(cache: PagedAttentionCache) -> CacheAllocator:
    """The cache's only allocator, for full-attention layers.

    Raises:
        ValueError: the model has sliding-window (or other) layers; their per-type block pools
            have no single block count to show a policy.
    """
    if list(cache.cache_allocators) != [FULL_ATTENTION]:
        kinds = ", ".join(cache.cache_allocators)
        raise ValueError(f"the hf adapter needs a full-attention-only model; this one has {kinds}")
    return cache.cache_allocators[FULL_ATTENTION]


def kv_blocks(allocator: CacheAllocator, request_id: str) -> int:
    """KV blocks ``request_id`` holds in the device pool."""
    return len(allocator.block_table.get(request_id, ()))


def free_blocks(cache: PagedAttentionCache, allocator: CacheAllocator) -> int:
    """Blocks the allocator can still hand out: its free blocks plus every free sector's blocks."""
    return cache.pool.num_free_sectors * allocator.blocks_per_sector + cache.pool.count_free_blocks(
        allocator.index
    )


def total_blocks(cache: PagedAttentionCache, allocator: CacheAllocator) -> int:
    """Blocks of the device pool (the two trash sectors the engine reserves are not counted)."""
    return cache.num_sectors * allocator.blocks_per_sector


def generated_tokens(state: RequestState, prompt_tokens: int) -> int:
    """Output tokens produced so far, across recompute preemptions."""
    return len(state.initial_tokens) + len(state.generated_tokens) - prompt_tokens


def pending_engine_tokens(state: RequestState) -> int:
    """Tokens the engine would run for this request before its next output token."""
    if state.status == RequestStatus.DECODING:
        return len(state.tokens_to_process)
    return len(state.remaining_prefill_tokens)


def request_view(state: RequestState, tracked: TrackedRequest, blocks: int) -> RequestView:
    """The policy's view of one engine request.

    Args:
        state: the engine's request state.
        tracked: the adapter's record of it.
        blocks: KV blocks it holds (:func:`kv_blocks`).
    """
    return RequestView(
        request_id=tracked.request_id,
        arrival_s=tracked.arrival_s,
        prompt_tokens=tracked.prompt_tokens,
        max_output_tokens=tracked.max_output_tokens,
        slo=tracked.slo,
        computed_tokens=state.position_offset,
        cached_tokens=0,
        generated_tokens=generated_tokens(state, tracked.prompt_tokens),
        first_token_s=tracked.first_token_s,
        num_preemptions=tracked.num_preemptions,
        tier=tracked.tier,
        kv_precision=KVPrecision.FP16,
        kv_location=KVLocation.HBM if blocks else KVLocation.UNALLOCATED,
        kv_blocks=blocks,
    )


def step_state(
    *,
    now_s: float,
    step_index: int,
    waiting: Iterable[RequestState],
    running: Iterable[RequestState],
    tracked: dict[str, TrackedRequest],
    cache: PagedAttentionCache,
    token_budget: int,
    max_num_seqs: int,
) -> StepState:
    """The policy's view of the engine at one scheduling point.

    Args:
        now_s: current instant on the session clock, s.
        step_index: steps run so far.
        waiting: the scheduler's waiting requests, in queue order.
        running: its active requests, in admission order.
        tracked: the adapter's records, by request id.
        cache: the engine's paged cache.
        token_budget: most tokens one step may run (the engine's ``max_batch_tokens``).
        max_num_seqs: most requests one step may run (``max_requests_per_batch``).
    """
    alloc = full_attention_allocator(cache)

    def views(states: Iterable[RequestState]) -> tuple[RequestView, ...]:
        return tuple(
            request_view(s, tracked[s.request_id], kv_blocks(alloc, s.request_id)) for s in states
        )

    return StepState(
        now_s=now_s,
        step_index=step_index,
        waiting=views(waiting),
        running=views(running),
        swapped=(),
        free_hbm_blocks=free_blocks(cache, alloc),
        total_hbm_blocks=total_blocks(cache, alloc),
        free_cpu_blocks=0,
        total_cpu_blocks=0,
        block_size_tokens=alloc.tokens_per_page,
        token_budget=token_budget,
        max_num_seqs=max_num_seqs,
        kv_block_bytes=alloc.bytes_per_block,
    )
