"""Engine profiles: the mechanics of each simulated engine, as declarative data.

A profile carries what an engine fixes regardless of policy: KV page size, step limits, memory
use and its native scheduling policy. A policy plugged in replaces only decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.sim.hardware import GPUSpec

__all__ = ["PROFILES", "EngineProfile", "get_profile"]


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One engine's mechanics.

    Attributes:
        name: engine id, e.g. ``"sim:vllm"``.
        block_size_tokens: tokens per KV page.
        token_budget: ``max_num_batched_tokens`` on A100-class GPUs.
        token_budget_large_gpu: the same on GPUs with >= 70 GiB that are not A100s.
        max_num_seqs: most running requests on A100-class GPUs.
        max_num_seqs_large_gpu: the same on larger GPUs.
        gpu_memory_utilization: fraction of each GPU's memory the engine may use.
        activation_reserve_bytes: per-GPU memory kept for activations and CUDA graphs.
        native_policy: the engine's own scheduling policy, by registered name.
    """

    name: str
    block_size_tokens: int
    token_budget: int
    token_budget_large_gpu: int
    max_num_seqs: int
    max_num_seqs_large_gpu: int
    gpu_memory_utilization: float
    activation_reserve_bytes: int
    native_policy: str

    def limits(self, gpu: GPUSpec) -> tuple[int, int]:
        """``(token_budget, max_num_seqs)`` on ``gpu``."""
        if gpu.memory_bytes >= 70 * 1024**3 and not gpu.name.startswith("a100"):
            return self.token_budget_large_gpu, self.max_num_seqs_large_gpu
        return self.token_budget, self.max_num_seqs


#: vLLM v1 serving defaults (``vllm/engine/arg_utils.py`` ``EngineArgs.get_batch_defaults``,
#: v0.10-0.11, OpenAI server context): 2048 batched tokens and 256 sequences, or 8192 and 1024 on
#: GPUs with >= 70 GiB that are not A100s; ``block_size`` 16 (``vllm/config/cache.py``);
#: ``gpu_memory_utilization`` 0.9. The activation reserve (3 GiB per GPU) is our estimate of what
#: vLLM's profiling run sets aside for a 70B model at TP4 with CUDA graphs.
SIM_VLLM = EngineProfile(
    name="sim:vllm",
    block_size_tokens=16,
    token_budget=2048,
    token_budget_large_gpu=8192,
    max_num_seqs=256,
    max_num_seqs_large_gpu=1024,
    gpu_memory_utilization=0.9,
    activation_reserve_bytes=3 * 1024**3,
    native_policy="fcfs",
)

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (SIM_VLLM,)}


def get_profile(name: str) -> EngineProfile:
    """Look up a profile by engine id.

    Raises:
        KeyError: unknown id; the message lists the known ones.
    """
    if name not in PROFILES:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(sorted(PROFILES))}")
    return PROFILES[name]
