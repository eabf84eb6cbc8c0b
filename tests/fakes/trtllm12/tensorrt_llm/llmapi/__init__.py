"""Double of ``tensorrt_llm.llmapi`` (1.2.x)."""

from tensorrt_llm.bindings.executor import KvCacheRetentionConfig

from ..sampling_params import SamplingParams
from .llm import LLM, CompletionOutput, RequestOutput
from .llm_args import (
    CapacitySchedulerPolicy,
    ContextChunkingPolicy,
    KvCacheConfig,
    LoadFormat,
    SchedulerConfig,
    TorchLlmArgs,
)

__all__ = [
    "LLM",
    "CapacitySchedulerPolicy",
    "CompletionOutput",
    "ContextChunkingPolicy",
    "KvCacheConfig",
    "KvCacheRetentionConfig",
    "LoadFormat",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
    "TorchLlmArgs",
]
