"""Double of ``tensorrt_llm._torch.pyexecutor.py_executor_creator`` (1.2.x, §1.3).

``create_py_executor_instance`` is bound here by name (``from ._util import ...``), so a wrapper
must replace *this module's* global. When the KV cache size is not given it is estimated: a
throw-away executor is built and shut down first, then the real one (two calls).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tensorrt_llm.llmapi.llm_args import ContextChunkingPolicy
from tensorrt_llm.mapping import Mapping

from ._util import create_py_executor_instance
from .resource_manager import KVCacheManager, ResourceManagerType

__all__ = ["create_py_executor"]

# The double's "model": what the KV bytes per token derive from.
FAKE_MODEL = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 16}
FAKE_DEVICE_KV_TOKENS = 4096  # KV tokens the double's "GPU" holds at fraction 1.0
ESTIMATION_KV_TOKENS = 512


def _kv_manager(llm_args: Any, kv_config: Any, estimating: bool) -> KVCacheManager:
    return KVCacheManager(
        kv_config,
        None,
        tokens_per_block=kv_config.tokens_per_block,
        max_seq_len=llm_args.max_seq_len,
        max_batch_size=llm_args.max_batch_size,
        mapping=Mapping(),
        max_num_tokens=llm_args.max_num_tokens,
        is_estimating_kv_cache=estimating,
        _fake_clock=llm_args._fake.get("clock"),
        **FAKE_MODEL,
    )


def _instance(llm_args: Any, kv: KVCacheManager) -> Any:
    chunking = None
    if llm_args.enable_chunked_prefill:
        policy = (
            llm_args.scheduler_config.context_chunking_policy
            or ContextChunkingPolicy.FIRST_COME_FIRST_SERVED
        )
        chunking = (policy, kv.tokens_per_block)
    return create_py_executor_instance(
        dist=None,
        resources={ResourceManagerType.KV_CACHE_MANAGER: kv},
        mapping=Mapping(),
        llm_args=llm_args,
        ctx_chunk_config=chunking,
        model_engine=None,
        start_worker=False,
        sampler=None,
        drafter=None,
        max_seq_len=llm_args.max_seq_len,
        max_batch_size=llm_args.max_batch_size,
        max_beam_width=1,
        max_num_tokens=llm_args.max_num_tokens,
        scheduler_config=llm_args.scheduler_config,
    )


def create_py_executor(
    llm_args: Any,
    checkpoint_dir: str | None = None,
    tokenizer: Any = None,
    profiling_stage_data: Any = None,
) -> Any:
    kv_config = llm_args.kv_cache_config
    if kv_config.max_tokens is None:
        estimation = dataclasses.replace(kv_config, max_tokens=ESTIMATION_KV_TOKENS)
        throwaway = _instance(llm_args, _kv_manager(llm_args, estimation, True))
        throwaway.shutdown()
        fraction = kv_config.free_gpu_memory_fraction or 0.9
        kv_config = dataclasses.replace(kv_config, max_tokens=int(fraction * FAKE_DEVICE_KV_TOKENS))
    py_executor = _instance(llm_args, _kv_manager(llm_args, kv_config, False))
    py_executor.start_worker()
    return py_executor
