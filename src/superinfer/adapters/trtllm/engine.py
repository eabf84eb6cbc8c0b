"""Lazy access to TensorRT-LLM 1.2.x: the version gate, the modules we touch, request states.

Nothing here imports ``tensorrt_llm`` at module import time: it cannot be installed or imported
without CUDA (engine notes ``trtllm-1.2.md`` §5.1), and superinfer never depends on it.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "SUPPORTED_SERIES",
    "EngineModules",
    "RequestStates",
    "UnsupportedEngineError",
    "check_version",
    "load_engine",
]

#: The release series the adapter is written against (``major.minor``). Module layout, request
#: state values and the scheduler construction differ in other releases (notes §0, §1.1, §5.2.1).
SUPPORTED_SERIES = (1, 2)

_SCHEDULER = "tensorrt_llm._torch.pyexecutor.scheduler"
_LLM_REQUEST = "tensorrt_llm._torch.pyexecutor.llm_request"
_RESOURCE_MANAGER = "tensorrt_llm._torch.pyexecutor.resource_manager"
CREATOR_MODULE = "tensorrt_llm._torch.pyexecutor.py_executor_creator"


class UnsupportedEngineError(RuntimeError):
    """The installed TensorRT-LLM is not a layout this adapter knows (wrong version, KV manager
    V2, an unexpected scheduler or event schema)."""


def check_version(version: str) -> None:
    """Accept ``1.2.x`` releases (``1.2.0rc8``, ``1.2.1``, ``1.2.1.post1``), refuse the rest.

    Raises:
        UnsupportedEngineError: any other version, naming it.
    """
    match = re.match(r"^(\d+)\.(\d+)", version)
    if match is None or (int(match[1]), int(match[2])) != SUPPORTED_SERIES:
        series = ".".join(map(str, SUPPORTED_SERIES))
        raise UnsupportedEngineError(
            f"superinfer's TensorRT-LLM adapter supports {series}.x; found tensorrt_llm {version}"
        )


@dataclass(frozen=True)
class RequestStates:
    """The ``LlmRequestState`` members the adapter compares against.

    Members are held (never their integer values, which differ across releases: notes §5.2.1).
    """

    context_init: Any
    generation_in_progress: Any
    generation_to_complete: Any
    generation_complete: Any

    @classmethod
    def from_enum(cls, enum: Any) -> RequestStates:
        return cls(
            enum.CONTEXT_INIT,
            enum.GENERATION_IN_PROGRESS,
            enum.GENERATION_TO_COMPLETE,
            enum.GENERATION_COMPLETE,
        )

    def is_started(self, req: Any) -> bool:
        """Holds KV: generating, or a context request past its first chunk."""
        state = req.state
        if state == self.context_init:
            return bool(req.context_current_position > 0)
        return bool(state == self.generation_in_progress or state == self.generation_to_complete)

    def is_waiting(self, req: Any) -> bool:
        """Not started: ``CONTEXT_INIT`` at position 0 (new, or paused and back for recompute)."""
        return bool(req.state == self.context_init and req.context_current_position == 0)


@dataclass(frozen=True)
class EngineModules:
    """The TensorRT-LLM modules and classes the adapter uses, resolved once.

    Attributes:
        version: ``tensorrt_llm.__version__``.
        scheduler: ``tensorrt_llm._torch.pyexecutor.scheduler``.
        resource_manager: ``tensorrt_llm._torch.pyexecutor.resource_manager``.
        states: the request states.
        finish_reason: ``tensorrt_llm.bindings.executor.FinishReason``.
        retention_config: ``tensorrt_llm.llmapi.KvCacheRetentionConfig``.
    """

    version: str
    scheduler: ModuleType
    resource_manager: ModuleType
    states: RequestStates
    finish_reason: Any
    retention_config: Any


def load_engine() -> EngineModules:
    """Import the TensorRT-LLM pieces the adapter needs, after the version gate.

    Raises:
        ImportError: ``tensorrt_llm`` is not importable (e.g. no CUDA).
        UnsupportedEngineError: not a 1.2.x release.
    """
    trtllm = importlib.import_module("tensorrt_llm")
    check_version(str(getattr(trtllm, "__version__", "unknown")))
    llm_request = importlib.import_module(_LLM_REQUEST)
    executor_bindings = importlib.import_module("tensorrt_llm.bindings.executor")
    llmapi = importlib.import_module("tensorrt_llm.llmapi")
    return EngineModules(
        version=trtllm.__version__,
        scheduler=importlib.import_module(_SCHEDULER),
        resource_manager=importlib.import_module(_RESOURCE_MANAGER),
        states=RequestStates.from_enum(llm_request.LlmRequestState),
        finish_reason=executor_bindings.FinishReason,
        retention_config=llmapi.KvCacheRetentionConfig,
    )
