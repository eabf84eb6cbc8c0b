"""The roofline step-time model: regimes, TP scaling and KV capacity, checked by hand arithmetic."""

from __future__ import annotations

import pytest

from superinfer.sim.config import kv_capacity_blocks
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.profiles import SIM_VLLM
from superinfer.sim.step_time import (
    LAYER_SMALL_KERNELS_S,
    BatchShape,
    RooflineStepTime,
)

A100 = get_gpu("a100-80gb")
L70 = get_model("llama-3.1-70b")
L8 = get_model("llama-3.1-8b")


def test_parameter_counts_match_the_published_sizes() -> None:
    assert L8.num_params == 8_030_261_248  # Llama-3.1-8B: 8.03B
    assert L70.num_params == 70_553_706_496  # Llama-3.1-70B: 70.6B


def test_one_token_streams_the_weights() -> None:
    model = RooflineStepTime(L8, A100, tp=1)
    bw = A100.peak_mem_bw_bytes_s * A100.memory_efficiency
    moved = 0
    for k, n in model.gemms:
        moved += 2 * (k * n + k + n)
    expected = L8.num_layers * (moved / bw + LAYER_SMALL_KERNELS_S)
    assert model.linear_s(1) == pytest.approx(expected, rel=1e-12)


def test_large_batches_are_compute_bound_and_tp_splits_them() -> None:
    tp1, tp4 = RooflineStepTime(L70, A100, tp=1), RooflineStepTime(L70, A100, tp=4)
    flops = A100.peak_flops * A100.compute_efficiency
    per_layer = sum(2 * 8192 * k * n for k, n in tp1.gemms) / flops
    assert tp1.linear_s(8192) == pytest.approx(L70.num_layers * (per_layer + LAYER_SMALL_KERNELS_S))
    gemm1 = tp1.linear_s(8192) - L70.num_layers * LAYER_SMALL_KERNELS_S
    gemm4 = tp4.linear_s(8192) - L70.num_layers * LAYER_SMALL_KERNELS_S
    assert gemm4 == pytest.approx(gemm1 / 4, rel=1e-9)


def test_allreduce_only_with_tensor_parallelism() -> None:
    assert RooflineStepTime(L70, A100, tp=1).allreduce_s(100) == 0.0
    tp4 = RooflineStepTime(L70, A100, tp=4)
    one = A100.allreduce_latency_s + 2 * 100 * 8192 * (2 * 3 / 4) / A100.allreduce_bus_bw_bytes_s
    assert tp4.allreduce_s(100) == pytest.approx(2 * 80 * one)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("batch", [1, 7, 64, 256])
def test_decode_coefficients_reproduce_the_step_time(tp: int, batch: int) -> None:
    model = RooflineStepTime(L70, A100, tp=tp)
    kv_tokens = batch * 1500
    shape = BatchShape(batch, batch, 0.0, 0, kv_tokens, batch)
    a, b = model.decode_coefficients(batch)
    assert a + b * kv_tokens == pytest.approx(model.step_time_s(shape), rel=1e-12)


def test_tp_must_divide_kv_heads() -> None:
    with pytest.raises(ValueError, match="divide num_kv_heads=8"):
        RooflineStepTime(L70, A100, tp=3)


def test_kv_capacity_of_70b_tp4_on_a100() -> None:
    free = 81920 * 2**20 * 0.9 - 70_553_706_496 * 2 / 4 - 3 * 2**30
    block = 2 * 80 * 8 * 128 * 2 / 4 * 16  # K and V, 80 layers, 2 KV heads per GPU, 16 tokens
    assert kv_capacity_blocks(SIM_VLLM, L70, A100, 4) == int(free // block) == 29_610


def test_no_room_for_kv_is_an_error() -> None:
    with pytest.raises(ValueError, match="leaves no KV memory"):
        kv_capacity_blocks(SIM_VLLM, L70, A100, 1)
