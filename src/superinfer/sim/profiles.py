"""Engine profiles: the mechanics of each simulated engine, as declarative data.

A profile carries what an engine fixes regardless of policy: KV page size, step limits, how it
sizes and charges KV, its prefix cache and CPU tier, and its native scheduling policy. A policy
plugged in replaces only decisions.

| mechanic | ``sim:vllm`` | ``sim:sglang`` | ``sim:trtllm`` |
|---|---|---|---|
| KV page | 16 tokens | 1 token | 32 tokens |
| tokens per step | 2,048 (A100), 8,192 | 8,192 | 8,192 |
| admission charge | the chunk | chunk + output cap | prompt + output cap, reserved |
| KV memory | 0.9 GPU - W - act | 0.85 GPU - W | 0.9 (GPU - W - act) |
| prefix cache | hashed blocks, LRU | radix, LRU | block reuse, priority LRU |
| CPU tier | KV connector | HiCache | host cache |
| native policy | ``fcfs`` | ``lpm`` | ``fcfs`` |

(W: weights per GPU; act: activation reserve.) Sources are on each profile below.
"""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.policy_core.types import AdmissionRule
from superinfer.sim.hardware import GPUSpec, ModelSpec

__all__ = ["PROFILES", "SIM_SGLANG", "SIM_TRTLLM", "SIM_VLLM", "EngineProfile", "get_profile"]

