"""Build the pools, block tables and residual pages of a paged, mixed-precision KV cache.

This is the store path of :func:`~superinfer.kernels.paged_decode_attention.paged_decode_attention`
in one place, for tests, benchmarks and engines that fill a cache from whole sequences: each
sequence's whole key groups go through ``quantize_kv`` into pages of its precision's pool, and
its last ``n % G`` tokens into a page of the 16-bit pool (KIVI's full-precision residual).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from superinfer.kernels.dispatch import Backend
from superinfer.kernels.layout import KVKind, KVPages
from superinfer.kernels.quantize_kv import quantize_kv

__all__ = ["PagedKV", "pack_paged_kv"]


@dataclass(frozen=True)
class PagedKV:
    """Arguments of ``paged_decode_attention`` for one batch (see its docstring)."""

    kv_bits: tuple[int, ...]
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    pools: dict[int, KVPages]
    residual_pages: torch.Tensor


def pack_paged_kv(
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    kv_bits: Sequence[int],
    *,
    page_size: int,
    group_size: int,
    dtype: torch.dtype = torch.float16,
    shuffle_seed: int | None = 0,
    backend: Backend | None = None,
) -> PagedKV:
    """Store whole sequences into fresh pools.

    Args:
        keys: per sequence ``[n_b, num_kv_heads, head_dim]`` keys (any float dtype).
        values: per sequence values, same shapes.
        kv_bits: per sequence 16, 8 or 4.
        page_size: ``P`` tokens per page, a multiple of ``group_size``.
        group_size: ``G`` of the quantized pools.
        dtype: dtype of the 16-bit pool.
        shuffle_seed: pages are handed out in a random order drawn from this seed (as a real
            allocator's free list would), or in order when ``None``.
        backend: passed to ``quantize_kv``.

    Returns:
        The pools (every precision used, plus the 16-bit one), block tables, lengths, residual
        pages, all on the device of ``keys[0]``.

    Raises:
        ValueError: mismatched lengths or shapes, bad bits, or ``page_size % group_size != 0``.
    """
    if not (len(keys) == len(values) == len(kv_bits)) or not keys:
        raise ValueError("keys, values and kv_bits need one (and the same number of) entries")
    if page_size % group_size:
        raise ValueError(f"page_size {page_size} is not a multiple of group_size {group_size}")
    device = keys[0].device
    _, num_heads, head_dim = keys[0].shape
    per_bits: dict[int, list[int]] = {16: [], 8: [], 4: []}  # bits -> page count per sequence
    tails: list[tuple[int, int]] = []  # (paged tokens, residual tokens)
    for k, v, bits in zip(keys, values, kv_bits, strict=True):
        if bits not in per_bits:
            raise ValueError(f"kv_bits entries must be 16, 8 or 4, got {bits}")
        if k.shape != v.shape or k.shape[1:] != (num_heads, head_dim):
            raise ValueError(f"sequence K/V shapes {tuple(k.shape)} / {tuple(v.shape)} differ")
        n = k.shape[0]
        paged = n if bits == 16 else (n // group_size) * group_size
        tails.append((paged, n - paged))
    gen = torch.Generator().manual_seed(shuffle_seed) if shuffle_seed is not None else None

    def order(count: int) -> torch.Tensor:
        return torch.randperm(count, generator=gen) if gen is not None else torch.arange(count)

    # Pages per pool: whole pages of each sequence, plus one residual page per quantized one.
    pages_needed = dict.fromkeys(per_bits, 0)
    for (paged, _), bits in zip(tails, kv_bits, strict=True):
        pages_needed[bits] += -(-paged // page_size)
        if bits != 16:
            pages_needed[16] += 1
    free = {bits: order(count).tolist() for bits, count in pages_needed.items()}
    tables: list[list[int]] = []
    residual: list[int] = []
    for (paged, _), bits in zip(tails, kv_bits, strict=True):
        tables.append([free[bits].pop() for _ in range(-(-paged // page_size))])
        residual.append(free[16].pop() if bits != 16 else 0)

    def padded(seq: torch.Tensor, tokens: int) -> torch.Tensor:
        pad = -(-tokens // page_size) * page_size - tokens
        return torch.cat((seq[:tokens], seq.new_zeros(pad, num_heads, head_dim)))

    pools: dict[int, KVPages] = {}
    for bits in sorted({16, *kv_bits}, reverse=True):
        n_pages = pages_needed[bits]
        rows = [b for b, kb in enumerate(kv_bits) if kb == bits]
        if bits == 16:
            k_pool = torch.zeros(
                (n_pages, page_size, num_heads, head_dim), dtype=dtype, device=device
            )
            v_pool = torch.zeros_like(k_pool)
            for b, (paged, rest) in enumerate(tails):
                slots = tables[b] if kv_bits[b] == 16 else [residual[b]]
                start = 0 if kv_bits[b] == 16 else paged
                count = paged if kv_bits[b] == 16 else rest
                if not count:
                    continue
                for src, dst in ((keys[b], k_pool), (values[b], v_pool)):
                    chunk = padded(src[start : start + count].to(dtype), count)
                    dst[slots] = chunk.view(-1, page_size, num_heads, head_dim)
            pools[16] = KVPages(k=k_pool, v=v_pool)
            continue
        # Quantize each sequence's whole groups (pages padded with zero tokens, then scattered).
        empty = torch.zeros((max(n_pages, 1) * page_size, num_heads, head_dim), device=device)
        k_all = quantize_kv(empty, KVKind.KEY, bits, group_size, backend=backend)
        v_all = quantize_kv(empty, KVKind.VALUE, bits, group_size, backend=backend)
        pool = KVPages.from_quantized(k_all, v_all, page_size)
        for b in rows:
            paged = tails[b][0]
            if not paged:
                continue
            kq = quantize_kv(
                padded(keys[b], paged).contiguous(), KVKind.KEY, bits, group_size, backend=backend
            )
            vq = quantize_kv(
                padded(values[b], paged).contiguous(),
                KVKind.VALUE,
                bits,
                group_size,
                backend=backend,
            )
            seq_pool = KVPages.from_quantized(kq, vq, page_size)
            idx = torch.tensor(tables[b], dtype=torch.long, device=device)
            for name in ("k", "v", "k_scale", "k_zero_point", "v_scale", "v_zero_point"):
                getattr(pool, name)[idx] = getattr(seq_pool, name)
        pools[bits] = pool
    width = max((len(t) for t in tables), default=0) or 1
    block_tables = torch.zeros((len(keys), width), dtype=torch.int32)
    for b, t in enumerate(tables):
        block_tables[b, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return PagedKV(
        kv_bits=tuple(kv_bits),
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor([k.shape[0] for k in keys], dtype=torch.int32, device=device),
        pools=pools,
        residual_pages=torch.tensor(residual, dtype=torch.int32, device=device),
    )
