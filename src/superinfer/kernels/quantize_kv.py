"""``quantize_kv``: asymmetric int8 / int4 quantization of keys or values, KIVI-style groups.

Layout, grouping and the reconstruction formula are in :mod:`superinfer.kernels.layout`. Both
implementations compute in fp32 with the same operations in the same order (scale and zero point
are rounded to fp16 *before* the codes are computed, so codes are exact for the stored metadata),
which makes the Triton kernel under the interpreter bit-identical to :func:`quantize_kv_ref`.
"""

import torch

from superinfer.kernels.dispatch import Backend, select_backend, tl, triton
from superinfer.kernels.layout import (
    FLOAT_DTYPES,
    META_DTYPE,
    KVKind,
    QuantizedKV,
    check_format,
    check_kv_tensor,
    codes_width,
    scale_shape,
)

__all__ = ["quantize_kv", "quantize_kv_ref"]

# Tokens per program of the value kernel (each program quantizes VALUE_BLOCK_TOKENS x group_size
# elements of one head). Not tuned: no GPU measurement exists yet (benchmarks/kernels.py).
VALUE_BLOCK_TOKENS = 16


@triton.jit
def _quantize_key_kernel(
    x_ptr,  # [T, H, D] float input
    codes_ptr,  # [T, H, D * BITS / 8] uint8 output
    scale_ptr,  # [T / G, H, D] fp16 output
    zero_ptr,  # [T / G, H, D] fp16 output
    stride_xt,  # x: token stride
    stride_xh,  # x: head stride
    stride_ct,  # codes: token stride
    stride_ch,  # codes: head stride
    stride_sg,  # scale / zero: group stride
    stride_sh,  # scale / zero: head stride
    HALF_D: tl.constexpr,  # D / 2: channel pairs per head
    BLOCK_HALF_D: tl.constexpr,  # next power of two >= HALF_D
    GROUP: tl.constexpr,  # G: tokens per key group
    BITS: tl.constexpr,  # 8 or 4
):
    # One program: one token group x one head; per-channel statistics over the GROUP tokens.
    grp = tl.program_id(0)
    head = tl.program_id(1)
    qmax: tl.constexpr = (1 << BITS) - 1
    tok = grp * GROUP + tl.arange(0, GROUP)
    pair = tl.arange(0, BLOCK_HALF_D)
    mask = (tok[:, None] >= 0) & (pair[None, :] < HALF_D)
    base = x_ptr + tok[:, None] * stride_xt + head * stride_xh + 2 * pair[None, :]
    x_even = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    x_odd = tl.load(base + 1, mask=mask, other=0.0).to(tl.float32)
    s_even = ((tl.max(x_even, axis=0) - tl.min(x_even, axis=0)) / qmax).to(tl.float16)
    s_odd = ((tl.max(x_odd, axis=0) - tl.min(x_odd, axis=0)) / qmax).to(tl.float16)
    z_even = tl.min(x_even, axis=0).to(tl.float16)
    z_odd = tl.min(x_odd, axis=0).to(tl.float16)
    meta = grp * stride_sg + head * stride_sh + 2 * pair
    tl.store(scale_ptr + meta, s_even, mask=pair < HALF_D)
    tl.store(scale_ptr + meta + 1, s_odd, mask=pair < HALF_D)
    tl.store(zero_ptr + meta, z_even, mask=pair < HALF_D)
    tl.store(zero_ptr + meta + 1, z_odd, mask=pair < HALF_D)
    s_even = tl.where(s_even == 0, 1.0, s_even.to(tl.float32))
    s_odd = tl.where(s_odd == 0, 1.0, s_odd.to(tl.float32))
    q_even = tl.floor((x_even - z_even.to(tl.float32)[None, :]) / s_even[None, :] + 0.5)
    q_odd = tl.floor((x_odd - z_odd.to(tl.float32)[None, :]) / s_odd[None, :] + 0.5)
    q_even = tl.minimum(tl.maximum(q_even, 0.0), qmax).to(tl.uint8)
    q_odd = tl.minimum(tl.maximum(q_odd, 0.0), qmax).to(tl.uint8)
    out = codes_ptr + tok[:, None] * stride_ct + head * stride_ch
    if BITS == 8:
        tl.store(out + 2 * pair[None, :], q_even, mask=mask)
        tl.store(out + 2 * pair[None, :] + 1, q_odd, mask=mask)
    else:
        tl.store(out + pair[None, :], q_even | (q_odd << 4), mask=mask)


