"""Pure-Python references of the C++ capacity and micro-batch schedulers (1.2.x).

Behaviour follows ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp`` and
``microBatchScheduler.cpp`` as described in the engine notes §1.2:

- GUARANTEED_NO_EVICT: generation requests (in list order) reserve their blocks to completion;
  context requests (new or mid-chunk) are then admitted in list order while their remaining blocks
  to completion fit in the free blocks left; the first that does not fit stops admission
  (head-of-line). Never pauses.
- MAX_UTILIZATION: each request in list order takes the blocks it needs for the next step; when one
  does not fit, the last *started* request not yet scheduled (searching from the back of the list)
  is paused and its blocks credited, and the same request is tried again (LIFO pause).
- STATIC_BATCH: GUARANTEED_NO_EVICT that admits only when nothing is in progress.

Omitted (fidelity risks, notes §5.2): "beneficial to skip" for block reuse, LoRA/PEFT pages,
cross-attention caches.
"""

from __future__ import annotations

from typing import Any

from tensorrt_llm.bindings import LlmRequestState

__all__ = ["CapacityScheduler", "MicroBatchScheduler"]


def _in_range(req: Any, until: LlmRequestState, after: LlmRequestState) -> bool:
    return until.value <= req.state.value < after.value


def _is_generation(req: Any) -> bool:
    return req.state in (
        LlmRequestState.GENERATION_IN_PROGRESS,
        LlmRequestState.GENERATION_TO_COMPLETE,
    )


def _is_started(req: Any) -> bool:
    return _is_generation(req) or (
        req.state == LlmRequestState.CONTEXT_INIT and not req.is_first_context_chunk
    )


class CapacityScheduler:
    """``tb_internal.algorithms.CapacityScheduler``: who fits in the KV cache this step."""

    def __init__(
        self,
        max_num_requests: int,
        capacity_scheduler_policy: Any,
        has_kv_cache_manager: bool,
        two_step_lookahead: bool = False,
        no_schedule_until_state: LlmRequestState = LlmRequestState.CONTEXT_INIT,
        no_schedule_after_state: LlmRequestState = LlmRequestState.GENERATION_COMPLETE,
    ) -> None:
        self.max_num_requests = max_num_requests
        self.policy = str(capacity_scheduler_policy)
        self.has_kv_cache_manager = has_kv_cache_manager
        self.two_step_lookahead = two_step_lookahead
        self.until = no_schedule_until_state
        self.after = no_schedule_after_state

    def __call__(
        self, active_requests: list[Any], kv_cache_manager: Any, peft_cache_manager: Any = None
    ) -> tuple[list[Any], list[Any], list[Any]]:
        if not self.has_kv_cache_manager:
            fitting = [r for r in active_requests if _in_range(r, self.until, self.after)]
            return fitting[: self.max_num_requests], [], []
        if self.policy == "MAX_UTILIZATION":
            scheduled, paused = self._max_utilization(active_requests, kv_cache_manager)
        elif self.policy in ("GUARANTEED_NO_EVICT", "STATIC_BATCH"):
            scheduled = self._no_evict(active_requests, kv_cache_manager, self.policy)
            paused = []
        else:
            raise RuntimeError(f"Unsupported capacity scheduler policy {self.policy}")
        fitting = [r for r in scheduled if r.state != LlmRequestState.DISAGG_GENERATION_INIT]
        disagg = [r for r in scheduled if r.state == LlmRequestState.DISAGG_GENERATION_INIT]
        return fitting, disagg, paused

    def _no_evict(self, active: list[Any], kv: Any, policy: str) -> list[Any]:
        scheduled: list[Any] = []
        pending: list[Any] = []
        pending_disagg: list[Any] = []
        available = kv.get_num_free_blocks()
        for req in active:
            is_disagg = req.state == LlmRequestState.DISAGG_GENERATION_INIT
            if not is_disagg and not _in_range(req, self.until, self.after):
                continue
            if len(scheduled) >= self.max_num_requests:
                break
            if _is_generation(req):
                scheduled.append(req)
                available -= kv.get_remaining_blocks_to_completion(req)
            elif is_disagg:
                pending_disagg.append(req)
            else:
                pending.append(req)
        if policy == "STATIC_BATCH" and scheduled:
            return scheduled
        for req in pending_disagg + pending:
            if len(scheduled) >= self.max_num_requests:
                break
            needed = kv.get_remaining_blocks_to_completion(req)
            if needed > available:
                break
            scheduled.append(req)
            available -= needed
        return scheduled

    def _max_utilization(self, active: list[Any], kv: Any) -> tuple[list[Any], list[Any]]:
        kv.start_scheduling()
        scheduled: list[Any] = []
        paused: list[Any] = []
        scheduled_blocks = 0
        end = len(active)
        i = 0
        while i < end:
            req = active[i]
            is_disagg = req.state == LlmRequestState.DISAGG_GENERATION_INIT
            if not is_disagg and not _in_range(req, self.until, self.after):
                i += 1
                continue
            needed = kv.get_needed_blocks_one_step(req, self.two_step_lookahead)
            fits = scheduled_blocks + needed <= kv.get_scheduling_num_free_blocks()
            if len(scheduled) < self.max_num_requests and fits:
                scheduled.append(req)
                scheduled_blocks += needed
                i += 1
                continue
            last_started = next(
                (
                    j
                    for j in range(end - 1, i - 1, -1)
                    if _is_started(active[j]) and _in_range(active[j], self.until, self.after)
                ),
                None,
            )
            if last_started is None:
                break
            kv.scheduling_remove_sequence(active[last_started].py_request_id)
            paused.append(active[last_started])
            end = last_started
        return scheduled, paused


