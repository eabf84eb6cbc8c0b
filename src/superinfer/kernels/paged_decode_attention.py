"""``paged_decode_attention``: one decode step of attention over a paged KV cache whose pages are
fp16, int8 or int4 per sequence, mixed within one batch.

Storage per sequence of ``n`` tokens (pools in :class:`~superinfer.kernels.layout.KVPages`)::

    16-bit sequence:  tokens [0, n)            in pages of the 16-bit pool (block_tables)
    int8/int4 seq:    tokens [0, n_q)          in pages of that precision's pool (block_tables),
                                               n_q = (n // G) * G: whole key groups only
                      tokens [n_q, n)          in one page of the 16-bit pool (residual_pages):
                                               KIVI's full-precision residual, < G tokens

Split-K ("flash decoding", as vLLM's paged attention v2): each program reads up to
``PARTITION_TOKENS`` tokens of one sequence for one KV head and all its query heads (GQA), and
keeps an online softmax; a second kernel merges the partitions. One launch per precision present
in the batch (a compile-time variant each), all writing into the same partials, then one merge.
"""

import math
from collections.abc import Mapping, Sequence

import torch

from superinfer.kernels.dequantize_kv import dequantize_kv_ref
from superinfer.kernels.dispatch import Backend, is_interpreted, select_backend, tl, triton
from superinfer.kernels.layout import FLOAT_DTYPES, META_DTYPE, KVPages, check_kv_tensor

__all__ = [
    "PARTITION_TOKENS",
    "TILE_TOKENS",
    "paged_decode_attention",
    "paged_decode_attention_ref",
]

# Tokens per split-K partition: vLLM's paged attention v2 uses 512
# (vllm/attention/ops/paged_attn.py, _PARTITION_SIZE). Not re-tuned here: no GPU measurement yet.
PARTITION_TOKENS = 512
# Tokens per inner tile (a page is read in tiles of this many tokens). Compiled for sm_90 (head_dim
# 128, 4 warps; results/benchmarks/kernels_aot.csv) 16-token tiles take 93 / 154 / 127 registers
# per thread at fp16 / int8 / int4, 32-token tiles 168-241 and 64-token tiles 255 (the cap), none
# spilling. 16 keeps occupancy highest; whether that is fastest needs a GPU run of
# benchmarks/kernels.py, which sweeps 16 / 32 / 64.
TILE_TOKENS = 16
_LOG2E = 1.4426950408889634


