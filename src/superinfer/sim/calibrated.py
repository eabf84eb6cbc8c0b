"""The step-time model the simulator uses: every term fitted to measured GPU timings.

``calibration.json`` beside this module holds the parameters ``superinfer calibrate`` fitted to
Vidur's measured kernel timings (``shared/data/profiling``); ``harness/offline/calibrate.py``
documents each fitted form and ``results/calibration/`` its error. Per layer, for a step of ``T``
tokens::

    GEMMs (QKV, O, gate+up, down)   roofline with per-token-range efficiencies, per GEMM shape
                                     (FP8 weights: less half the FP16 weight read the fitted
                                     per-shape constant holds, :func:`narrow_weight_read`)
    small kernels                    bytes / B + c   (2 RMSNorms, RoPE, SiLU-and-mul, add)
    attention                        decode  c + c_seq B + KV bytes / B_attn
                                     prefill c + 4 q d sum n (ctx + n) / F_attn + c_tok sum n
    2 all-reduces (TP > 1)           alpha + bytes / beta

plus the LM head for the sampled rows and the engine's CPU overhead per step. Where no data
exists the model extrapolates and says how: GPUs without measurements reuse the nearest measured
one with their bandwidth (and, for attention, FLOP/s) scaled by the peak ratio (:data:`GPU_BASIS`).
"""

from __future__ import annotations

import bisect
import json
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from superinfer.sim.hardware import GPUS, GPUSpec, ModelSpec
from superinfer.sim.step_time import BatchShape, RooflineStepTime

__all__ = [
    "GPU_BASIS",
    "CalibratedStepTime",
    "default_step_time",
    "load_params",
    "narrow_weight_read",
]

#: Measured GPU whose fitted parameters each simulated GPU uses.
GPU_BASIS = {"a100-80gb": "a100", "h100-80gb": "h100", "h200": "h100", "gh200": "h100"}
_MEASURED_SPEC = {"a100": "a100-80gb", "h100": "h100-80gb"}
#: Dense FP8 over FP16/BF16 tensor-core peak: 2x on Hopper (H100/H200 datasheets: 1,979 vs 989
#: TFLOPS dense); A100 has no FP8 tensor cores, so FP8 weights there only halve the bytes read
#: (weight-only FP8, as vLLM's Marlin FP8 path).
FP8_FLOPS_MULT = {"a100-80gb": 1.0, "h100-80gb": 2.0, "h200": 2.0, "gh200": 2.0}
#: CPU-overhead fits per model size (the only Llama rows in the measured file).
_CPU_OVERHEAD_MODEL = {"llama-3.1-8b": "meta-llama/Llama-2-7b-hf|1",
                       "llama-3.1-70b": "meta-llama/Llama-2-70b-hf|4"}  # fmt: skip


@cache
def load_params() -> dict[str, Any]:
    """The packaged calibration parameters (``sim/calibration.json``)."""
    text = resources.files("superinfer.sim").joinpath("calibration.json").read_text()
    params: dict[str, Any] = json.loads(text)
    return params


def _gemm(p: dict[str, Any], edges: list[int], tokens: int, k: int, n: int,
          wbytes: float = 2.0, flops_mult: float = 1.0) -> float:  # fmt: skip
    """One GEMM ``[tokens x k] . [k x n]``, s: ``wbytes`` bytes per weight (and per activation
    element when below 2, as FP8 GEMMs quantize their input), ``flops_mult`` x the fitted FLOP/s."""
    b = bisect.bisect_right(edges, tokens) - 1
    flops = 2.0 * tokens * k * n
    act = min(wbytes, 2.0) if flops_mult > 1.0 else 2.0
    if wbytes == 2.0:
        moved = 2.0 * (k * n + tokens * k + tokens * n)
    else:
        moved = wbytes * k * n + act * tokens * k + 2.0 * tokens * n
    return float(max(flops / (p["flops_s"][b] * flops_mult), moved / p["bytes_s"][b])
                 + p["overhead_s"])  # fmt: skip


