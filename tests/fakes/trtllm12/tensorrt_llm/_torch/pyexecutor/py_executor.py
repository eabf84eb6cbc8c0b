"""Double of ``tensorrt_llm._torch.pyexecutor.py_executor.PyExecutor`` (1.2.x, §1.4).

One iteration of the non-overlap executor loop: activate waiting requests FIFO up to
``max_num_sequences``; ``scheduler.schedule_request(active_requests, inflight_req_ids)``; pause the
paused requests (``req.pause`` then ``free_resources``: recompute); ``prepare_resources``; a fake
forward pass and sampler; ``update_resources``; flush KV events; responses, and finished requests
freed and dropped from ``active_requests``. The real loop runs in a thread (or a worker process);
the double runs one iteration per ``_fake_step()`` call so tests are deterministic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from tensorrt_llm.bindings.executor import FinishReason

from .llm_request import LlmRequest, LlmRequestState, executor_request_to_llm_request
from .resource_manager import ResourceManagerType
from .scheduler import ScheduledRequests

__all__ = ["PyExecutor"]

VOCAB_SIZE = 32000


def fake_token(request_id: int, index: int) -> int:
    """The double's "model": a deterministic token for position ``index`` of a request."""
    return (request_id * 1_000_003 + index * 7919) % VOCAB_SIZE