@triton.jit
def _quantize_value_kernel(
    x_ptr,  # [T, H, D] float input
    codes_ptr,  # [T, H, D * BITS / 8] uint8 output
    scale_ptr,  # [T, H, D / G] fp16 output
    zero_ptr,  # [T, H, D / G] fp16 output
    num_tokens,  # T
    stride_xt,  # x: token stride
    stride_xh,  # x: head stride
    stride_ct,  # codes: token stride
    stride_ch,  # codes: head stride
    stride_st,  # scale / zero: token stride
    stride_sh,  # scale / zero: head stride
    GROUP: tl.constexpr,  # G: channels per value group
    BITS: tl.constexpr,  # 8 or 4
    BLOCK_T: tl.constexpr,  # tokens per program
):
    # One program: BLOCK_T tokens x one head x one channel group; per-token statistics.
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)
    grp = tl.program_id(2)
    qmax: tl.constexpr = (1 << BITS) - 1
    pair = tl.arange(0, GROUP // 2)
    row = tok < num_tokens
    mask = row[:, None] & (pair[None, :] >= 0)
    chan = grp * GROUP + 2 * pair
    base = x_ptr + tok[:, None] * stride_xt + head * stride_xh + chan[None, :]
    x_even = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    x_odd = tl.load(base + 1, mask=mask, other=0.0).to(tl.float32)
    mn = tl.minimum(tl.min(x_even, axis=1), tl.min(x_odd, axis=1))
    mx = tl.maximum(tl.max(x_even, axis=1), tl.max(x_odd, axis=1))
    s = ((mx - mn) / qmax).to(tl.float16)
    z = mn.to(tl.float16)
    meta = tok * stride_st + head * stride_sh + grp
    tl.store(scale_ptr + meta, s, mask=row)
    tl.store(zero_ptr + meta, z, mask=row)
    s = tl.where(s == 0, 1.0, s.to(tl.float32))
    q_even = tl.floor((x_even - z.to(tl.float32)[:, None]) / s[:, None] + 0.5)
    q_odd = tl.floor((x_odd - z.to(tl.float32)[:, None]) / s[:, None] + 0.5)
    q_even = tl.minimum(tl.maximum(q_even, 0.0), qmax).to(tl.uint8)
    q_odd = tl.minimum(tl.maximum(q_odd, 0.0), qmax).to(tl.uint8)
    out = codes_ptr + tok[:, None] * stride_ct + head * stride_ch
    if BITS == 8:
        tl.store(out + chan[None, :], q_even, mask=mask)
        tl.store(out + chan[None, :] + 1, q_odd, mask=mask)
    else:
        tl.store(out + (chan // 2)[None, :], q_even | (q_odd << 4), mask=mask)


def _pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    q = q.to(torch.uint8)
    return q if bits == 8 else q[..., 0::2] | (q[..., 1::2] << 4)


def quantize_kv_ref(x: torch.Tensor, kind: KVKind | str, bits: int, group_size: int) -> QuantizedKV:
    """Pure-torch reference of :func:`quantize_kv` (same arguments, same result)."""
    kind = KVKind(kind)
    num_tokens, num_heads, head_dim = x.shape
    check_format(kind, num_tokens, head_dim, bits, group_size)
    qmax = (1 << bits) - 1
    xf = x.float()
    if kind is KVKind.KEY:
        xg = xf.view(num_tokens // group_size, group_size, num_heads, head_dim)
        axis = 1
    else:
        xg = xf.view(num_tokens, num_heads, head_dim // group_size, group_size)
        axis = 3
    mn, mx = xg.amin(axis, keepdim=True), xg.amax(axis, keepdim=True)
    scale = ((mx - mn) / qmax).to(META_DTYPE)
    zero = mn.to(META_DTYPE)
    safe = torch.where(scale == 0, torch.ones_like(scale, dtype=torch.float32), scale.float())
    q = torch.floor((xg - zero.float()) / safe + 0.5).clamp_(0, qmax)
    return QuantizedKV(
        codes=_pack(q.reshape(num_tokens, num_heads, head_dim), bits),
        scale=scale.squeeze(axis).contiguous(),
        zero_point=zero.squeeze(axis).contiguous(),
        kind=kind,
        bits=bits,
        group_size=group_size,
        head_dim=head_dim,
    )


def quantize_kv(
    x: torch.Tensor,
    kind: KVKind | str,
    bits: int,
    group_size: int,
    *,
    backend: Backend | None = None,
) -> QuantizedKV:
    """Quantize keys or values to ``bits``-bit codes with a scale and zero point per group.

    Args:
        x: ``[num_tokens, num_kv_heads, head_dim]`` fp16 / bf16 / fp32, contiguous. Keys need
            ``num_tokens % group_size == 0``; values need ``head_dim % group_size == 0``. Values
            must lie in fp16 range (scales and zero points are stored in fp16, as in KIVI).
        kind: ``"key"`` (per-channel groups of ``group_size`` tokens) or ``"value"`` (per-token
            groups of ``group_size`` channels), after KIVI (Liu et al., ICML 2024).
        bits: 8, or 4 (two codes per byte).
        group_size: ``G``, a power of two.
        backend: force ``"triton"`` or ``"ref"``; ``None`` chooses (see ``dispatch``).

    Returns:
        The codes, scales and zero points; shapes in :mod:`superinfer.kernels.layout`.

    Raises:
        ValueError: a bad shape, dtype, layout, bits or group size.
    """
    kind = KVKind(kind)
    check_kv_tensor("x", x, 3, FLOAT_DTYPES)
    num_tokens, num_heads, head_dim = x.shape
    check_format(kind, num_tokens, head_dim, bits, group_size)
    kernel = _quantize_key_kernel if kind is KVKind.KEY else _quantize_value_kernel
    if select_backend(kernel, x.device, backend) == "ref":
        return quantize_kv_ref(x, kind, bits, group_size)
    codes = torch.empty(
        (num_tokens, num_heads, codes_width(head_dim, bits)), dtype=torch.uint8, device=x.device
    )
    meta_shape = scale_shape(kind, num_tokens, num_heads, head_dim, group_size)
    scale = torch.empty(meta_shape, dtype=META_DTYPE, device=x.device)
    zero = torch.empty(meta_shape, dtype=META_DTYPE, device=x.device)
    if num_tokens:
        if kind is KVKind.KEY:
            _quantize_key_kernel[(num_tokens // group_size, num_heads)](
                x, codes, scale, zero,
                x.stride(0), x.stride(1), codes.stride(0), codes.stride(1),
                scale.stride(0), scale.stride(1),
                HALF_D=head_dim // 2,
                BLOCK_HALF_D=triton.next_power_of_2(head_dim // 2),
                GROUP=group_size,
                BITS=bits,
            )  # fmt: skip
        else:
            grid = (triton.cdiv(num_tokens, VALUE_BLOCK_TOKENS), num_heads, head_dim // group_size)
            _quantize_value_kernel[grid](
                x, codes, scale, zero, num_tokens,
                x.stride(0), x.stride(1), codes.stride(0), codes.stride(1),
                scale.stride(0), scale.stride(1),
                GROUP=group_size,
                BITS=bits,
                BLOCK_T=VALUE_BLOCK_TOKENS,
            )  # fmt: skip
    return QuantizedKV(codes, scale, zero, kind, bits, group_size, head_dim)
