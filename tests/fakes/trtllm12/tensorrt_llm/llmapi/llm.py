"""Double of the LLM API (``tensorrt_llm.llmapi.LLM``, 1.2.x, notes §1.6 and §5.2.6).

The engine runs in-process (as with ``TLLM_WORKER_USE_SINGLE_PROCESS=1``). Outputs are produced
one executor iteration at a time: synchronously through ``_fake_step()``, or, when
``generate_async`` is called inside a running event loop, by a background task that steps while
there is work. Test-only arguments start with ``_fake_``: ``clock`` (a callable in seconds;
default a :class:`~tensorrt_llm._fake.FakeClock` advanced by ``step_time_s`` per iteration),
``output_len`` (``(prompt_token_ids, sampling_params) -> true output length``) and
``step_time_s``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tensorrt_llm._fake import FakeClock
from tensorrt_llm.executor.base_worker import BaseWorker

from ..sampling_params import SamplingParams
from .llm_args import KvCacheConfig, SchedulerConfig, TorchLlmArgs

__all__ = ["LLM", "CompletionOutput", "RequestOutput"]


@dataclass
class CompletionOutput:
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class _ExecutorRequest:
    client_id: int
    input_token_ids: list[int]
    max_tokens: int
    streaming: bool
    kv_cache_retention_config: Any
    scheduling_params: Any
    _fake_output_len: int


class RequestOutput:
    """``GenerationResult``: async-iterable; each iteration applies one engine response."""

    def __init__(self, llm: LLM, request_id: int, prompt_token_ids: list[int]) -> None:
        self._llm = llm
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [CompletionOutput()]
        self.finished = False
        self._pending: deque[tuple[list[int], bool, str | None]] = deque()
        self._wakeup: asyncio.Event | None = None

    def abort(self) -> None:
        self._llm._engine.cancel_request(self.request_id)

    def _push(self, token_ids: list[int], finished: bool, reason: str | None) -> None:
        self._pending.append((token_ids, finished, reason))
        if self._wakeup is not None:
            self._wakeup.set()

    def _fake_next(self) -> RequestOutput | None:
        """Apply the next response, or return None when none is pending (test-only, sync)."""
        if not self._pending:
            return None
        token_ids, finished, reason = self._pending.popleft()
        self.outputs[0].token_ids = token_ids
        self.outputs[0].finish_reason = reason
        self.finished = finished
        return self

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished and not self._pending:
            raise StopAsyncIteration
        while not self._pending:
            self._wakeup = self._wakeup or asyncio.Event()
            self._wakeup.clear()
            await self._wakeup.wait()
        out = self._fake_next()
        assert out is not None
        return out


class LLM:
    def __init__(
        self,
        model: str,
        tokenizer: Any = None,
        *,
        backend: str = "pytorch",
        max_batch_size: int = 8,
        max_num_tokens: int = 8192,
        max_seq_len: int = 4096,
        kv_cache_config: KvCacheConfig | None = None,
        scheduler_config: SchedulerConfig | None = None,
        enable_chunked_prefill: bool = False,
        load_format: Any = "auto",
        skip_tokenizer_init: bool = False,
        **kwargs: Any,
    ) -> None:
        fake = {k.removeprefix("_fake_"): v for k, v in kwargs.items() if k.startswith("_fake_")}
        unknown = sorted(k for k in kwargs if not k.startswith("_fake_"))
        if unknown:
            raise TypeError(f"LLM() got unexpected keyword arguments {unknown}")
        self._clock: Callable[[], float] = fake.get("clock") or FakeClock()
        self._step_time_s: float = fake.get("step_time_s", 0.01)
        self._output_len: Callable[[list[int], SamplingParams], int] | None = fake.get("output_len")
        fake["clock"] = self._clock
        self.args = TorchLlmArgs(
            model=model,
            backend=backend,
            max_batch_size=max_batch_size,
            max_num_tokens=max_num_tokens,
            max_seq_len=max_seq_len,
            enable_chunked_prefill=enable_chunked_prefill,
            kv_cache_config=kv_cache_config or KvCacheConfig(),
            scheduler_config=scheduler_config or SchedulerConfig(),
            load_format=load_format,
            skip_tokenizer_init=skip_tokenizer_init,
            _fake=fake,
        )
        self._executor = BaseWorker(self.args)
        self._executor.setup_engine()
        self._engine = self._executor.engine
        self._engine._fake_step_time_ms = self._step_time_s * 1e3
        self._engine._fake_response_sink = self._on_response
        if isinstance(self._clock, FakeClock):
            self._engine._fake_advance_clock = self._clock.advance
        self._results: dict[int, RequestOutput] = {}
        self._next_client_id = 1
        self._serving: asyncio.Task[None] | None = None

    @property
    def tokenizer(self) -> Any:
        return None

    def generate_async(
        self,
        inputs: Any,
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        kv_cache_retention_config: Any = None,
        disaggregated_params: Any = None,
        _postproc_params: Any = None,
        scheduling_params: Any = None,
        cache_salt: str | None = None,
    ) -> RequestOutput:
        if isinstance(inputs, dict):
            inputs = inputs["prompt_token_ids"]
        if not isinstance(inputs, list) or not all(isinstance(t, int) for t in inputs):
            raise TypeError("the TensorRT-LLM double takes prompts as token-id lists")
        sp = sampling_params or SamplingParams()
        client_id = self._next_client_id
        self._next_client_id += 1
        true_len = self._output_len(inputs, sp) if self._output_len else sp.max_tokens
        self._engine.enqueue_request(
            _ExecutorRequest(
                client_id,
                list(inputs),
                sp.max_tokens,
                streaming,
                kv_cache_retention_config,
                scheduling_params,
                true_len,
            )
        )
        result = RequestOutput(self, client_id, list(inputs))
        self._results[client_id] = result
        self._maybe_serve()
        return result

    def _on_response(self, req: Any, finished: bool) -> None:
        result = self._results.get(req.py_client_id)
        if result is None:
            return
        token_ids = req.get_tokens(0)[req.orig_prompt_len :]
        reason = req.finish_reason.name.lower() if finished else None
        result._push(token_ids, finished, reason)
        if finished:
            del self._results[req.py_client_id]

    def get_kv_cache_events(self, timeout: float | None = 2) -> list[dict[str, Any]]:
        kv = self._engine._kv_cache_manager
        return [] if kv is None else kv.get_latest_events(0)

    def get_stats(self, timeout: float = 2) -> list[dict[str, Any]]:
        stats, self._engine._fake_stats = self._engine._fake_stats, []
        return stats

    def shutdown(self) -> None:
        self._engine.shutdown()

    # -- test-only driving ----------------------------------------------------------------------

    def _fake_has_work(self) -> bool:
        return bool(self._engine.waiting_queue or self._engine.active_requests)

    def _fake_step(self) -> None:
        self._engine._fake_step()

    def _maybe_serve(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._serving is None or self._serving.done():
            self._serving = loop.create_task(self._serve())

    async def _serve(self) -> None:
        while self._fake_has_work():
            self._fake_step()
            for _ in range(4):  # let consumers react to this iteration's outputs
                await asyncio.sleep(0)