class PyExecutor:
    def __init__(
        self,
        resource_manager: Any,
        scheduler: Any,
        model_engine: Any,
        sampler: Any,
        dist: Any,
        max_num_sequences: int,
        drafter: Any = None,
        disable_overlap_scheduler: bool = False,
        max_input_len: int = 0x7FFFFFFF,
        max_batch_size: int = 8,
        max_beam_width: int = 1,
        max_draft_len: int = 0,
        max_total_draft_tokens: int = 0,
        kv_cache_transceiver: Any = None,
        guided_decoder: Any = None,
        garbage_collection_gen0_threshold: Any = None,
        start_worker: bool = True,
        kv_connector_manager: Any = None,
        max_seq_len: int | None = None,
        peft_cache_config: Any = None,
        virtual_memory_pools: Any = None,
        hang_detection_timeout: Any = None,
        execution_stream: Any = None,
    ) -> None:
        self.resource_manager = resource_manager
        self.scheduler = scheduler
        self.model_engine = model_engine
        self.sampler = sampler
        self.dist = dist
        self.max_num_active_requests = max_num_sequences
        self.max_input_len = max_input_len
        self.max_batch_size = max_batch_size
        self.active_requests: list[LlmRequest] = []
        self.inflight_req_ids: set[int] = set()
        self.waiting_queue: deque[tuple[int, Any]] = deque()
        self.canceled_req_ids: set[int] = set()
        self.iter_counter = 0
        self.is_shutdown = False
        self.worker_started = False
        self.next_req_id = 1
        # test-only
        self._fake_response_sink: Callable[[LlmRequest, bool], None] | None = None
        self._fake_stats: list[dict[str, Any]] = []
        self._fake_log: list[tuple[int, list[int], list[int], list[int]]] = []
        self._fake_step_time_ms = 10.0
        self._fake_advance_clock: Callable[[float], None] | None = None
        if start_worker:
            self.start_worker()

    def start_worker(self) -> None:
        self.worker_started = True

    def shutdown(self) -> None:
        self.is_shutdown = True

    def enqueue_request(self, request: Any, query: Any = None) -> int:
        req_id = self.next_req_id
        self.next_req_id += 1
        self.waiting_queue.append((req_id, request))
        return req_id

    def cancel_request(self, req_id: int) -> None:
        self.canceled_req_ids.add(req_id)

    @property
    def _kv_cache_manager(self) -> Any:
        return self.resource_manager.get_resource_manager(ResourceManagerType.KV_CACHE_MANAGER)

    def _fetch_new_requests(self) -> None:
        while self.waiting_queue and len(self.active_requests) < self.max_num_active_requests:
            req_id, request = self.waiting_queue.popleft()
            req = executor_request_to_llm_request(req_id, request)
            req._fake_output_len = request._fake_output_len
            self.active_requests.append(req)

    def _schedule(self) -> tuple[ScheduledRequests, list[LlmRequest], int]:
        out = self.scheduler.schedule_request(self.active_requests, self.inflight_req_ids)
        scheduled = ScheduledRequests()
        scheduled.context_requests = out.context_requests
        scheduled.generation_requests = out.generation_requests
        scheduled.paused_requests = out.paused_requests
        return scheduled, out.fitting_disagg_gen_init_requests, out.num_fitting_requests

    def _pause_requests(self, requests_to_pause: list[LlmRequest]) -> None:
        for req in requests_to_pause:
            req.pause(self.max_input_len)
            self._terminate_request(req)

    def _terminate_request(self, request: LlmRequest) -> None:
        self.resource_manager.free_resources(request)

    def _handle_canceled_requests(self) -> None:
        for req in self.active_requests:
            if (
                req.py_client_id in self.canceled_req_ids
                or req.py_request_id in self.canceled_req_ids
            ):
                req.finish_by(FinishReason.CANCELLED, 0)
        self.canceled_req_ids.clear()

    def _forward_and_sample(self, batch: ScheduledRequests) -> None:
        for req in batch.context_requests:
            if req._fake_first_scheduled_iter is None:
                req._fake_first_scheduled_iter = self.iter_counter
            req.move_to_next_context_chunk()
            if req.context_current_position >= req.prompt_len:
                req.state = LlmRequestState.GENERATION_IN_PROGRESS
                self._sample(req)
        for req in batch.generation_requests:
            self._sample(req)

    def _sample(self, req: LlmRequest) -> None:
        req.add_new_token(fake_token(req.py_request_id, req.get_num_tokens(0)))
        if req._fake_first_token_iter is None:
            req._fake_first_token_iter = self.iter_counter
        generated = req.get_num_tokens(0) - req.orig_prompt_len
        if generated >= req.py_max_new_tokens:
            req.finish_by(FinishReason.LENGTH, 0)
        elif generated >= req._fake_output_len:
            req.finish_by(FinishReason.END_ID, 0)

    def _add_kv_cache_events(self) -> None:
        kv = self._kv_cache_manager
        if kv is not None:
            kv.flush_iteration_events()

    def _handle_responses(self) -> int:
        still_active = []
        finished = 0
        for req in self.active_requests:
            if req.is_dummy:
                continue
            sent = req.get_num_tokens(0) - req.orig_prompt_len
            done = req.state == LlmRequestState.GENERATION_COMPLETE
            if self._fake_response_sink is not None and (done or sent > req._fake_sent_tokens):
                self._fake_response_sink(req, done)
            req._fake_sent_tokens = sent
            if done:
                self._terminate_request(req)
                finished += 1
            else:
                still_active.append(req)
        self.active_requests = still_active
        return finished

    def _fake_step(self) -> None:
        """One iteration of ``_executor_loop`` (test-only entry point)."""
        self._fetch_new_requests()
        self._handle_canceled_requests()
        batch, _, _ = self._schedule()
        if batch.paused_requests:
            self._pause_requests(batch.paused_requests)
        self.resource_manager.prepare_resources(batch)
        ctx_tokens = sum(r.context_chunk_size for r in batch.context_requests)
        if self._fake_advance_clock is not None:  # the forward pass takes one step time
            self._fake_advance_clock(self._fake_step_time_ms / 1e3)
        self._forward_and_sample(batch)
        self.resource_manager.update_resources(batch)
        self._add_kv_cache_events()
        finished = self._handle_responses()
        self._fake_log.append(
            (
                self.iter_counter,
                [r.py_client_id for r in batch.context_requests],
                [r.py_client_id for r in batch.generation_requests],
                [r.py_client_id for r in batch.paused_requests],
            )
        )
        self._record_stats(batch, ctx_tokens, finished)
        self.iter_counter += 1

    def _record_stats(self, batch: ScheduledRequests, ctx_tokens: int, finished: int) -> None:
        kv = self._kv_cache_manager
        stats: dict[str, Any] = {
            "iter": self.iter_counter,
            "iterLatencyMS": self._fake_step_time_ms,
            "numActiveRequests": len(self.active_requests),
            "numQueuedRequests": len(self.waiting_queue),
            "numCompletedRequests": finished,
            "maxNumActiveRequests": self.max_num_active_requests,
            "inflightBatchingStats": {
                "numScheduledRequests": batch.batch_size,
                "numContextRequests": len(batch.context_requests),
                "numGenRequests": len(batch.generation_requests),
                "numPausedRequests": len(batch.paused_requests),
                "numCtxTokens": ctx_tokens,
                "microBatchId": 0,
                "avgNumDecodedTokensPerIter": 1.0 if batch.generation_requests else 0.0,
            },
        }
        if kv is not None:
            s = kv.get_kv_cache_stats()
            stats["kvCacheStats"] = {
                "maxNumBlocks": s.max_num_blocks,
                "freeNumBlocks": s.free_num_blocks,
                "usedNumBlocks": s.used_num_blocks,
                "tokensPerBlock": s.tokens_per_block,
                "allocTotalBlocks": s.alloc_total_blocks,
                "allocNewBlocks": s.alloc_new_blocks,
                "reusedBlocks": s.reused_blocks,
                "missedBlocks": s.missed_blocks,
                "cacheHitRate": s.cache_hit_rate,
            }
        self._fake_stats.append(stats)