def narrow_weight_read(p: dict[str, Any], k: int, n: int, measured: GPUSpec,
                       wbytes: float) -> dict[str, Any]:  # fmt: skip
    """A GEMM fit ``p`` of a ``K x N`` FP16 weight, for weights of ``wbytes`` (< 2) bytes.

    The fitted form (``harness/offline/calibrate.py``) is ``max(flops / F_b, bytes / B_b) + c``
    with ``c`` per shape. At few tokens a large shape's time is its weight read, and the fit
    put that read into ``c``: on the H100 fits of ``calibration.json`` (Vidur's measured FP16
    GEMMs), ``c`` is 166.8 us for ``mlp_down_proj`` 28672x8192, 157.3 us for ``mlp_up_proj``
    8192x28672 and 213.6 us for 8192x57344, where reading the FP16 weights at the H100's
    3.35 TB/s peak takes 140.2, 140.2 and 280.5 us (``B_b`` there, unconstrained by the data,
    is fitted at 4.1 TB/s or more in every token range up to 256). ``_gemm`` halves the weight
    bytes of FP8 weights in the roofline term only, so without this the four GEMMs of a
    Llama-3.1-70B layer (TP1, H100) at 16-26 tokens took 0.87-0.88x their FP16 time in FP8
    (0.53x with it; issue 19: TensorRT-LLM's 70B FP8 runs on one H100 were 27-34 % under their
    published throughput). The part of ``c`` that is the FP16 weight read at ``measured``'s peak
    bandwidth (at most ``c``) shrinks by the ratio of weight bytes; the rest (launch, tails)
    stays.

    Args:
        p: the fit (``flops_s``, ``bytes_s``, ``overhead_s``).
        k, n: the weight's shape.
        measured: the GPU the fit was measured on.
        wbytes: bytes per weight, < 2.

    Returns:
        A copy of ``p`` with ``overhead_s`` reduced.
    """
    read = min(float(p["overhead_s"]), 2.0 * k * n / measured.peak_mem_bw_bytes_s)
    return {**p, "overhead_s": float(p["overhead_s"]) - read * (1.0 - wbytes / 2.0)}