_GIB = 1024**3


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One engine's mechanics.

    Attributes:
        name: engine id, e.g. ``"sim:vllm"``.
        block_size_tokens: tokens per KV page.
        token_budget: most tokens per step on A100-class GPUs.
        token_budget_large_gpu: the same on GPUs with >= 70 GiB that are not A100s.
        max_num_seqs: most running requests on A100-class GPUs.
        max_num_seqs_large_gpu: the same on larger GPUs.
        kv_memory: how KV capacity is sized: ``"utilization"`` (vLLM: ``fraction x memory -
            weights - activations``), ``"static"`` (SGLang: ``fraction x memory - weights``) or
            ``"free"`` (TensorRT-LLM: ``fraction x (memory - weights - activations)``).
        memory_fraction: the fraction in that formula.
        activation_reserve_bytes: per-GPU memory kept for activations and CUDA graphs (0 where the
            formula has no activation term).
        admission: how admitting a request is charged in KV (see ``AdmissionRule``).
        prefix_cache: ``"hashed_blocks"``, ``"radix"`` or ``"block_reuse"``: all cache whole pages
            of hashed prompt blocks; ``block_reuse`` evicts by retention priority first.
        offload_min_priority: cached blocks below this retention priority are dropped instead of
            offloaded to the CPU tier.
        cpu_kv_ratio: CPU-tier KV capacity as a multiple of HBM KV capacity (0: no CPU tier).
        native_policy: the engine's own scheduling policy, by registered name.
        reserve_ratio_init: SGLang's ``new_token_ratio`` after a retraction (``RESERVE_RATIO``).
        reserve_ratio_min: its floor.
        reserve_ratio_decay: its decrease per decode step.
    """

    name: str
    block_size_tokens: int
    token_budget: int
    token_budget_large_gpu: int
    max_num_seqs: int
    max_num_seqs_large_gpu: int
    kv_memory: str
    memory_fraction: float
    activation_reserve_bytes: int
    admission: AdmissionRule
    prefix_cache: str
    offload_min_priority: int
    cpu_kv_ratio: float
    native_policy: str
    reserve_ratio_init: float = 0.0
    reserve_ratio_min: float = 0.0
    reserve_ratio_decay: float = 0.0

    def limits(self, gpu: GPUSpec) -> tuple[int, int]:
        """``(token_budget, max_num_seqs)`` on ``gpu``."""
        if gpu.memory_bytes >= 70 * _GIB and not gpu.name.startswith("a100"):
            return self.token_budget_large_gpu, self.max_num_seqs_large_gpu
        return self.token_budget, self.max_num_seqs

    def kv_bytes_per_gpu(self, model: ModelSpec, gpu: GPUSpec, tp: int) -> float:
        """HBM bytes per GPU this engine gives its KV cache (<= 0 if the weights do not fit)."""
        weights = model.weight_bytes() / tp
        mem = gpu.memory_bytes
        if self.kv_memory == "utilization":
            return mem * self.memory_fraction - weights - self.activation_reserve_bytes
        if self.kv_memory == "static":
            return mem * self.memory_fraction - weights
        return self.memory_fraction * (mem - weights - self.activation_reserve_bytes)


#: vLLM v1 (v0.10-0.11). Step limits: ``EngineArgs.get_batch_defaults`` (``vllm/engine/
#: arg_utils.py``), OpenAI server context: 2,048 tokens / 256 sequences, or 8,192 / 1,024 on
#: GPUs with >= 70 GiB that are not A100s. ``block_size`` 16 (``vllm/config/cache.py``);
#: ``gpu_memory_utilization`` 0.9 with activations profiled (``gpu_worker.py
#: determine_available_memory``; 3 GiB per GPU is our estimate for a 70B model at TP4 with CUDA
#: graphs). Prefix caching on by default: full blocks hashed, freed blocks evicted LRU
#: (``vllm/v1/core/block_pool.py``). No swap in v1; CPU offload through a KV connector.
SIM_VLLM = EngineProfile(
    name="sim:vllm",
    block_size_tokens=16,
    token_budget=2048,
    token_budget_large_gpu=8192,
    max_num_seqs=256,
    max_num_seqs_large_gpu=1024,
    kv_memory="utilization",
    memory_fraction=0.9,
    activation_reserve_bytes=3 * _GIB,
    admission=AdmissionRule.CHUNK,
    prefix_cache="hashed_blocks",
    offload_min_priority=0,
    cpu_kv_ratio=2.0,
    native_policy="fcfs",
)

#: SGLang 0.5.x. ``page_size`` 1; ``chunked_prefill_size`` 8,192 on 35-160 GB GPUs and
#: ``mem_fraction_static`` 0.85 at TP4 (``sglang/srt/server_args.py``
#: ``_handle_gpu_memory_settings``); ``max_running_requests`` 2,048 (the floor of
#: ``model_runner.py``'s default). Admission per ``PrefillAdder`` (shared/engines/sglang-0.5.md §1)
#: with ``new_token_ratio`` starting at 0.7, decaying over 600 decode steps to 0.7 x 0.14, and
#: reset by a retraction (``SGLANG_INIT_NEW_TOKEN_RATIO``, ``..._MIN_NEW_TOKEN_RATIO_FACTOR``,
#: ``..._NEW_TOKEN_RATIO_DECAY_STEPS``). Radix cache with LRU eviction; HiCache host tier
#: ``hicache_ratio`` 2.0. Native policy ``lpm`` (longest prefix match).
SIM_SGLANG = EngineProfile(
    name="sim:sglang",
    block_size_tokens=1,
    token_budget=8192,
    token_budget_large_gpu=8192,
    max_num_seqs=2048,
    max_num_seqs_large_gpu=2048,
    kv_memory="static",
    memory_fraction=0.85,
    activation_reserve_bytes=0,
    admission=AdmissionRule.RESERVE_RATIO,
    prefix_cache="radix",
    offload_min_priority=0,
    cpu_kv_ratio=2.0,
    native_policy="lpm",
    reserve_ratio_init=0.7,
    reserve_ratio_min=0.7 * 0.14,
    reserve_ratio_decay=(0.7 - 0.7 * 0.14) / 600,
)

#: TensorRT-LLM 1.2 (PyTorch backend, LLM API). ``tokens_per_block`` 32, ``max_num_tokens`` 8,192
#: and ``max_batch_size`` 2,048 (``TorchLlmArgs`` defaults); chunked context enabled
#: (``enable_chunked_prefill=True``, not the default, because Azure prompts exceed 8,192 tokens);
#: KV = ``free_gpu_memory_fraction`` 0.9 of what is free after weights and activations
#: (``KvCacheConfig``). ``GUARANTEED_NO_EVICT`` capacity scheduling (the default) reserves each
#: request's blocks to completion and never pauses. Block reuse on by default with prioritized
#: LRU (retention priority 0-100, default 35); the host cache drops blocks below priority 30
#: (shared/engines/trtllm-1.2.md §1.2, §2.2).
SIM_TRTLLM = EngineProfile(
    name="sim:trtllm",
    block_size_tokens=32,
    token_budget=8192,
    token_budget_large_gpu=8192,
    max_num_seqs=2048,
    max_num_seqs_large_gpu=2048,
    kv_memory="free",
    memory_fraction=0.9,
    activation_reserve_bytes=3 * _GIB,
    admission=AdmissionRule.RESERVE_MAX,
    prefix_cache="block_reuse",
    offload_min_priority=30,
    cpu_kv_ratio=2.0,
    native_policy="fcfs",
)

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (SIM_VLLM, SIM_SGLANG, SIM_TRTLLM)}


def get_profile(name: str) -> EngineProfile:
    """Look up a profile by engine id.

    Raises:
        KeyError: unknown id; the message lists the known ones.
    """
    if name not in PROFILES:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(sorted(PROFILES))}")
    return PROFILES[name]
