"""Per-engine step costs (issue 19): kernel scale, CPU per step, overlap, FP8, versions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from superinfer.sim.calibrated import default_step_time
from superinfer.sim.config import kv_capacity_blocks
from superinfer.sim.engine_costs import EngineStepTime, load_costs
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.profiles import SIM_SGLANG, SIM_TRTLLM, SIM_VLLM
from superinfer.sim.step_time import BatchShape
from superinfer.sim.versions import VERSIONS, get_version

L8, A100, H100 = get_model("llama-3.1-8b"), get_gpu("a100-80gb"), get_gpu("h100-80gb")
COSTS = {"kernel_scale": {"k": {"fp16": 0.5, "fp8": 0.25}},
         "cpu": {"c": {"intercept_s": 0.004, "per_seq_s": 0.0001}}}  # fmt: skip
DECODE = BatchShape(num_tokens=8, num_samples=8, prefill_attn_pairs=0.0, prefill_kv_tokens=0,
                    decode_kv_tokens=8000.0, num_seqs=8)  # fmt: skip


def _model(overlap: bool, divisor: int = 1, dtype: str = "fp16") -> EngineStepTime:
    profile = replace(SIM_VLLM, kernel_key="k", cpu_key="c", cpu_overlap=overlap,
                      cpu_decode_divisor=divisor)  # fmt: skip
    return EngineStepTime(default_step_time(L8, A100, 1), profile, dtype, COSTS)


def test_sglang_native_policy_is_its_shipped_default_fcfs() -> None:
    assert SIM_SGLANG.native_policy == "fcfs"


def test_no_overlap_adds_the_cpu_time_to_the_scaled_gpu_time() -> None:
    base = default_step_time(L8, A100, 1)
    gpu = (base.step_time_s(DECODE) - base.overhead_s(8)) * 0.5
    assert _model(False).step_time_s(DECODE) == pytest.approx(gpu + 0.004 + 8 * 0.0001)
    assert _model(False, divisor=10).step_time_s(DECODE) == pytest.approx(gpu + 0.00048)


def test_overlap_hides_cpu_up_to_the_gpu_time() -> None:
    m = _model(True)
    gpu = m.gpu_s(DECODE)
    fixed = gpu - m.b_kv * DECODE.decode_kv_tokens
    assert m.step_time_s(DECODE) == pytest.approx(gpu + max(0.0, 0.0048 - fixed))
    assert m.step_time_s(DECODE) < _model(False).step_time_s(DECODE)


@pytest.mark.parametrize("overlap", [False, True])
def test_decode_coefficients_equal_the_step_time(overlap: bool) -> None:
    m = _model(overlap)
    a, b = m.decode_coefficients(8)
    assert a + b * DECODE.decode_kv_tokens == pytest.approx(m.step_time_s(DECODE))


def test_fp8_kernel_scale_applies_to_fp8_weights() -> None:
    assert _model(False, dtype="fp8").scale == 0.25
    assert _model(False).scale == 0.5


def test_fp8_weights_and_kv_on_hopper_are_faster_and_hold_twice_the_kv() -> None:
    fp16 = default_step_time(L8, H100, 1)
    fp8 = default_step_time(L8, H100, 1, weight_bytes=1.0, kv_bytes=1.0)
    assert fp8.step_time_s(DECODE) < fp16.step_time_s(DECODE)
    assert fp8.decode_coefficients(8)[1] == pytest.approx(fp16.decode_coefficients(8)[1] / 2)
    blocks16 = kv_capacity_blocks(SIM_TRTLLM, L8, H100, 1)
    blocks8 = kv_capacity_blocks(SIM_TRTLLM, L8, H100, 1, "fp8", "fp8")
    assert blocks8 > 2 * blocks16  # half the bytes per block, and FP8 weights free memory


def test_fp8_weights_halve_the_weight_read_in_each_gemms_fitted_constant() -> None:
    """Llama-3.1-70B at TP1 on H100: each GEMM's per-shape constant loses half its FP16 weight
    read at the H100's peak (capped at the constant); the roofline terms are the FP16 fit's."""
    from superinfer.sim.calibrated import CalibratedStepTime, narrow_weight_read

    l70 = get_model("llama-3.1-70b")
    fp16 = CalibratedStepTime(l70, H100, 1)
    fp8 = CalibratedStepTime(l70, H100, 1, weight_bytes=1.0)
    for (p16, k, n), (p8, k8, n8) in zip(fp16.gemms, fp8.gemms, strict=True):
        assert (k, n) == (k8, n8)
        read = min(p16["overhead_s"], 2.0 * k * n / 3.35e12)
        assert p8["overhead_s"] == pytest.approx(p16["overhead_s"] - read / 2, rel=1e-12)
        assert (p8["flops_s"], p8["bytes_s"]) == (p16["flops_s"], p16["bytes_s"])
    # by hand: a constant of 100 us over a 2 x 4096 x 4096 B = 33.6 MB read (10.0 us at peak)
    # keeps 95.0 us; one of 4 us (below the read) keeps 2 us; FP16 weights are left alone
    p = {"flops_s": [1.0], "bytes_s": [1.0], "overhead_s": 100e-6}
    assert narrow_weight_read(p, 4096, 4096, H100, 1.0)["overhead_s"] == pytest.approx(
        100e-6 - 2 * 4096 * 4096 / 3.35e12 / 2, rel=1e-12)  # fmt: skip
    assert narrow_weight_read({**p, "overhead_s": 4e-6}, 4096, 4096, H100, 1.0)[
        "overhead_s"] == pytest.approx(2e-6, rel=1e-12)  # fmt: skip
    assert narrow_weight_read(p, 4096, 4096, H100, 2.0)["overhead_s"] == 100e-6
    assert H100.peak_mem_bw_bytes_s == 3.35e12


def test_engines_differ_in_their_cost_terms() -> None:
    assert (SIM_VLLM.cpu_overlap, SIM_SGLANG.cpu_overlap, SIM_TRTLLM.cpu_overlap) == (
        False, True, True)  # fmt: skip
    assert len({SIM_VLLM.kernel_key, SIM_SGLANG.kernel_key, SIM_TRTLLM.kernel_key}) == 3
    assert not SIM_SGLANG.mixed_batches and SIM_TRTLLM.mixed_batches


def test_published_releases_carry_their_defaults() -> None:
    assert get_version("vllm-0.5.4").token_budget == 512
    assert get_version("vllm-0.6.0").cpu_decode_divisor == 10
    assert not get_version("sglang-0.3.0").cpu_overlap
    assert get_version("trtllm-0.17").memory_fraction == 0.95
    assert len(VERSIONS) == 9
    with pytest.raises(KeyError, match="known"):
        get_version("vllm-9")


def test_sim_sglang_costs_its_kernels_as_sglang_0_3_0_while_0_2_13_keeps_the_family_scale() -> None:
    # sim:sglang (0.5.23) takes the newest SGLang release's own fit (0.3.0's online TPOT scale
    # and CPU terms); the family scale, fitted on 0.2.13's forward times, stays 0.2.13's.
    costs = load_costs()
    assert (SIM_SGLANG.kernel_key, SIM_SGLANG.cpu_key) == ("sglang-0.3.0", "sglang-0.3.0")
    old, new = get_version("sglang-0.2.13"), get_version("sglang-0.3.0")
    assert (old.kernel_key, old.cpu_key) == ("sglang", "sglang-0.2.13")
    assert (new.kernel_key, new.cpu_key) == ("sglang-0.3.0", "sglang-0.3.0")
    scale = costs["kernel_scale"]
    assert round(scale["sglang-0.3.0"]["fp16"], 4) == 0.8852
    assert round(scale["sglang"]["fp16"], 4) == 1.4499
    assert round(scale["vllm"]["fp16"], 4) == 0.8764
    step = EngineStepTime(default_step_time(L8, H100, 1), SIM_SGLANG)
    assert step.scale == scale["sglang-0.3.0"]["fp16"]
    assert step.cpu == (costs["cpu"]["sglang-0.3.0"]["intercept_s"],
                        costs["cpu"]["sglang-0.3.0"]["per_seq_s"])  # fmt: skip
