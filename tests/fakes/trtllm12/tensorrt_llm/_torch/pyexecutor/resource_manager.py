"""Double of ``tensorrt_llm._torch.pyexecutor.resource_manager`` (1.2.x, KV manager V1; §2.1)."""

from __future__ import annotations

import enum
import math
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any

from tensorrt_llm.bindings.internal.batch_manager import KVCacheManager as KVCacheManagerCpp

__all__ = ["BaseResourceManager", "KVCacheManager", "ResourceManager", "ResourceManagerType"]


class ResourceManagerType(enum.Enum):
    KV_CACHE_MANAGER = "KV_CACHE_MANAGER"
    DRAFT_KV_CACHE_MANAGER = "DRAFT_KV_CACHE_MANAGER"
    PEFT_CACHE_MANAGER = "PEFT_CACHE_MANAGER"
    SEQ_SLOT_MANAGER = "SEQ_SLOT_MANAGER"
    SPEC_RESOURCE_MANAGER = "SPEC_RESOURCE_MANAGER"


class BaseResourceManager(ABC):
    @abstractmethod
    def get_max_resource_count(self) -> int: ...

    @abstractmethod
    def get_needed_resource_to_completion(self, request: Any) -> int: ...

    def add_dummy_requests(self, request_ids: list[int]) -> None:
        return None

    def prepare_resources(self, scheduled_batch: Any) -> None:
        return None

    def update_resources(self, scheduled_batch: Any) -> None:
        return None

    def free_resources(self, request: Any) -> None:
        return None

    def shutdown(self) -> None:
        return None


class KVCacheManager(BaseResourceManager):
    """The Python wrapper; ``impl`` is the (double of the) C++ manager the scheduler receives."""

    def __init__(
        self,
        kv_cache_config: Any,
        kv_cache_type: Any = None,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        tokens_per_block: int,
        max_seq_len: int,
        max_batch_size: int,
        mapping: Any,
        dtype: Any = None,
        max_num_tokens: int = 8192,
        is_estimating_kv_cache: bool = False,
        **kwargs: Any,
    ) -> None:
        self.kv_cache_config = kv_cache_config
        self.tokens_per_block = tokens_per_block
        self.max_seq_len = max_seq_len
        self.max_batch_size = max_batch_size
        self.enable_block_reuse = kv_cache_config.enable_block_reuse
        self.enable_partial_reuse = kv_cache_config.enable_partial_reuse
        self.event_buffer_max_size = kv_cache_config.event_buffer_max_size
        self.is_vswa = False
        self.max_attention_window_vec = [max_seq_len]
        self.dtype = kv_cache_config.dtype
        bytes_per_token = (
            2 * num_layers * num_kv_heads * head_dim * (1 if self.dtype == "fp8" else 2)
        )
        self.blocks_in_primary_pool = kv_cache_config.max_tokens // tokens_per_block
        host = kv_cache_config.host_cache_size or 0
        self.blocks_in_secondary_pool = host // (bytes_per_token * tokens_per_block)
        self.num_pools = 1
        self.max_blocks_per_seq = math.ceil(max_seq_len / tokens_per_block)
        self.impl = KVCacheManagerCpp(
            max_num_blocks=self.blocks_in_primary_pool,
            tokens_per_block=tokens_per_block,
            num_secondary_blocks=self.blocks_in_secondary_pool,
            enable_block_reuse=self.enable_block_reuse,
            event_buffer_max_size=self.event_buffer_max_size,
            window_size=max_seq_len,
            clock=kwargs.get("_fake_clock") or time.monotonic,
        )

    def get_max_resource_count(self) -> int:
        return self.impl.max_num_blocks

    def get_needed_resource_to_completion(self, request: Any) -> int:
        context = request.orig_prompt_len
        context_blocks = context // self.tokens_per_block
        rest = context + request.max_new_tokens - context_blocks * self.tokens_per_block
        return context_blocks + math.ceil(rest / self.tokens_per_block)

    def prepare_resources(self, scheduled_batch: Any) -> None:
        for req in scheduled_batch.context_requests:
            if req.is_first_context_chunk:
                self.impl.add_sequence(req.py_request_id, req.prompt_len, 1, req)
        for req in scheduled_batch.generation_requests:
            self.impl.add_token(req.py_request_id)

    def update_resources(
        self, scheduled_batch: Any, attn_metadata: Any = None, kv_cache_dtype_byte_size: Any = None
    ) -> None:
        for req in scheduled_batch.context_requests:
            if req.context_current_position >= req.prompt_len:
                self.impl.store_context_blocks(req)

    def free_resources(self, request: Any, pin_on_release: bool = False) -> None:
        self.impl.remove_sequence(request.py_request_id, request, pin_on_release)

    def get_cache_indices(self, request: Any, window_size: int | None = None) -> list[int]:
        return self.impl.get_cache_block_ids(request.py_request_id)

    def get_num_free_blocks(self) -> int:
        return self.impl.get_num_free_blocks()

    def get_num_kv_blocks(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.tokens_per_block)

    def get_kv_cache_stats(self) -> Any:
        return self.impl.get_kv_cache_stats()

    def flush_iteration_events(self) -> None:
        self.impl.flush_iteration_events()

    def get_latest_events(self, timeout_ms: float | None = 0) -> list[dict[str, Any]]:
        return self.impl.get_latest_events(timeout_ms)

    def shutdown(self) -> None:
        return None


class ResourceManager:
    """Resource managers by type; the KV cache manager runs last and frees first."""

    def __init__(self, resource_managers: dict[Any, BaseResourceManager]) -> None:
        self.resource_managers: OrderedDict[Any, BaseResourceManager] = OrderedDict(
            resource_managers
        )
        if ResourceManagerType.KV_CACHE_MANAGER in self.resource_managers:
            self.resource_managers.move_to_end(ResourceManagerType.KV_CACHE_MANAGER)

    def get_resource_manager(self, name: Any) -> BaseResourceManager | None:
        return self.resource_managers.get(name)

    def prepare_resources(self, scheduled_batch: Any) -> None:
        for manager in self.resource_managers.values():
            if manager is not None:
                manager.prepare_resources(scheduled_batch)

    def update_resources(
        self, scheduled_batch: Any, attn_metadata: Any = None, kv_cache_dtype_byte_size: Any = None
    ) -> None:
        for manager in self.resource_managers.values():
            if manager is not None:
                manager.update_resources(scheduled_batch)

    def free_resources(self, request: Any) -> None:
        for manager in reversed(self.resource_managers.values()):
            if manager is not None:
                manager.free_resources(request)

    def reorder_pipeline(self, names: list[Any]) -> None:
        for name in names:
            self.resource_managers.move_to_end(name)
