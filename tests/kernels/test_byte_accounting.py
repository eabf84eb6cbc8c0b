"""The byte accounting the planner and simulator use equals the bytes the kernels store."""

from __future__ import annotations

import pytest
import torch

from superinfer.kernels import KVKind, pack_paged_kv, quantize_kv
from superinfer.policy_core.kv_bytes import kv_page_bytes, kv_sequence_bytes
from superinfer.policy_core.types import KVPrecision

PRECISION = {8: KVPrecision.INT8, 4: KVPrecision.INT4}


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("num_tokens", [1, 31, 32, 100])
def test_sequence_bytes_equal_stored_tensor_bytes(bits: int, group: int, num_tokens: int) -> None:
    heads, head_dim = 3, 64
    x = torch.randn(num_tokens, heads, head_dim)
    n_q = num_tokens // group * group
    stored = (num_tokens - n_q) * heads * head_dim * 2 * 2  # K and V residual in fp16
    stored += quantize_kv(x[:n_q], KVKind.KEY, bits, group, backend="ref").nbytes
    stored += quantize_kv(x[:n_q], KVKind.VALUE, bits, group, backend="ref").nbytes
    assert stored == kv_sequence_bytes(num_tokens, 1, heads, head_dim, PRECISION[bits], group)


@pytest.mark.parametrize("bits", [16, 8, 4])
def test_page_bytes_equal_pool_bytes_per_page(bits: int) -> None:
    page, group, heads, head_dim = 32, 16, 2, 64
    x = torch.randn(3 * page, heads, head_dim)
    cache = pack_paged_kv([x], [x], [bits], page_size=page, group_size=group, backend="ref")
    pool = cache.pools[bits]
    tensors = [pool.k, pool.v, pool.k_scale, pool.k_zero_point, pool.v_scale, pool.v_zero_point]
    per_page = sum(t.numel() * t.element_size() for t in tensors if t is not None) // pool.num_pages
    precision = PRECISION.get(bits, KVPrecision.FP16)
    assert per_page == kv_page_bytes(page, 1, heads, head_dim, precision, group)
