"""quantize_kv / dequantize_kv: Triton kernels against the pure-torch references.

Tolerances (``(dtype, what, bound)``):
    * codes, scales, zero points: identical to the reference under the interpreter (both compute
      the same fp32 operations in the same order); on a GPU a code may differ by 1 (fp32 division
      is not correctly rounded there).
    * dequantized values: identical for fp16 / fp32 outputs; bf16 within one bf16 ulp (<= 2**-7
      relative: the interpreter truncates fp32 -> bf16, torch rounds to nearest).
    * reconstruction error of the reference: |x - x_hat| <= 0.63 * scale + 2**-11 * |zero| + 1e-5
      (half a step, the fp16 rounding of the scale stretching the top step by at most
      qmax * 2**-11 <= 0.125 of a step, and the fp16 rounding of the zero point).
"""

from __future__ import annotations

import pytest
import torch

from superinfer.kernels import (
    KVKind,
    dequantize_kv,
    dequantize_kv_ref,
    quantize_kv,
    quantize_kv_ref,
)
from superinfer.kernels.dequantize_kv import unpack_codes

from .conftest import DEVICE

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (num_tokens, num_kv_heads, head_dim, group_size): odd token counts for values; head_dim 80 is
# not a power of two (padded channel blocks in the key kernel).
SHAPES = ((32, 1, 64, 32), (48, 3, 80, 16), (37, 2, 64, 64), (1, 1, 16, 16))


def _make(shape: tuple[int, int, int], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * 2
    x[:, :, 3] *= 20  # an outlier channel, as real keys have
    return x.to(dtype).to(DEVICE)


def _cases() -> list[tuple[KVKind, int, tuple[int, int, int, int], torch.dtype]]:
    cases = []
    for kind in KVKind:
        for bits in (8, 4):
            for shape in SHAPES:
                tokens, _, head_dim, group = shape
                if kind is KVKind.KEY and tokens % group:
                    continue  # keys need whole groups; the odd tail stays unquantized
                if kind is KVKind.VALUE and head_dim % group:
                    continue
                for dtype in DTYPES:
                    cases.append((kind, bits, shape, dtype))
    return cases


@pytest.mark.parametrize(("kind", "bits", "shape", "dtype"), _cases(), ids=str)
def test_quantize_matches_reference(
    kind: KVKind, bits: int, shape: tuple, dtype: torch.dtype
) -> None:
    tokens, heads, head_dim, group = shape
    x = _make((tokens, heads, head_dim), dtype)
    got = quantize_kv(x, kind, bits, group, backend="triton")
    want = quantize_kv_ref(x, kind, bits, group)
    assert got.codes.shape == (tokens, heads, head_dim * bits // 8)
    assert got.scale.shape == want.scale.shape and got.scale.dtype == torch.float16
    if DEVICE.type == "cpu":
        assert torch.equal(got.codes, want.codes)
        assert torch.equal(got.scale, want.scale)
        assert torch.equal(got.zero_point, want.zero_point)
    else:
        diff = unpack_codes(got.codes, bits).int() - unpack_codes(want.codes, bits).int()
        assert diff.abs().max() <= 1
        torch.testing.assert_close(got.scale, want.scale, atol=0, rtol=1e-3)


@pytest.mark.parametrize(("kind", "bits", "shape", "dtype"), _cases(), ids=str)
def test_dequantize_matches_reference(
    kind: KVKind, bits: int, shape: tuple, dtype: torch.dtype
) -> None:
    tokens, heads, head_dim, group = shape
    q = quantize_kv_ref(_make((tokens, heads, head_dim), dtype, seed=1), kind, bits, group)
    got = dequantize_kv(q, dtype, backend="triton")
    want = dequantize_kv_ref(q, dtype)
    assert got.shape == (tokens, heads, head_dim) and got.dtype == dtype
    if dtype is torch.bfloat16 or DEVICE.type != "cpu":
        torch.testing.assert_close(got, want, atol=1e-6, rtol=2**-7)
    else:
        assert torch.equal(got, want)


@pytest.mark.parametrize(("kind", "bits", "shape", "dtype"), _cases(), ids=str)
def test_reference_reconstruction_error_is_bounded(
    kind: KVKind, bits: int, shape: tuple, dtype: torch.dtype
) -> None:
    tokens, heads, head_dim, group = shape
    x = _make((tokens, heads, head_dim), dtype, seed=2).float()
    q = quantize_kv_ref(x, kind, bits, group)
    err = (dequantize_kv_ref(q, torch.float32) - x).abs()
    if kind is KVKind.KEY:
        s = q.scale.float().repeat_interleave(group, dim=0)
        z = q.zero_point.float().repeat_interleave(group, dim=0)
    else:
        s = q.scale.float().repeat_interleave(group, dim=2)
        z = q.zero_point.float().repeat_interleave(group, dim=2)
    assert bool((err <= 0.63 * s + 2**-11 * z.abs() + 1e-5).all())


def test_int4_codes_of_a_hand_computed_key_group() -> None:
    # One head, two channels, one group of two tokens.
    # channel 0: {0, 15} -> scale 1, codes 0, 15; channel 1: {10, 0} -> scale fp16(10/15) =
    # 0.66650390625, codes floor(10 / 0.6665 + 0.5) = 15 and 0. Byte = channel0 | channel1 << 4.
    x = torch.tensor([[[0.0, 10.0]], [[15.0, 0.0]]], device=DEVICE)
    q = quantize_kv(x, "key", 4, 2, backend="triton")
    assert q.codes.flatten().tolist() == [0 | 15 << 4, 15 | 0 << 4]
    assert q.scale.flatten().tolist() == [1.0, 0.66650390625]
    assert q.zero_point.flatten().tolist() == [0.0, 0.0]
    assert dequantize_kv(q, torch.float32, backend="triton").flatten().tolist() == [
        0.0, 0.66650390625 * 15, 15.0, 0.0,
    ]  # fmt: skip


def test_constant_group_reconstructs_exactly() -> None:
    x = torch.full((16, 1, 16), 0.5, device=DEVICE)
    for kind in KVKind:
        q = quantize_kv(x, kind, 4, 16, backend="triton")
        assert torch.equal(dequantize_kv(q, torch.float32, backend="triton"), x)


@pytest.mark.parametrize(
    ("x", "kind", "bits", "group", "match"),
    [
        (torch.zeros(37, 1, 64), "key", 8, 32, "multiple of it, got 37"),
        (torch.zeros(32, 1, 48), "value", 8, 32, "not a multiple"),
        (torch.zeros(32, 1, 64), "key", 3, 32, "bits must be"),
        (torch.zeros(32, 1, 64), "key", 8, 24, "power of two"),
        (torch.zeros(32, 2, 64)[:, :1], "key", 8, 32, "contiguous"),
        (torch.zeros(32, 1, 64, dtype=torch.int32), "key", 8, 32, "must be one of"),
        (torch.zeros(32, 64), "key", 8, 32, "3 dims"),
    ],
)
def test_bad_arguments_raise_one_clear_error(
    x: torch.Tensor, kind: str, bits: int, group: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        quantize_kv(x.to(DEVICE), kind, bits, group, backend="triton")
