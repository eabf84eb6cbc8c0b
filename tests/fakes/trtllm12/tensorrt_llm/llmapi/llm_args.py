"""Double of ``tensorrt_llm.llmapi.llm_args`` (1.2.x): the config classes of notes §5.2.5."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CapacitySchedulerPolicy",
    "ContextChunkingPolicy",
    "KvCacheConfig",
    "LoadFormat",
    "SchedulerConfig",
    "TorchLlmArgs",
]


class _StrEnum(str, enum.Enum):
    def __str__(self) -> str:
        return str(self.value)

    def _to_pybind(self) -> _StrEnum:
        return self


class CapacitySchedulerPolicy(_StrEnum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


class ContextChunkingPolicy(_StrEnum):
    FIRST_COME_FIRST_SERVED = "FIRST_COME_FIRST_SERVED"
    EQUAL_PROGRESS = "EQUAL_PROGRESS"


class LoadFormat(enum.Enum):
    AUTO = 0
    DUMMY = 1


@dataclass
class SchedulerConfig:
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: ContextChunkingPolicy | None = None
    dynamic_batch_config: Any = None


@dataclass
class KvCacheConfig:
    enable_block_reuse: bool = True
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = None
    host_cache_size: int | None = None
    onboard_blocks: bool = True
    secondary_offload_min_priority: int | None = None
    event_buffer_max_size: int = 0
    tokens_per_block: int = 32
    dtype: str = "auto"


@dataclass
class TorchLlmArgs:
    model: str = ""
    backend: str = "pytorch"
    max_batch_size: int = 2048
    max_num_tokens: int = 8192
    max_seq_len: int = 4096
    max_input_len: int = 0x7FFFFFFF
    max_beam_width: int = 1
    enable_chunked_prefill: bool = False
    kv_cache_config: KvCacheConfig = field(default_factory=KvCacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    load_format: LoadFormat | str = LoadFormat.AUTO
    skip_tokenizer_init: bool = False
    # test-only controls of the double
    _fake: dict[str, Any] = field(default_factory=dict)