class MicroBatchScheduler:
    """``tb_internal.algorithms.MicroBatchScheduler``: who runs this step within the token budget.

    Generation requests take ``beam_width + draft`` tokens, context requests their remaining
    context (or a chunk of it with chunking); the first request that exceeds the token budget
    stops the pass, as does reaching ``max_batch_size`` requests.
    """

    def __init__(
        self, ctx_chunk_config: tuple[Any, int] | None = None, max_context_length: int | None = None
    ) -> None:
        self.ctx_chunk_config = ctx_chunk_config
        self.max_context_length = max_context_length
        self.until = LlmRequestState.CONTEXT_INIT
        self.after = LlmRequestState.GENERATION_TO_COMPLETE

    def __call__(
        self,
        active_requests: list[Any],
        inflight_request_ids: Any,
        max_batch_size_runtime: int,
        max_num_tokens_runtime: int | None,
    ) -> tuple[list[Any], list[Any]]:
        ctx: list[Any] = []
        gen: list[Any] = []
        to_chunk: list[Any] = []
        batch_tokens = 0
        chunked_tokens = 0
        count = 0
        for req in active_requests:
            if req.request_id in inflight_request_ids or not _in_range(req, self.until, self.after):
                continue
            if req.state == LlmRequestState.CONTEXT_INIT:
                remaining = req.get_context_remaining_length()
                if self.ctx_chunk_config is None:
                    n = remaining + (req.num_draft_tokens if req.has_draft_tokens else 0)
                    if (
                        max_num_tokens_runtime is not None
                        and batch_tokens + n > max_num_tokens_runtime
                    ):
                        break
                    req.context_chunk_size = remaining
                    ctx.append(req)
                    batch_tokens += n
                else:
                    req.context_chunk_size = remaining
                    to_chunk.append(req)
                    chunked_tokens += remaining
            elif req.state == LlmRequestState.GENERATION_IN_PROGRESS:
                n = req.sampling_config.beam_width + req.num_draft_tokens
                if max_num_tokens_runtime is not None and batch_tokens + n > max_num_tokens_runtime:
                    break
                gen.append(req)
                batch_tokens += n
            else:
                continue
            count += 1
            if count >= max_batch_size_runtime:
                break
        if to_chunk:
            capacity = (
                None if max_num_tokens_runtime is None else max_num_tokens_runtime - batch_tokens
            )
            if capacity is not None and chunked_tokens > capacity:
                self._chunk(to_chunk, capacity)
            for req in to_chunk:
                if req.context_chunk_size > 0:
                    ctx.append(req)
        return ctx, gen

    def _chunk(self, requests: list[Any], capacity: int) -> None:
        policy, unit = self.ctx_chunk_config  # type: ignore[misc]
        for req in requests:
            req.context_chunk_size = 0
        if str(policy) == "EQUAL_PROGRESS":
            used, progress = 0, True
            while used < capacity and progress:
                progress = False
                for req in requests:
                    remaining = req.get_context_remaining_length()
                    size = min(req.context_chunk_size + unit, remaining)
                    step = size - req.context_chunk_size
                    if step > 0 and used + step <= capacity:
                        req.context_chunk_size = size
                        used += step
                        progress = True
        else:  # FIRST_COME_FIRST_SERVED
            left = capacity
            for req in requests:
                remaining = req.get_context_remaining_length()
                size = min(remaining, left)
                if size < remaining:
                    size = size // unit * unit
                req.context_chunk_size = size
                left -= size
                if left <= 0:
                    break
