"""paged_decode_attention: the Triton kernel against its reference, and the reference against
plain attention.

One batch mixes 16-, 8- and 4-bit sequences. Lengths cover a single token, a partial first key
group (all residual), exactly one group, a page boundary (P and P + 1 tokens), and a long odd
length spanning several pages and split-K partitions.

Tolerances, kernel vs reference (``dtype: atol, rtol``), from what the kernel rounds:
    fp32: 1e-5, 1e-5   fp32 dots without TF32; only summation order differs
    fp16: 2e-3, 2e-3   K, V and softmax weights rounded to fp16 for the dots (2**-11 relative)
    bf16: 2e-2, 2e-2   bf16 output (2**-8 relative, truncated by the interpreter)
"""

from __future__ import annotations

import pytest
import torch

from superinfer.kernels import (
    KVKind,
    dequantize_kv_ref,
    pack_paged_kv,
    paged_decode_attention,
    paged_decode_attention_ref,
    quantize_kv_ref,
)

from .conftest import DEVICE

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _lengths(page: int, group: int) -> list[int]:
    return [1, group - 1, group, page, page + 1, 3 * page + group + 3]


def _batch(
    lengths: list[int], bits: list[int], heads: int, head_dim: int, seed: int = 0
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    keys = [torch.randn(n, heads, head_dim, generator=gen) for n in lengths]
    values = [torch.randn(n, heads, head_dim, generator=gen) for n in lengths]
    for k in keys:
        k[:, :, 1] *= 8  # an outlier key channel
    return keys, values


# (dtype, page_size, group_size, kv_heads, gqa, head_dim, pages_per_split, tile_tokens)
CASES = [
    (torch.float32, 16, 16, 2, 3, 64, 1, None),
    (torch.float32, 32, 16, 1, 4, 48, None, 16),  # two tiles per page
    (torch.float16, 32, 32, 2, 2, 64, 2, 32),
    (torch.bfloat16, 16, 16, 2, 1, 32, 1, None),
]


@pytest.mark.parametrize(
    ("dtype", "page", "group", "heads", "gqa", "head_dim", "per_split", "tile"), CASES, ids=str
)
def test_kernel_matches_reference_on_a_mixed_batch(
    dtype: torch.dtype,
    page: int,
    group: int,
    heads: int,
    gqa: int,
    head_dim: int,
    per_split: int | None,
    tile: int | None,
) -> None:
    lengths = _lengths(page, group)
    bits = [(16, 8, 4)[i % 3] for i in range(len(lengths))] + [4, 16, 8]
    lengths += lengths[-1:] * 3  # the long sequence at every precision
    keys, values = _batch(lengths, bits, heads, head_dim)
    keys = [k.to(DEVICE) for k in keys]
    values = [v.to(DEVICE) for v in values]
    cache = pack_paged_kv(keys, values, bits, page_size=page, group_size=group, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(len(lengths), heads * gqa, head_dim, generator=gen).to(dtype).to(DEVICE)
    args = (q, cache.kv_bits, cache.block_tables, cache.seq_lens, cache.pools, cache.residual_pages)
    got = paged_decode_attention(
        *args, pages_per_split=per_split, tile_tokens=tile, backend="triton"
    )
    want = paged_decode_attention_ref(*args)
    assert got.dtype == dtype and got.shape == q.shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain attention of q [Hq, D] over k, v [T, H, D] (fp32)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q[None, :, None].float(), k.transpose(0, 1)[None].float(), v.transpose(0, 1)[None].float(),
        enable_gqa=True,
    )  # fmt: skip
    return out[0, :, 0]


@pytest.mark.parametrize("bits", [16, 8, 4])
def test_reference_equals_attention_over_stored_kv(bits: int) -> None:
    # What the reference must compute, built without pages: whole key groups go through
    # quantize/dequantize, the last n % G tokens stay exact.
    page, group, heads, head_dim = 32, 16, 2, 32
    lengths = _lengths(page, group)
    keys, values = _batch(lengths, [bits] * len(lengths), heads, head_dim, seed=3)
    cache = pack_paged_kv(keys, values, [bits] * len(lengths), page_size=page, group_size=group,
                          dtype=torch.float32, backend="ref")  # fmt: skip
    q = torch.randn(len(lengths), heads * 2, head_dim, generator=torch.Generator().manual_seed(4))
    out = paged_decode_attention_ref(
        q, cache.kv_bits, cache.block_tables, cache.seq_lens, cache.pools, cache.residual_pages
    )
    for b, n in enumerate(lengths):
        k, v = keys[b], values[b]
        if bits != 16:
            n_q = n // group * group
            k = torch.cat(
                (
                    dequantize_kv_ref(
                        quantize_kv_ref(k[:n_q], KVKind.KEY, bits, group), torch.float32
                    ),
                    k[n_q:],
                )
            )
            v = torch.cat(
                (
                    dequantize_kv_ref(
                        quantize_kv_ref(v[:n_q], KVKind.VALUE, bits, group), torch.float32
                    ),
                    v[n_q:],
                )
            )
        torch.testing.assert_close(out[b], _sdpa(q[b], k, v), atol=1e-5, rtol=1e-5)


def test_bad_batches_raise_one_clear_error() -> None:
    keys, values = _batch([20, 40], [16, 4], 1, 32)
    cache = pack_paged_kv(keys, values, [16, 4], page_size=16, group_size=16, dtype=torch.float32)
    q = torch.randn(2, 1, 32)
    base = {
        "q": q,
        "kv_bits": cache.kv_bits,
        "block_tables": cache.block_tables,
        "seq_lens": cache.seq_lens,
        "pools": cache.pools,
        "residual_pages": cache.residual_pages,
    }
    with pytest.raises(ValueError, match="needs the 8-bit pool"):
        paged_decode_attention(**{**base, "kv_bits": (16, 8)})
    with pytest.raises(ValueError, match="need residual_pages"):
        paged_decode_attention(**{**base, "residual_pages": None})
    with pytest.raises(ValueError, match="2 sequences but kv_bits has 1"):
        paged_decode_attention(**{**base, "kv_bits": (16,)})
    with pytest.raises(ValueError, match="seq_lens must be one of"):
        paged_decode_attention(**{**base, "seq_lens": cache.seq_lens.long()})
    with pytest.raises(ValueError, match="tile_tokens must be a power of two >= 16"):
        paged_decode_attention(**base, tile_tokens=8)
    with pytest.raises(ValueError, match="does not fit pools"):
        paged_decode_attention(**{**base, "q": torch.randn(2, 1, 64)})


@pytest.mark.gpu
def test_long_context_on_gpu_matches_reference() -> None:
    # 32k-token sequences at every precision, split-K with the default partition.
    lengths = [32768, 32768 - 5, 32768 + 17]
    bits = [16, 8, 4]
    keys, values = _batch(lengths, bits, 8, 128)
    cache = pack_paged_kv([k.cuda() for k in keys], [v.cuda() for v in values], bits,
                          page_size=64, group_size=32, dtype=torch.float16)  # fmt: skip
    q = torch.randn(3, 64, 128, device="cuda", dtype=torch.float16)
    args = (q, cache.kv_bits, cache.block_tables, cache.seq_lens, cache.pools, cache.residual_pages)
    got = paged_decode_attention(*args, backend="triton")
    want = paged_decode_attention_ref(*args)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-3, rtol=2e-3)
