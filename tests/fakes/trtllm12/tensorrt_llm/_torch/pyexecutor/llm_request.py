"""Double of ``tensorrt_llm._torch.pyexecutor.llm_request`` (1.2.x).

``LlmRequest`` carries the attributes listed in the engine notes §5.2.2. The real class is a
nanobind subclass of the C++ request that accepts new Python attributes; adapters keep their own
fields in ``py_*`` attributes, which this double allows too. Attributes starting with ``_fake``
are test-only.
"""

from __future__ import annotations

from typing import Any

from tensorrt_llm.bindings import LlmRequestState, SamplingConfig
from tensorrt_llm.bindings.executor import FinishReason

__all__ = ["LlmRequest", "LlmRequestState", "executor_request_to_llm_request"]


class LlmRequest:
    """One request inside the executor."""

    def __init__(
        self,
        request_id: int,
        max_new_tokens: int,
        input_tokens: list[int],
        sampling_config: SamplingConfig | None = None,
        is_streaming: bool = False,
        *,
        client_id: int | None = None,
        priority: float = 0.5,
        kv_cache_retention_config: Any = None,
        lora_task_id: int | None = None,
        scheduling_params: Any = None,
    ) -> None:
        self.request_id = request_id
        self.py_request_id = request_id
        self.py_client_id = client_id
        self.state = LlmRequestState.CONTEXT_INIT
        self._tokens = list(input_tokens)
        self.prompt_len = len(input_tokens)
        self.orig_prompt_len = len(input_tokens)
        self.py_orig_prompt_len = len(input_tokens)
        self.max_new_tokens = max_new_tokens
        self.py_max_new_tokens = max_new_tokens
        self.context_current_position = 0
        self.context_chunk_size = len(input_tokens)
        self.sampling_config = sampling_config or SamplingConfig()
        self.py_draft_tokens: list[int] = []
        self.lora_task_id = lora_task_id
        self.streaming = is_streaming
        self.is_dummy = False
        self.is_attention_dp_dummy = False
        self.is_cuda_graph_dummy = False
        self.py_scheduling_params = scheduling_params
        self.priority = priority
        self.kv_cache_retention_config = kv_cache_retention_config
        self.finish_reason = FinishReason.NOT_FINISHED
        # test-only bookkeeping of the double's executor
        self._fake_output_len = max_new_tokens
        self._fake_sent_tokens = 0
        self._fake_first_scheduled_iter: int | None = None
        self._fake_first_token_iter: int | None = None
        self._fake_num_pauses = 0

    # -- token accounting -----------------------------------------------------------------------

    def get_tokens(self, beam: int = 0) -> list[int]:
        return list(self._tokens)

    def get_num_tokens(self, beam: int = 0) -> int:
        return len(self._tokens)

    def add_new_token(self, token: int, beam: int = 0) -> None:
        self._tokens.append(token)

    @property
    def context_remaining_length(self) -> int:
        return self.prompt_len - self.context_current_position

    def get_context_remaining_length(self) -> int:
        return self.context_remaining_length

    @property
    def is_first_context_chunk(self) -> bool:
        return self.context_current_position == 0

    @property
    def is_last_context_chunk(self) -> bool:
        return self.context_current_position + self.context_chunk_size >= self.prompt_len

    def move_to_next_context_chunk(self) -> None:
        self.context_current_position += self.context_chunk_size

    @property
    def num_draft_tokens(self) -> int:
        return len(self.py_draft_tokens)

    @property
    def has_draft_tokens(self) -> bool:
        return bool(self.py_draft_tokens)

    # -- state ----------------------------------------------------------------------------------

    def is_generation_only_request(self) -> bool:
        return False

    @property
    def is_finished(self) -> bool:
        return self.state == LlmRequestState.GENERATION_COMPLETE

    def pause(self, max_input_len: int) -> None:
        """Back to ``CONTEXT_INIT``: generated tokens join the prompt (recompute on resume).

        As C++ ``LlmRequest::pause`` for beam width 1: when the sequence still fits
        ``max_input_len`` the prompt becomes every token so far and ``max_new_tokens`` shrinks by
        the tokens generated since the last prompt.
        """
        num_tokens = self.get_num_tokens(0)
        if num_tokens <= max_input_len:
            self.max_new_tokens -= num_tokens - self.prompt_len
            self.prompt_len = num_tokens
        else:
            del self._tokens[self.prompt_len :]
        self.state = LlmRequestState.CONTEXT_INIT
        self.context_current_position = 0
        self.context_chunk_size = self.prompt_len
        self._fake_num_pauses += 1

    def finish_by(self, finish_reason: FinishReason, beam: int = 0) -> None:
        self.state = LlmRequestState.GENERATION_COMPLETE
        self.finish_reason = finish_reason

    def _fake_set_prepopulated_prompt_len(self, num_tokens: int) -> None:
        """What C++ ``setPrepopulatedPromptLen`` does: skip the tokens found in the cache."""
        end = self.context_current_position + self.context_chunk_size
        self.context_current_position = num_tokens
        self.context_chunk_size = max(0, min(end, self.prompt_len) - num_tokens)


def executor_request_to_llm_request(
    req_id: int,
    executor_request: Any,
    child_req_ids: Any = None,
    exclude_last_generation_logits: bool = False,
) -> LlmRequest:
    """As in 1.2: priority is hard-coded 0.5; the retention config is forwarded."""
    return LlmRequest(
        req_id,
        executor_request.max_tokens,
        executor_request.input_token_ids,
        SamplingConfig(beam_width=1),
        executor_request.streaming,
        client_id=executor_request.client_id,
        priority=0.5,
        kv_cache_retention_config=executor_request.kv_cache_retention_config,
        scheduling_params=executor_request.scheduling_params,
    )
