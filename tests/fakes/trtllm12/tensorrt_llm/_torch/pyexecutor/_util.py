"""Double of ``tensorrt_llm._torch.pyexecutor._util.create_py_executor_instance`` (1.2.x, §1.3).

Builds the scheduler exactly as 1.2 hard-codes it: a ``BindCapacityScheduler`` over the C++ KV
manager (``kv_cache_manager.impl``) with ``max_batch_size * pp_size`` requests, a
``BindMicroBatchScheduler`` and a ``SimpleScheduler`` around both.
"""

from __future__ import annotations

from typing import Any

from .py_executor import PyExecutor
from .resource_manager import ResourceManager, ResourceManagerType
from .scheduler import BindCapacityScheduler, BindMicroBatchScheduler, SimpleScheduler

__all__ = ["create_py_executor_instance"]


def create_py_executor_instance(
    *,
    dist: Any,
    resources: dict[Any, Any],
    mapping: Any,
    llm_args: Any,
    ctx_chunk_config: Any,
    model_engine: Any,
    start_worker: bool,
    sampler: Any,
    drafter: Any,
    guided_decoder: Any = None,
    lora_config: Any = None,
    garbage_collection_gen0_threshold: Any = None,
    kv_connector_manager: Any = None,
    max_seq_len: int | None = None,
    max_batch_size: int | None = None,
    max_beam_width: int | None = None,
    max_num_tokens: int | None = None,
    peft_cache_config: Any = None,
    scheduler_config: Any = None,
    cache_transceiver_config: Any = None,
    virtual_memory_pools: Any = None,
    execution_stream: Any = None,
) -> PyExecutor:
    kv_cache_manager = resources.get(ResourceManagerType.KV_CACHE_MANAGER)
    resource_manager = ResourceManager(resources)
    assert max_batch_size is not None
    scheduler_capacity = max_batch_size * mapping.pp_size
    capacity_scheduler = BindCapacityScheduler(
        scheduler_capacity,
        kv_cache_manager.impl if kv_cache_manager is not None else None,
        None,
        scheduler_config.capacity_scheduler_policy,
        two_step_lookahead=mapping.has_pp(),
    )
    mb_scheduler = BindMicroBatchScheduler(max_batch_size, max_num_tokens, ctx_chunk_config)
    scheduler = SimpleScheduler(capacity_scheduler, mb_scheduler)
    return PyExecutor(
        resource_manager,
        scheduler,
        model_engine=model_engine,
        sampler=sampler,
        dist=dist,
        max_num_sequences=scheduler_capacity,
        max_input_len=llm_args.max_input_len,
        max_batch_size=max_batch_size,
        max_beam_width=max_beam_width or 1,
        start_worker=start_worker,
        max_seq_len=max_seq_len,
    )
