"""What a simulation takes and gives: :class:`SimConfig`, :class:`SimResult`, the step-time
interface the engine needs, and one replica's KV capacity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from superinfer.sim.hardware import GPUSpec, ModelSpec
from superinfer.sim.profiles import EngineProfile
from superinfer.sim.request import SimRequest
from superinfer.sim.step_time import BatchShape

__all__ = ["DTYPE_BYTES", "SimConfig", "SimResult", "StepTimeModel", "dtype_bytes",
           "kv_capacity_blocks", "repeatable"]  # fmt: skip

#: Bytes per element of the weight and KV dtypes the simulator models.
DTYPE_BYTES = {"fp16": 2.0, "bf16": 2.0, "fp8": 1.0}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype`` (:data:`DTYPE_BYTES`).

    Raises:
        ValueError: an unknown dtype; the message lists the known ones.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


class StepTimeModel(Protocol):
    """What the engine needs from a step-time model.

    A model may also set ``repeatable = False`` (``sim.hf_cpu.HFCPUStepTime`` with a spill term,
    ``sim.step_spread.SpreadStepTime``): :meth:`decode_coefficients` then does not time a run of
    decode steps exactly, and the simulator runs every step on its own."""

    def step_time_s(self, shape: BatchShape) -> float:
        """Duration of one step running ``shape``, s."""
        ...

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        """Step time of a pure-decode batch of ``num_seqs`` as ``(a, b)``: ``a + b x`` s for
        ``x`` KV tokens read (FP16-equivalent)."""
        ...


def repeatable(model: StepTimeModel) -> bool:
    """Whether ``model`` times a run of decode steps exactly by :meth:`StepTimeModel.
    decode_coefficients` (``a + b * KV``): true unless it sets ``repeatable = False``."""
    return bool(getattr(model, "repeatable", True))


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What to simulate.

    Attributes:
        profile: the engine's mechanics.
        model: the model served.
        gpu: the GPU type.
        tp: tensor-parallel degree (GPUs per replica).
        replicas: number of replicas behind the router.
        router: one of ``sim.routers.ROUTERS``: ``round_robin``; ``least_tokens`` (fewest
            outstanding tokens: prompt tokens not yet computed plus output caps not yet generated);
            ``slo_aware`` (requests with a TTFT target go where the fewest prompt tokens wait for
            prefill, the others by ``least_tokens``); ``cache_aware`` (the replica whose prefix
            cache holds the longest prefix of the prompt, balanced by load, as SGLang's gateway
            does: ``sim.routers.CACHE_THRESHOLD``).
        horizon_s: stop simulating at this instant; requests still live then fail with reason
            ``"simulation_horizon"``. ``None`` runs until every request ends.
        num_gpu_blocks_override: KV blocks per replica instead of the ones memory allows (as
            vLLM's ``--num-gpu-blocks-override``); for what-if runs and tests.
        cpu_kv_ratio: CPU-tier capacity as a multiple of HBM KV capacity; ``None`` takes the
            profile's, 0 disables the tier (no swap, no prefix offload).
        host_link_bytes_s: HBM<->CPU bandwidth per GPU and direction; ``None`` takes the GPU's.
        timeline_interval_s: a replica's KV use and queue lengths are sampled at the end of its
            first step at least this long after the previous sample.
        kv_group_size: quantization group size of INT8/INT4 KV (KIVI ``G``).
        weight_dtype: ``"fp16"``/``"bf16"`` or ``"fp8"`` weights (:data:`DTYPE_BYTES`): the
            weights' memory and the GEMMs' bytes and FLOP/s (``sim.calibrated``), and which kernel
            scale of the engine applies (``sim.engine_costs``).
        kv_dtype: the engine's KV cache dtype, ``"fp16"``/``"bf16"`` or ``"fp8"``: KV capacity
            and the bytes decode attention reads. A request's own KV precision
            (``superinfer_kv_precision``) is relative to it.
        record_token_gaps: keep every request's inter-token gaps (``SimRequest.token_gaps``),
            for ITL distributions as ``bench_serving`` computes them (off: memory per token).
    """

    profile: EngineProfile
    model: ModelSpec
    gpu: GPUSpec
    tp: int = 1
    replicas: int = 1
    router: str = "round_robin"
    horizon_s: float | None = None
    num_gpu_blocks_override: int | None = None
    cpu_kv_ratio: float | None = None
    host_link_bytes_s: float | None = None
    timeline_interval_s: float = 1.0
    kv_group_size: int = 32
    weight_dtype: str = "fp16"
    kv_dtype: str = "fp16"
    record_token_gaps: bool = False


def kv_capacity_blocks(profile: EngineProfile, model: ModelSpec, gpu: GPUSpec, tp: int,
                       weight_dtype: str = "fp16", kv_dtype: str = "fp16") -> int:  # fmt: skip
    """KV blocks one replica holds in HBM: the profile's KV bytes per GPU (weights at
    ``weight_dtype``) over one block's bytes on one GPU (``kv_dtype``, the block's tokens across
    all layers, ``kv_heads / tp`` heads).

    Raises:
        ValueError: the weights leave no room for KV, or an unknown dtype.
    """
    kv_bytes = dtype_bytes(kv_dtype)
    block_bytes = model.kv_bytes_per_token(kv_bytes) / tp * profile.block_size_tokens
    free = profile.kv_bytes_per_gpu(model, gpu, tp, dtype_bytes(weight_dtype))
    blocks = int(free // block_bytes)
    if blocks <= 0:
        raise ValueError(f"{model.name} at TP{tp} leaves no KV memory on {gpu.name}")
    return blocks


@dataclass(frozen=True, slots=True)
class SimResult:
    """Outcome of a simulation.

    Attributes:
        requests: every request, in workload order, in a terminal state.
        end_s: instant the last event ran, s.
        kv_block_bytes: bytes of one KV block across the replica's GPUs.
        peak_kv_blocks: per replica, the peak of HBM KV blocks in use (prefix cache included).
        peak_active_kv_blocks: per replica, the peak of HBM KV blocks requests use (cached
            prefixes nobody uses excluded).
        peak_class_kv_blocks: per replica, per SLO class, the peak of own blocks of that class.
        num_steps: engine steps run, all replicas.
        num_schedule_calls: scheduling decisions asked of the policy, all replicas.
        kv_capacity_blocks: KV blocks of one replica.
        timeline: samples ``(replica, time_s, used_hbm_blocks, num_waiting, num_running)``.
        counters: totals over replicas: ``prefill_tokens``, ``cached_tokens`` (prefill skipped by
            prefix hits), ``swap_out_bytes``, ``swap_in_bytes``, ``offloaded_blocks``,
            ``onboarded_blocks``, ``dropped_blocks``.
    """

    requests: tuple[SimRequest, ...]
    end_s: float
    kv_block_bytes: float
    peak_kv_blocks: tuple[int, ...]
    peak_active_kv_blocks: tuple[int, ...]
    peak_class_kv_blocks: tuple[dict[str, int], ...]
    num_steps: int
    num_schedule_calls: int
    kv_capacity_blocks: int
    timeline: tuple[tuple[int, float, int, int, int], ...] = ()
    counters: dict[str, int] | None = None