@triton.jit
def _load_tile(
    data_ptr,  # [N, P, H, D * BITS / 8] codes, or [N, P, H, D] floats when BITS == 16
    scale_ptr,  # key: [N, P / G, H, D]; value: [N, P, H, D / G] (fp16); unused when BITS == 16
    zero_ptr,  # same shape as scale
    page,  # page index in the pool
    head,  # KV head
    tok,  # [TILE] token offsets inside the page
    chan,  # [BLOCK_D] channels
    mask,  # [TILE, BLOCK_D] valid elements
    stride_dp,  # pool data: page stride
    stride_dt,  # pool data: token stride
    stride_dh,  # pool data: head stride
    stride_sp,  # scale / zero: page stride
    stride_st,  # scale / zero: token stride
    stride_sh,  # scale / zero: head stride
    IS_KEY: tl.constexpr,  # keys: per-channel groups of GROUP tokens; values: per-token groups
    BITS: tl.constexpr,  # 16, 8 or 4
    GROUP: tl.constexpr,  # G
):
    # One tile [TILE, BLOCK_D] of a page's keys or values, dequantized to fp32.
    base = data_ptr + page * stride_dp + tok[:, None] * stride_dt + head * stride_dh
    if BITS == 16:
        x = tl.load(base + chan[None, :], mask=mask, other=0.0).to(tl.float32)
    else:
        if BITS == 8:
            q = tl.load(base + chan[None, :], mask=mask, other=0).to(tl.int32)
        else:
            byte = tl.load(base + (chan // 2)[None, :], mask=mask, other=0).to(tl.int32)
            q = (byte >> ((chan % 2) * 4)[None, :]) & 0xF
        if IS_KEY:
            meta = page * stride_sp + (tok // GROUP)[:, None] * stride_st + chan[None, :]
        else:
            meta = page * stride_sp + tok[:, None] * stride_st + (chan // GROUP)[None, :]
        meta += head * stride_sh
        s = tl.load(scale_ptr + meta, mask=mask, other=0.0).to(tl.float32)
        z = tl.load(zero_ptr + meta, mask=mask, other=0.0).to(tl.float32)
        x = q.to(tl.float32) * s + z
    return x


@triton.jit
def _attend_page(
    q,  # [BLOCK_H, BLOCK_D] query tile (in the dot dtype)
    m,  # [BLOCK_H] running max of the scores (base 2)
    l_sum,  # [BLOCK_H] running sum of exp2(score - m)
    acc,  # [BLOCK_H, BLOCK_D] running unnormalized output
    k_ptr,  # keys or key codes of the pool (see _load_tile)
    ks_ptr,  # key scales
    kz_ptr,  # key zero points
    v_ptr,  # values or value codes
    vs_ptr,  # value scales
    vz_ptr,  # value zero points
    page,  # page index in the pool
    head,  # KV head
    tok,  # [TILE] token offsets inside the page
    chan,  # [BLOCK_D] channels
    valid,  # [TILE] tokens of this tile that hold KV
    dmask,  # [BLOCK_D] channels < HEAD_DIM
    stride_dp,  # pool data: page stride
    stride_dt,  # pool data: token stride
    stride_dh,  # pool data: head stride
    stride_ksp,  # key scale / zero: page stride
    stride_kst,  # key scale / zero: token stride
    stride_ksh,  # key scale / zero: head stride
    stride_vsp,  # value scale / zero: page stride
    stride_vst,  # value scale / zero: token stride
    stride_vsh,  # value scale / zero: head stride
    sm_scale_log2,  # softmax scale * log2(e)
    BITS: tl.constexpr,  # page precision: 16, 8 or 4
    GROUP: tl.constexpr,  # G of the pool (1 for 16-bit)
    IEEE: tl.constexpr,  # fp32 dot without TF32
):
    # Online-softmax update of (m, l_sum, acc) with one page (FlashAttention-2, in base 2).
    mask = valid[:, None] & dmask[None, :]
    k = _load_tile(k_ptr, ks_ptr, kz_ptr, page, head, tok, chan, mask,
                   stride_dp, stride_dt, stride_dh, stride_ksp, stride_kst, stride_ksh,
                   True, BITS, GROUP)  # fmt: skip
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
    s = tl.where(valid[None, :], s * sm_scale_log2, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    v = _load_tile(v_ptr, vs_ptr, vz_ptr, page, head, tok, chan, mask,
                   stride_dp, stride_dt, stride_dh, stride_vsp, stride_vst, stride_vsh,
                   False, BITS, GROUP)  # fmt: skip
    if IEEE:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
    return m_new, l_sum * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + pv


@triton.jit
def _paged_decode_kernel(
    q_ptr,  # [B, Hq, D] queries
    k_ptr,  # this launch's pool (BITS): keys or key codes, see _load_tile
    ks_ptr,  # key scales
    kz_ptr,  # key zero points
    v_ptr,  # values or value codes
    vs_ptr,  # value scales
    vz_ptr,  # value zero points
    rk_ptr,  # [N16, P, H, D] keys of the 16-bit pool, holding the residual pages
    rv_ptr,  # [N16, P, H, D] values of the 16-bit pool
    block_tables_ptr,  # [B, max_pages] int32 page indices into this launch's pool
    seq_lens_ptr,  # [B] int32 tokens per sequence
    residual_pages_ptr,  # [B] int32 residual page (16-bit pool) of a quantized sequence
    seq_ids_ptr,  # [num programs along axis 0] int32 batch rows of this precision
    part_m_ptr,  # [B, Hq, S] fp32 partial max (base 2)
    part_l_ptr,  # [B, Hq, S] fp32 partial sum
    part_acc_ptr,  # [B, Hq, S, D] fp32 partial (unnormalized) outputs
    sm_scale_log2,  # softmax scale * log2(e)
    stride_qb,  # q: sequence stride
    stride_qh,  # q: head stride
    stride_dp,  # pool data: page stride
    stride_dt,  # pool data: token stride
    stride_dh,  # pool data: head stride
    stride_ksp,  # key scale / zero: page stride
    stride_kst,  # key scale / zero: token stride
    stride_ksh,  # key scale / zero: head stride
    stride_vsp,  # value scale / zero: page stride
    stride_vst,  # value scale / zero: token stride
    stride_vsh,  # value scale / zero: head stride
    stride_rp,  # residual pool: page stride
    stride_rt,  # residual pool: token stride
    stride_rh,  # residual pool: head stride
    stride_bt,  # block_tables row stride
    stride_pb,  # partial m / l_sum: sequence stride
    stride_ph,  # partial m / l_sum: head stride
    stride_ab,  # partial acc: sequence stride
    stride_ah,  # partial acc: head stride
    stride_as,  # partial acc: split stride
    GQA: tl.constexpr,  # query heads per KV head
    BLOCK_H: tl.constexpr,  # max(16, next power of two >= GQA): tl.dot needs M >= 16
    HEAD_DIM: tl.constexpr,  # D
    BLOCK_D: tl.constexpr,  # next power of two >= D
    PAGE: tl.constexpr,  # P, tokens per page
    TILE: tl.constexpr,  # tokens per inner tile (divides PAGE, >= 16 for tl.dot)
    GROUP: tl.constexpr,  # G of this pool (1 for 16-bit)
    BITS: tl.constexpr,  # 16, 8 or 4
    PAGES_PER_SPLIT: tl.constexpr,  # pages per split-K partition
    IEEE: tl.constexpr,  # queries are fp32: fp32 dots without TF32
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    b = tl.load(seq_ids_ptr + row)
    n = tl.load(seq_lens_ptr + b)
    if BITS == 16:
        n_paged = n
    else:
        n_paged = (n // GROUP) * GROUP
    hq = tl.arange(0, BLOCK_H)
    hmask = hq < GQA
    chan = tl.arange(0, BLOCK_D)
    dmask = chan < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + (head * GQA + hq)[:, None] * stride_qh + chan[None, :],
        mask=hmask[:, None] & dmask[None, :],
        other=0.0,
    )
    if IEEE:
        q = q.to(tl.float32)
    m = tl.full([BLOCK_H], -1.0e30, tl.float32)  # finite: a split with no token leaves no NaN
    l_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    # Tiles of TILE tokens: page i // TILES_PER_PAGE, tokens from (i % TILES_PER_PAGE) * TILE.
    tiles_per_page: tl.constexpr = PAGE // TILE
    offs = tl.arange(0, TILE)
    first = split * PAGES_PER_SPLIT * tiles_per_page
    last = tl.minimum(first + PAGES_PER_SPLIT * tiles_per_page, tl.cdiv(n_paged, TILE))
    for i in range(first, last):
        page = tl.load(block_tables_ptr + b * stride_bt + i // tiles_per_page)
        tok = (i % tiles_per_page) * TILE + offs
        m, l_sum, acc = _attend_page(
            q, m, l_sum, acc, k_ptr, ks_ptr, kz_ptr, v_ptr, vs_ptr, vz_ptr,
            page, head, tok, chan, i * TILE + offs < n_paged, dmask,
            stride_dp, stride_dt, stride_dh, stride_ksp, stride_kst, stride_ksh,
            stride_vsp, stride_vst, stride_vsh, sm_scale_log2, BITS, GROUP, IEEE,
        )  # fmt: skip
    if BITS != 16:
        if split == tl.num_programs(2) - 1:
            page = tl.load(residual_pages_ptr + b)
            for j in range(0, tl.cdiv(n - n_paged, TILE)):
                tok = j * TILE + offs
                m, l_sum, acc = _attend_page(
                    q, m, l_sum, acc, rk_ptr, rk_ptr, rk_ptr, rv_ptr, rv_ptr, rv_ptr,
                    page, head, tok, chan, tok < n - n_paged, dmask,
                    stride_rp, stride_rt, stride_rh, 0, 0, 0, 0, 0, 0, sm_scale_log2, 16, 1,
                    IEEE,
                )  # fmt: skip
    heads = head * GQA + hq
    pm = b * stride_pb + heads * stride_ph + split
    tl.store(part_m_ptr + pm, m, mask=hmask)
    tl.store(part_l_ptr + pm, l_sum, mask=hmask)
    pa = b * stride_ab + heads[:, None] * stride_ah + split * stride_as + chan[None, :]
    tl.store(part_acc_ptr + pa, acc, mask=hmask[:, None] & dmask[None, :])


@triton.jit
def _merge_splits_kernel(
    part_m_ptr,  # [B, Hq, S] fp32 partial max (base 2)
    part_l_ptr,  # [B, Hq, S] fp32 partial sum
    part_acc_ptr,  # [B, Hq, S, D] fp32
    out_ptr,  # [B, Hq, D] output (the query dtype)
    num_splits,  # S
    stride_pb,  # partial m / l_sum: sequence stride
    stride_ph,  # partial m / l_sum: head stride
    stride_ab,  # partial acc: sequence stride
    stride_ah,  # partial acc: head stride
    stride_as,  # partial acc: split stride
    stride_ob,  # out: sequence stride
    stride_oh,  # out: head stride
    HEAD_DIM: tl.constexpr,  # D
    BLOCK_D: tl.constexpr,  # next power of two >= D
    BLOCK_S: tl.constexpr,  # next power of two >= S
):
    # One program: one sequence x one query head; log-sum-exp merge of its partitions.
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    chan = tl.arange(0, BLOCK_D)
    smask = sp < num_splits
    m = tl.load(part_m_ptr + b * stride_pb + h * stride_ph + sp, mask=smask, other=float("-inf"))
    l_sum = tl.load(part_l_ptr + b * stride_pb + h * stride_ph + sp, mask=smask, other=0.0)
    w = tl.exp2(m - tl.max(m, axis=0))
    pa = b * stride_ab + h * stride_ah + sp[:, None] * stride_as + chan[None, :]
    acc = tl.load(part_acc_ptr + pa, mask=smask[:, None] & (chan < HEAD_DIM)[None, :], other=0.0)
    o = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l_sum, axis=0)
    dst = out_ptr + b * stride_ob + h * stride_oh + chan
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=chan < HEAD_DIM)


def _sequence_kv(
    b: int,
    bits: int,
    n: int,
    block_tables: torch.Tensor,
    pools: Mapping[int, KVPages],
    residual_pages: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    pool = pools[bits]
    size = pool.page_size
    group = pool.group_size or 1
    n_paged = n if bits == 16 else (n // group) * group
    pages = block_tables[b, : -(-n_paged // size)].long()
    if bits == 16:
        k = pool.k[pages].flatten(0, 1)[:n_paged].float()
        v = pool.v[pages].flatten(0, 1)[:n_paged].float()
        return k, v
    k = dequantize_kv_ref(pool.page_keys(pages), torch.float32)[:n_paged]
    v = dequantize_kv_ref(pool.page_values(pages), torch.float32)[:n_paged]
    if n > n_paged:
        assert residual_pages is not None
        res = pools[16]
        page = int(residual_pages[b])
        k = torch.cat((k, res.k[page, : n - n_paged].float()))
        v = torch.cat((v, res.v[page, : n - n_paged].float()))
    return k, v


def paged_decode_attention_ref(
    q: torch.Tensor,
    kv_bits: Sequence[int],
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    pools: Mapping[int, KVPages],
    residual_pages: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Pure-torch reference of :func:`paged_decode_attention` (gather, dequantize, fp32 softmax)."""
    num_seqs, num_q_heads, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    out = torch.empty_like(q)
    for b in range(num_seqs):
        k, v = _sequence_kv(b, kv_bits[b], int(seq_lens[b]), block_tables, pools, residual_pages)
        gqa = num_q_heads // k.shape[1]
        qb = q[b].float().view(k.shape[1], gqa, head_dim)  # [H, GQA, D]
        scores = torch.einsum("hgd,thd->hgt", qb, k) * scale
        probs = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hgt,thd->hgd", probs, v).reshape(num_q_heads, head_dim).to(q.dtype)
    return out


def _check(
    q: torch.Tensor,
    kv_bits: Sequence[int],
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    pools: Mapping[int, KVPages],
    residual_pages: torch.Tensor | None,
) -> None:
    check_kv_tensor("q", q, 3, FLOAT_DTYPES)
    check_kv_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_kv_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    num_seqs = q.shape[0]
    if (
        len(kv_bits) != num_seqs
        or block_tables.shape[0] != num_seqs
        or seq_lens.shape[0] != num_seqs
    ):
        raise ValueError(
            f"q has {num_seqs} sequences but kv_bits has {len(kv_bits)}, block_tables "
            f"{block_tables.shape[0]}, seq_lens {seq_lens.shape[0]}"
        )
    quantized = any(bits != 16 for bits in kv_bits)
    for bits in set(kv_bits) | ({16} if quantized else set()):
        if bits not in pools:
            raise ValueError(f"a sequence needs the {bits}-bit pool, but pools has {sorted(pools)}")
    if quantized:
        if residual_pages is None:
            raise ValueError("quantized sequences need residual_pages (their 16-bit tail pages)")
        check_kv_tensor("residual_pages", residual_pages, 1, (torch.int32,))
        if residual_pages.shape[0] != num_seqs:
            raise ValueError(f"residual_pages has {residual_pages.shape[0]} rows, not {num_seqs}")
    ref = pools[next(iter(pools))]
    for bits, pool in pools.items():
        if pool.bits != bits:
            raise ValueError(f"pools[{bits}] holds a {pool.bits}-bit pool")
        dims = (pool.page_size, pool.num_kv_heads, pool.head_dim)
        if dims != (ref.page_size, ref.num_kv_heads, ref.head_dim):
            raise ValueError(f"pools differ in (page_size, num_kv_heads, head_dim): {dims}")
        if bits == 16:
            for name, t in (("k", pool.k), ("v", pool.v)):
                check_kv_tensor(f"pools[16].{name}", t, 4, FLOAT_DTYPES)
        else:
            for name in ("k", "v"):
                check_kv_tensor(f"pools[{bits}].{name}", getattr(pool, name), 4, (torch.uint8,))
            for name in ("k_scale", "k_zero_point", "v_scale", "v_zero_point"):
                t = getattr(pool, name)
                if t is None:
                    raise ValueError(f"pools[{bits}].{name} is missing")
                check_kv_tensor(f"pools[{bits}].{name}", t, 4, (META_DTYPE,))
            if pool.group_size is None or pool.page_size % pool.group_size:
                raise ValueError(f"pools[{bits}]: page size must be a multiple of the group size")
    head_dim = q.shape[2]
    if ref.head_dim != head_dim or q.shape[1] % ref.num_kv_heads:
        raise ValueError(
            f"q [{num_seqs}, {q.shape[1]}, {head_dim}] does not fit pools of "
            f"{ref.num_kv_heads} KV heads x {ref.head_dim} channels"
        )
    if ref.page_size < 16 or ref.page_size & (ref.page_size - 1) or head_dim < 16:
        raise ValueError("page_size must be a power of two >= 16 and head_dim >= 16 (tl.dot)")


def paged_decode_attention(
    q: torch.Tensor,
    kv_bits: Sequence[int],
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    pools: Mapping[int, KVPages],
    residual_pages: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
    max_seq_len: int | None = None,
    pages_per_split: int | None = None,
    tile_tokens: int | None = None,
    backend: Backend | None = None,
) -> torch.Tensor:
    """Attention of one new query token per sequence over its paged, per-sequence-precision KV.

    Args:
        q: ``[num_seqs, num_q_heads, head_dim]`` fp16 / bf16 / fp32 queries. fp32 queries use
            fp32 dots (no TF32); fp16 / bf16 ones round dequantized K and the softmax weights to
            their dtype for the dots, accumulating in fp32.
        kv_bits: KV precision of each sequence: 16, 8 or 4.
        block_tables: ``[num_seqs, max_pages]`` int32; row ``b`` lists the pages of sequence
            ``b`` in the pool of its precision, in token order.
        seq_lens: ``[num_seqs]`` int32 tokens of each sequence (the new token's K/V included),
            each >= 1.
        pools: pools by bits; the 16-bit pool is needed by 16-bit sequences and, for the
            residual pages, by quantized ones. All share page size, KV heads and head_dim.
        residual_pages: ``[num_seqs]`` int32 page in the 16-bit pool holding the last
            ``n % G`` tokens of a quantized sequence; ignored for 16-bit ones.
        sm_scale: softmax scale; ``1 / sqrt(head_dim)`` by default.
        max_seq_len: longest sequence, to size the split-K partitions without reading
            ``seq_lens`` back from the device; computed from ``seq_lens`` when ``None``.
        pages_per_split: pages per partition; ``PARTITION_TOKENS / page_size`` by default.
        tile_tokens: tokens per inner tile, a power of two >= 16 dividing the page size;
            ``TILE_TOKENS`` (or the page size, if smaller) by default.
        backend: force ``"triton"`` or ``"ref"``; ``None`` chooses (see ``dispatch``).

    Returns:
        ``[num_seqs, num_q_heads, head_dim]`` attention outputs in ``q.dtype``.

    Raises:
        ValueError: inconsistent shapes, dtypes, devices, pools or precisions.
    """
    _check(q, kv_bits, block_tables, seq_lens, pools, residual_pages)
    device = q.device
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, q on {device}")
    if select_backend(_paged_decode_kernel, device, backend) == "ref":
        return paged_decode_attention_ref(
            q, kv_bits, block_tables, seq_lens, pools, residual_pages, sm_scale=sm_scale
        )
    num_seqs, num_q_heads, head_dim = q.shape
    any_pool = pools[next(iter(pools))]
    page_size, num_kv_heads = any_pool.page_size, any_pool.num_kv_heads
    gqa = num_q_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if num_seqs else 0
    per_split = pages_per_split or max(1, PARTITION_TOKENS // page_size)
    tile = min(tile_tokens or TILE_TOKENS, page_size)
    if tile < 16 or page_size % tile or tile & (tile - 1):
        raise ValueError(f"tile_tokens must be a power of two >= 16 dividing page_size, got {tile}")
    num_splits = max(1, triton.cdiv(triton.cdiv(max_seq_len, page_size), per_split))
    part_m = torch.empty((num_seqs, num_q_heads, num_splits), dtype=torch.float32, device=device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(
        (num_seqs, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=device
    )
    # NOTE: Triton 3.9's interpreter computes tl.dot on bf16 operands from their raw bits (wrong
    # by 1e10 in a 16x16 check), so bf16 queries take the fp32 path there; compiled, bf16 dots run
    # on tensor cores like fp16 ones.
    ieee = q.dtype == torch.float32 or (
        q.dtype == torch.bfloat16 and is_interpreted(_paged_decode_kernel)
    )
    res = pools.get(16)
    res_pages = residual_pages if residual_pages is not None else seq_lens
    for bits in sorted(set(kv_bits), reverse=True):
        rows = [b for b in range(num_seqs) if kv_bits[b] == bits]
        if len(rows) == num_seqs:  # one precision: no host-to-device copy of the row list
            seq_ids = torch.arange(num_seqs, dtype=torch.int32, device=device)
        else:
            seq_ids = torch.tensor(rows, dtype=torch.int32, device=device)
        pool = pools[bits]
        ks = pool.k_scale if pool.k_scale is not None else pool.k
        kz = pool.k_zero_point if pool.k_zero_point is not None else pool.k
        vs = pool.v_scale if pool.v_scale is not None else pool.v
        vz = pool.v_zero_point if pool.v_zero_point is not None else pool.v
        rk = res.k if res is not None else pool.k
        rv = res.v if res is not None else pool.v
        _paged_decode_kernel[(len(rows), num_kv_heads, num_splits)](
            q, pool.k, ks, kz, pool.v, vs, vz, rk, rv,
            block_tables, seq_lens, res_pages, seq_ids, part_m, part_l, part_acc,
            scale * _LOG2E,
            q.stride(0), q.stride(1),
            pool.k.stride(0), pool.k.stride(1), pool.k.stride(2),
            ks.stride(0), ks.stride(1), ks.stride(2),
            vs.stride(0), vs.stride(1), vs.stride(2),
            rk.stride(0), rk.stride(1), rk.stride(2),
            block_tables.stride(0),
            part_m.stride(0), part_m.stride(1),
            part_acc.stride(0), part_acc.stride(1), part_acc.stride(2),
            GQA=gqa,
            BLOCK_H=max(16, triton.next_power_of_2(gqa)),
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            PAGE=page_size,
            TILE=tile,
            GROUP=pool.group_size or 1,
            BITS=bits,
            PAGES_PER_SPLIT=per_split,
            IEEE=ieee,
        )  # fmt: skip
    out = torch.empty_like(q)
    _merge_splits_kernel[(num_seqs, num_q_heads)](
        part_m, part_l, part_acc, out, num_splits,
        part_m.stride(0), part_m.stride(1),
        part_acc.stride(0), part_acc.stride(1), part_acc.stride(2),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_S=triton.next_power_of_2(num_splits),
    )  # fmt: skip
    return out
