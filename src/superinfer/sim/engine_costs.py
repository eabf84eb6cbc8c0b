"""Per-engine step costs: what one engine's step costs on top of the shared kernel model.

The calibrated kernel model (``sim.calibrated``) is fitted to Vidur's kernel timings, which are
one kernel stack's. Engines differ on top of it, and this module adds those terms::

    gpu_s  = kernel_scale[engine, dtype] x (calibrated GPU time of the step's kernels)
    cpu_s  = c0 + c_seq x running requests      (scheduling, input preparation, sampling,
                                                 output processing; / K on decode-only steps
                                                 under K-step multi-step scheduling)
    step_s = gpu_s + cpu_s                      (no overlap: the GPU waits for the CPU)
           = gpu_s + max(0, cpu_s - gpu_fixed)  (an overlap scheduler prepares step N+1 while
                                                 the GPU runs step N; ``gpu_fixed`` is the GPU
                                                 time without the decode-KV reads, so a decode
                                                 step stays linear in the KV tokens read)

``engine_costs.json`` beside this module holds the fitted values (``superinfer calibrate --engine
published``, ``harness/offline/calibrate_published.py``; ``results/fidelity/published_report.md``
gives each fit's rows and error): ``kernel_scale`` per engine and weight dtype, fitted on the
fit half of the published max-load throughput rows, and ``cpu`` per engine version, fitted on
the fit half of the published per-iteration schedule times (WukLab, vLLM 0.5.4 and SGLang
0.2.13). A profile names which it uses (``EngineProfile.kernel_key``, ``cpu_key``); a key absent
from the file falls back to 1.0 (kernels) or to the calibrated model's own CPU overhead (Vidur's
measured sarathi-serve overheads, ``cpu_key == "vidur"``); ``cpu_key == "none"`` charges no CPU
time (an engine whose scheduling is taken as fully hidden).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from superinfer.sim.calibrated import default_step_time
from superinfer.sim.config import SimConfig, StepTimeModel, dtype_bytes
from superinfer.sim.profiles import EngineProfile
from superinfer.sim.step_time import BatchShape

__all__ = ["EngineStepTime", "engine_step_time", "load_costs"]


@cache
def load_costs() -> dict[str, Any]:
    """The packaged per-engine cost parameters (``sim/engine_costs.json``; empty if absent)."""
    path = resources.files("superinfer.sim").joinpath("engine_costs.json")
    if not path.is_file():
        return {}
    costs: dict[str, Any] = json.loads(path.read_text())
    return costs


class EngineStepTime:
    """An engine's step time: a base model's GPU time scaled by the engine's kernel efficiency,
    plus the engine's own per-step CPU time, hidden by its overlap scheduler if it has one.

    Args:
        base: the shared kernel model (``CalibratedStepTime`` or ``RooflineStepTime``); its
            ``overhead_s`` is taken out and replaced by the engine's CPU term.
        profile: the engine (``kernel_key``, ``cpu_key``, ``cpu_overlap``,
            ``cpu_decode_divisor``).
        weight_dtype: ``"fp16"`` or ``"fp8"``: which kernel scale applies.
        costs: cost parameters (default: the packaged ``engine_costs.json``).
    """

    def __init__(self, base: Any, profile: EngineProfile, weight_dtype: str = "fp16",
                 costs: dict[str, Any] | None = None) -> None:  # fmt: skip
        costs = load_costs() if costs is None else costs
        self.base, self.profile = base, profile
        scales = costs.get("kernel_scale", {}).get(profile.kernel_key, {})
        self.scale = float(scales.get(weight_dtype, scales.get("fp16", 1.0)))
        cpu = costs.get("cpu", {}).get(profile.cpu_key)
        self.cpu = (float(cpu["intercept_s"]), float(cpu["per_seq_s"])) if cpu else None
        if profile.cpu_key == "none":
            self.cpu = (0.0, 0.0)
        self.overlap = profile.cpu_overlap
        self.divisor = max(1, profile.cpu_decode_divisor)
        self.b_kv = base.decode_coefficients(1)[1] * self.scale  # s per decode KV token read

    def cpu_s(self, num_seqs: int, decode_only: bool) -> float:
        """The engine's CPU time of one step with ``num_seqs`` requests, s."""
        if self.cpu is None:
            t = float(self.base.overhead_s(num_seqs))
        else:
            t = self.cpu[0] + self.cpu[1] * num_seqs
        return t / self.divisor if decode_only else t

    def gpu_s(self, shape: BatchShape) -> float:
        """GPU time of the step's kernels, s."""
        base = self.base.step_time_s(shape) - self.base.overhead_s(shape.num_seqs)
        return float(base * self.scale)

    def step_time_s(self, shape: BatchShape) -> float:
        """Duration of one step running ``shape``, s."""
        if shape.num_tokens == 0:
            return 0.0
        gpu = self.gpu_s(shape)
        cpu = self.cpu_s(shape.num_seqs, shape.prefill_tokens == 0)
        if self.overlap:
            fixed = gpu - self.b_kv * shape.decode_kv_tokens
            return float(gpu + max(0.0, cpu - fixed))
        return float(gpu + cpu)

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        """Step time of a pure-decode batch as ``a + b * decode_kv_tokens`` (equals
        :meth:`step_time_s` for that batch)."""
        a, _ = self.base.decode_coefficients(num_seqs)
        a = (a - self.base.overhead_s(num_seqs)) * self.scale
        cpu = self.cpu_s(num_seqs, True)
        return (a + max(0.0, cpu - a) if self.overlap else a + cpu), self.b_kv


def engine_step_time(config: SimConfig, costs: dict[str, Any] | None = None) -> StepTimeModel:
    """The step-time model of ``config``'s engine, model, GPU, TP and dtypes."""
    base = default_step_time(config.model, config.gpu, config.tp,
                             weight_bytes=dtype_bytes(config.weight_dtype),
                             kv_bytes=dtype_bytes(config.kv_dtype))  # fmt: skip
    return EngineStepTime(base, config.profile, config.weight_dtype, costs)