class CalibratedStepTime:
    """Step time of one model on one GPU type at one tensor-parallel degree, from fitted terms.

    Same interface as :class:`~superinfer.sim.step_time.RooflineStepTime`.

    Args:
        model: the model.
        gpu: the GPU.
        tp: tensor-parallel degree; must divide the KV heads.
        params: calibration parameters (default: the packaged ones).
        weight_bytes: bytes per weight (2: FP16/BF16, 1: FP8); FP8 GEMMs read half the weight
            bytes (in the roofline term and in the weight read the fitted constant holds:
            :func:`narrow_weight_read`) and, on GPUs with FP8 tensor cores
            (:data:`FP8_FLOPS_MULT`), run at twice the fitted FLOP/s.
        kv_bytes: bytes per KV element (2: FP16, 1: FP8): decode attention reads that many;
            FP8 KV on FP8 tensor cores also doubles the prefill attention FLOP/s (FP8 FMHA).

    Raises:
        ValueError: a bad TP degree, or a GPU with no calibration basis.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int,
                 params: dict[str, Any] | None = None, weight_bytes: float = 2.0,
                 kv_bytes: float = 2.0) -> None:  # fmt: skip
        if tp < 1 or model.num_kv_heads % tp:
            raise ValueError(f"tp={tp} must be >= 1 and divide num_kv_heads={model.num_kv_heads}")
        if gpu.name not in GPU_BASIS:
            raise ValueError(f"no calibration basis for GPU {gpu.name!r}")
        params = params or load_params()
        self.model, self.gpu, self.tp = model, gpu, tp
        fp8 = FP8_FLOPS_MULT.get(gpu.name, 1.0)
        self.wbytes, self.gemm_flops_mult = weight_bytes, fp8 if weight_bytes < 2 else 1.0
        self.attn_flops_mult = fp8 if kv_bytes < 2 else 1.0
        basis = GPU_BASIS[gpu.name]
        measured = GPUS[_MEASURED_SPEC[basis]]
        self.bw_scale = gpu.peak_mem_bw_bytes_s / measured.peak_mem_bw_bytes_s
        self.edges = list(params["token_edges"])
        h, d, ffn = model.hidden_size, model.head_dim, model.intermediate_size
        q, kv = model.num_q_heads, model.num_kv_heads
        shapes = {
            "attn_pre_proj": (h, (q + 2 * kv) * d // tp),
            "attn_post_proj": (q * d // tp, h),
            "mlp_up_proj": (h, 2 * ffn // tp),
            "mlp_down_proj": (ffn // tp, h),
        }
        self.gemms = []
        self.gemm_sources: dict[str, str] = {}
        for op, (k, n) in shapes.items():
            entry = params["gemm"][basis][op]
            fit = entry["by_shape"].get(f"{k}x{n}")
            self.gemm_sources[op] = "shape" if fit else "pooled"
            gemm = self._scaled(fit or entry["pooled"])
            if weight_bytes < 2.0:
                gemm = narrow_weight_read(gemm, k, n, measured, weight_bytes)
            self.gemms.append((gemm, k, n))
        self.lm_head = (self._scaled(params["gemm"][basis]["mlp_up_proj"]["pooled"]), h,
                        model.vocab_size // tp)  # fmt: skip
        small = params["small"][basis]
        self.small = [(p["bytes_s"] * self.bw_scale, p["overhead_s"]) for p in small.values()]
        self.small_bytes_per_token = (
            2 * 2 * h,  # input RMSNorm: read + write
            2 * 2 * h,  # post-attention RMSNorm
            2 * 2 * (q + kv) * d / tp,  # RoPE on q and k
            2 * 3 * ffn / tp,  # SiLU-and-mul: read gate and up, write
            2 * 3 * h,  # residual add
        )
        att = params["attention"]
        a100 = GPUS[_MEASURED_SPEC[att["measured_on"]]]
        self.attn_flops_scale = gpu.peak_flops / a100.peak_flops
        self.attn_bw_scale = gpu.peak_mem_bw_bytes_s / a100.peak_mem_bw_bytes_s
        self.attn = att
        self.q_heads_gpu = q // tp
        self.kv_bytes_per_token_layer = 2.0 * (kv // tp) * d * kv_bytes
        ar = params["allreduce"][basis]
        self.allreduce = ar.get(str(tp)) if tp > 1 else None
        if tp > 1 and self.allreduce is None:
            nearest = min(ar, key=lambda t: abs(int(t) - tp))
            self.allreduce = ar[nearest]
        cpu = params["cpu_overhead"][
            _CPU_OVERHEAD_MODEL.get(model.name, _CPU_OVERHEAD_MODEL["llama-3.1-70b"])
        ]
        self.cpu_intercept_s = float(cpu["intercept_s"])
        self.cpu_per_seq_s = float(cpu["per_seq_s"])

    def _scaled(self, p: dict[str, Any]) -> dict[str, Any]:
        return {**p, "bytes_s": [b * self.bw_scale for b in p["bytes_s"]]}

    # -- pieces ---------------------------------------------------------------------------------

    @lru_cache(maxsize=4096)  # noqa: B019 - bounded, and one model object lives per simulation
    def layer_token_s(self, tokens: int) -> float:
        """One layer's GEMMs, small kernels and all-reduces for ``tokens`` tokens, s."""
        w, m = self.wbytes, self.gemm_flops_mult
        total: float = sum(_gemm(p, self.edges, tokens, k, n, w, m) for p, k, n in self.gemms)
        small = zip(self.small, self.small_bytes_per_token, strict=True)
        total += sum(tokens * b / bw + c for (bw, c), b in small)
        if self.allreduce is not None:
            total += 2 * (self.allreduce["latency_s"] + 2.0 * tokens * self.model.hidden_size
                          / self.allreduce["bytes_s"])  # fmt: skip
        return total

    def _lm_head_s(self, samples: int) -> float:
        if samples == 0:
            return 0.0
        p, k, n = self.lm_head
        return _gemm(p, self.edges, samples, k, n)

    def _decode_attn_coefficients(self, num_decode: int) -> tuple[float, float]:
        d = self.attn["decode"]
        a = d["overhead_s"] + d["per_seq_s"] * num_decode
        b = self.kv_bytes_per_token_layer / (d["bytes_s"] * self.attn_bw_scale)
        return a, b

    def _prefill_attn_s(self, shape: BatchShape) -> float:
        if shape.prefill_tokens == 0:
            return 0.0
        p = self.attn["prefill"]
        flops = 4.0 * self.q_heads_gpu * self.model.head_dim * shape.prefill_full_pairs
        f = p["flops_s"] * self.attn_flops_scale * self.attn_flops_mult
        return float(p["overhead_s"] + flops / f
                + p["per_token_s"] * shape.prefill_tokens)  # fmt: skip

    def overhead_s(self, num_seqs: int) -> float:
        """Per-step CPU overhead, s."""
        return self.cpu_intercept_s + self.cpu_per_seq_s * num_seqs

    # -- whole steps ----------------------------------------------------------------------------

    def step_time_s(self, shape: BatchShape) -> float:
        """Duration of one step running ``shape``, s."""
        if shape.num_tokens == 0:
            return 0.0
        num_decode = shape.num_seqs - shape.num_prefill_seqs
        layer = self.layer_token_s(shape.num_tokens) + self._prefill_attn_s(shape)
        if shape.decode_kv_tokens:
            a, b = self._decode_attn_coefficients(num_decode)
            layer += a + b * shape.decode_kv_tokens
        return (self.model.num_layers * layer + self._lm_head_s(shape.num_samples)
                + self.overhead_s(shape.num_seqs))  # fmt: skip

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        """Step time of a pure-decode batch as ``a + b * decode_kv_tokens``."""
        a_attn, b_attn = self._decode_attn_coefficients(num_seqs)
        layers = self.model.num_layers
        a = (layers * (self.layer_token_s(num_seqs) + a_attn) + self._lm_head_s(num_seqs)
             + self.overhead_s(num_seqs))  # fmt: skip
        return a, layers * b_attn


def default_step_time(
    model: ModelSpec, gpu: GPUSpec, tp: int, *, weight_bytes: float = 2.0, kv_bytes: float = 2.0
) -> CalibratedStepTime | RooflineStepTime:
    """The calibrated model where a calibration basis exists for ``gpu``, else the roofline
    (which models FP8 KV but not FP8 weights)."""
    if gpu.name in GPU_BASIS:
        return CalibratedStepTime(model, gpu, tp, weight_bytes=weight_bytes, kv_bytes=kv_bytes)
    return RooflineStepTime(model, gpu, tp, kv_bytes_per_elem=kv_bytes)
