"""Double of ``tensorrt_llm.bindings`` (1.2.x): the request state enum and sampling config.

In the real package these are nanobind classes from the CUDA-linked extension; values of
``LlmRequestState`` are those of release 1.2 (engine notes §5.2.1; they differ across releases).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["LlmRequestState", "SamplingConfig"]


class LlmRequestState(enum.IntEnum):
    """Request states of TensorRT-LLM 1.2 (``batch_manager/llmRequest.h``)."""

    UNKNOWN = 0
    ENCODER_INIT = 1
    DISAGG_GENERATION_INIT = 8
    DISAGG_GENERATION_TRANS_IN_PROGRESS = 9
    CONTEXT_INIT = 10
    DISAGG_CONTEXT_INIT_AND_TRANS = 11
    DISAGG_GENERATION_TRANS_COMPLETE = 12
    GENERATION_IN_PROGRESS = 13
    GENERATION_TO_COMPLETE = 14
    GENERATION_COMPLETE = 20
    DISAGG_CONTEXT_TRANS_IN_PROGRESS = 21
    DISAGG_CONTEXT_COMPLETE = 22
    DISAGG_TRANS_ERROR = -1


@dataclass
class SamplingConfig:
    """The part of the C++ sampling config schedulers read."""

    beam_width: int = 1
