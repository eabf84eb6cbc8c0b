"""Tiny real SGLang worlds on CPU: KV pools, a radix cache (Python or Rust tree core), requests,
and prefilled running batches, all from the sglang 0.5.23 wheel (``make install-sglang``).

Test modules call :func:`tests.adapters.sglang.gate.require_sglang` before importing this one.
"""

from __future__ import annotations

import types
from array import array
from typing import Any

import torch
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import PrefillAdder
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from superinfer.adapters.manager import build_plugin_manager
from superinfer.adapters.sglang.config import AdapterConfig
from superinfer.adapters.sglang.plugin import SGLangAdapter, register_eviction_policy
from superinfer.adapters.sglang.view import EngineLimits

VOCAB = 1000


# The scheduler's runtime context that SGLang's modules read (page size 1, priority scheduling on).
set_global_server_args_for_scheduler(
    ServerArgs(model_path="dummy", page_size=1, enable_priority_scheduling=True)
)
register_eviction_policy(lambda: None)  # "superinfer" known to the cache factory


class World:
    """One scheduler's KV memory: request slots, a KV pool of ``kv_tokens`` and a radix cache."""

    def __init__(self, kv_tokens: int, eviction: str, core: str) -> None:
        self.req_pool = ReqToTokenPool(
            size=16, max_context_len=512, device="cpu", enable_memory_saver=False
        )
        kv = MHATokenToKVPool(
            size=kv_tokens,
            page_size=1,
            dtype=torch.bfloat16,
            head_num=1,
            head_dim=8,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        self.allocator = TokenToKVPoolAllocator(
            size=kv_tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False
        )
        self.cache = UnifiedRadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=self.req_pool,
                token_to_kv_pool_allocator=self.allocator,
                page_size=1,
                eviction_policy=eviction,
                tree_components=(ComponentType.FULL,),
                tree_core_backend=core,
            )
        )
        self.model_config = types.SimpleNamespace(
            vocab_size=VOCAB, is_encoder_decoder=False, hf_eos_token_id=None, context_len=512
        )

    def prefill(self, reqs: list[Any]) -> ScheduleBatch:
        """Run SGLang's real admission and extend bookkeeping for ``reqs`` (no model forward), then
        give each one sampled token: the batch is what a running decode batch holds."""
        adder = PrefillAdder(
            page_size=1,
            tree_cache=self.cache,
            token_to_kv_pool_allocator=self.allocator,
            running_batch=ScheduleBatch(reqs=[]),
            new_token_ratio=0.7,
            rem_input_tokens=16384,
            rem_chunk_tokens=None,
        )
        for req in reqs:
            req.init_next_round_input(self.cache)
            adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        assert [r.rid for r in adder.can_run_list] == [r.rid for r in reqs]
        batch = ScheduleBatch.init_new(
            adder.can_run_list,
            self.req_pool,
            self.allocator,
            self.cache,
            self.model_config,
            False,
            SpeculativeAlgorithm.NONE,
        )
        batch.prepare_for_extend()
        for req in batch.reqs:
            req.output_ids.append(1)
        return batch


def make_req(
    rid: str,
    prompt: int = 8,
    *,
    first: int = 0,
    priority: int | None = None,
    max_new: int = 16,
    slo: Any = None,
) -> Any:
    """A real SGLang ``Req`` with prompt tokens ``first, first+1, ...``."""
    params = SamplingParams(max_new_tokens=max_new)
    params.normalize(None)
    params.verify(vocab_size=VOCAB)
    if slo is not None:
        params.custom_params = {"slo": slo}
    req = Req(
        rid,
        "",
        array("q", range(first, first + prompt)),
        params,
        priority=priority,
        vocab_size=VOCAB,
    )
    req.time_stats.set_wait_queue_entry_time()
    return req


class Aborts:
    """An :class:`EnginePort` that records the aborts the adapter sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, int]] = []

    def abort(self, req: Any, message: str, status_code: int) -> None:
        self.sent.append((req.rid, message, status_code))


def make_adapter(
    policy: Any = "fcfs",
    *,
    world: World | None = None,
    limits: EngineLimits | None = None,
    config: AdapterConfig | None = None,
) -> SGLangAdapter:
    """An adapter over ``policy`` (a name or a ready plugin), bound to ``world``'s KV pool."""
    pm = build_plugin_manager(policy)
    adapter = SGLangAdapter(config or AdapterConfig(), pm.hook, limits or EngineLimits())
    adapter.engine = Aborts()
    if world is not None:
        adapter.bind(world.allocator, world.cache)
    return adapter


def arrive(adapter: SGLangAdapter, queue: list[Any], *reqs: Any) -> None:
    """Queue ``reqs`` through the adapter's arrival hook, as ``Scheduler`` would, one scheduler
    iteration apart (arrivals of one iteration share a logical instant)."""

    def enqueue(_scheduler: Any, req: Any, is_retracted: bool = False) -> None:
        queue.append(req)

    for req in reqs:
        adapter.add_request_to_queue(enqueue, None, req)
        adapter.clock.advance(0)
