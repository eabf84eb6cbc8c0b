"""TensorRT-LLM objects to policy views: ``LlmRequest`` to ``RequestView``, executor queues to
``StepState``, iteration stats to ``StepStats``.

Block accounting follows the C++ KV cache manager of 1.2 (``kvCacheManager.cpp``):

- a started request has blocks for its whole (current) prompt from its first context chunk on
  (``addSequence`` allocates ``ceil(prompt_len / tokens_per_block)``), and in generation one block
  per ``tokens_per_block`` tokens of KV (the last sampled token has none yet);
- GUARANTEED_NO_EVICT reserves every started request's blocks *to completion*,
  ``ceil((prompt_len + max_new_tokens) / tokens_per_block)`` (``getRemainingBlocksToCompletion``
  plus what is allocated). Under that policy a running view holds its reservation and the free
  blocks are what the capacity scheduler itself sees for new requests: free blocks minus the
  reservations not yet allocated. Under MAX_UTILIZATION it holds what is allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from superinfer.adapters.trtllm.engine import RequestStates, UnsupportedEngineError
from superinfer.policy_core.batching import blocks_for_tokens
from superinfer.policy_core.types import SLO, KVLocation, KVPrecision, RequestView, StepStats

__all__ = [
    "allocated_blocks",
    "front_end_view",
    "iteration_step_stats",
    "llm_request_view",
    "reserved_blocks",
]


def reserved_blocks(req: Any, tokens_per_block: int) -> int:
    """Blocks ``req`` holds once run to completion: prompt plus every allowed new token."""
    return blocks_for_tokens(req.prompt_len + req.max_new_tokens, tokens_per_block)


def allocated_blocks(req: Any, states: RequestStates, tokens_per_block: int) -> int:
    """Blocks a started request has allocated now (0 for one not started)."""
    if not states.is_started(req):
        return 0
    if req.state == states.context_init:
        return blocks_for_tokens(req.prompt_len, tokens_per_block)
    return blocks_for_tokens(req.get_num_tokens(0) - 1, tokens_per_block)


def llm_request_view(
    req: Any,
    *,
    request_id: str,
    states: RequestStates,
    slo: SLO,
    arrival_s: float,
    tokens_per_block: int,
    reserve_to_completion: bool,
    tier: int = 0,
    first_token_s: float | None = None,
    num_preemptions: int = 0,
) -> RequestView:
    """The policy's view of one active ``LlmRequest``.

    ``prompt_tokens`` is the original prompt (``orig_prompt_len``); after a pause the engine folds
    the generated tokens into ``prompt_len``, which the view expresses as ``computed_tokens = 0``
    with ``generated_tokens > 0`` (a recompute preemption, ``RequestView`` docs).

    Args:
        req: the ``LlmRequest``.
        request_id: the id the policy sees.
        states: request states of the installed engine.
        slo: its SLO class.
        arrival_s: its arrival instant on the scheduler's clock, in s.
        tokens_per_block: KV block size.
        reserve_to_completion: GUARANTEED_NO_EVICT accounting (see the module docstring).
        tier, first_token_s, num_preemptions: what the adapter tracked for it.
    """
    num_tokens = req.get_num_tokens(0)
    if states.is_waiting(req):
        computed, blocks = 0, 0
    else:
        computed = (
            req.context_current_position if req.state == states.context_init else num_tokens - 1
        )
        blocks = (
            reserved_blocks(req, tokens_per_block)
            if reserve_to_completion
            else allocated_blocks(req, states, tokens_per_block)
        )
    return RequestView(
        request_id=request_id,
        arrival_s=arrival_s,
        prompt_tokens=req.orig_prompt_len,
        max_output_tokens=req.py_max_new_tokens,
        slo=slo,
        computed_tokens=computed,
        generated_tokens=num_tokens - req.orig_prompt_len,
        first_token_s=first_token_s,
        num_preemptions=num_preemptions,
        tier=tier,
        kv_location=KVLocation.HBM if blocks else KVLocation.UNALLOCATED,
        kv_blocks=blocks,
    )


def front_end_view(
    *,
    request_id: str,
    arrival_s: float,
    prompt_tokens: int,
    max_output_tokens: int,
    slo: SLO,
    in_flight: bool,
    generated_tokens: int,
    tokens_per_block: int,
    reserve_to_completion: bool,
    prefix_hit_tokens: int = 0,
    first_token_s: float | None = None,
    tier: int = 0,
    kv_precision: KVPrecision = KVPrecision.FP16,
) -> RequestView:
    """The view of a request the front-end gate holds or has submitted.

    The gate sees streamed outputs only: a submitted request counts as prefilling (nothing
    computed) until its first token, then as decoding (everything but the last token computed).
    Its blocks follow the engine's accounting (module docstring): the reservation to completion,
    or the prompt's blocks and then one per ``tokens_per_block`` tokens of KV.

    Args:
        request_id, arrival_s, prompt_tokens, max_output_tokens, slo: the request.
        in_flight: submitted to the engine (else held by the gate).
        generated_tokens: output tokens streamed back so far.
        tokens_per_block: KV block size.
        reserve_to_completion: GUARANTEED_NO_EVICT accounting.
        prefix_hit_tokens: prompt tokens the engine's block-reuse cache holds (from KV events).
        first_token_s, tier: what the gate tracked.
        kv_precision: the KV precision of the engine the gate feeds.
    """
    computed = prompt_tokens + generated_tokens - 1 if in_flight and generated_tokens else 0
    blocks = 0
    if in_flight:
        blocks = blocks_for_tokens(
            prompt_tokens + max_output_tokens
            if reserve_to_completion
            else max(prompt_tokens, computed),
            tokens_per_block,
        )
    return RequestView(
        request_id=request_id,
        arrival_s=arrival_s,
        prompt_tokens=prompt_tokens,
        max_output_tokens=max_output_tokens,
        slo=slo,
        computed_tokens=computed,
        prefix_hit_tokens=prefix_hit_tokens,
        generated_tokens=generated_tokens,
        first_token_s=first_token_s,
        tier=tier,
        kv_precision=kv_precision,
        kv_location=KVLocation.HBM if blocks else KVLocation.UNALLOCATED,
        kv_blocks=blocks,
    )


def _field(stats: Mapping[str, Any], *path: str) -> Any:
    node: Any = stats
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            raise UnsupportedEngineError(
                f"iteration stats lack {'.'.join(path)!r} (TensorRT-LLM 1.2 layout expected)"
            )
        node = node[key]
    return node


def iteration_step_stats(stats: Mapping[str, Any], *, now_s: float, num_held: int) -> StepStats:
    """One entry of ``LLM.get_stats()`` as ``StepStats``.

    Key names are those of the C++ ``IterationStats`` JSON (engine notes §2.3, ``[verify]`` there):
    ``iter``, ``iterLatencyMS``, ``numQueuedRequests``,
    ``inflightBatchingStats.{numScheduledRequests, numCtxTokens, numGenRequests}``,
    ``kvCacheStats.{usedNumBlocks, maxNumBlocks}``. Decode tokens
    count one per generation request (no speculative decoding).

    Args:
        stats: one iteration's stats.
        now_s: the instant they were read, in s (the engine reports no clock of ours).
        num_held: requests the front-end gate still holds (waiting outside the engine).

    Raises:
        UnsupportedEngineError: a key is missing, naming it.
    """
    return StepStats(
        now_s=now_s,
        step_index=int(_field(stats, "iter")),
        duration_s=float(_field(stats, "iterLatencyMS")) / 1e3,
        num_steps=1,
        num_prefill_tokens=int(_field(stats, "inflightBatchingStats", "numCtxTokens")),
        num_decode_tokens=int(_field(stats, "inflightBatchingStats", "numGenRequests")),
        num_running=int(_field(stats, "inflightBatchingStats", "numScheduledRequests")),
        num_waiting=int(_field(stats, "numQueuedRequests")) + num_held,
        used_hbm_blocks=int(_field(stats, "kvCacheStats", "usedNumBlocks")),
        total_hbm_blocks=int(_field(stats, "kvCacheStats", "maxNumBlocks")),
    )
