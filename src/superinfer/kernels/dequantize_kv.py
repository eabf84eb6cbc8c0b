"""``dequantize_kv``: int8 / int4 codes back to floats, ``x_hat = code * scale + zero_point``.

Layout and grouping are in :mod:`superinfer.kernels.layout`. The kernel and
:func:`dequantize_kv_ref` do the same fp32 multiply-add (bit-identical under the interpreter; on
a GPU the compiler may fuse it into an FMA, which differs by at most one fp32 ulp).
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
    check_same_device,
    codes_width,
    scale_shape,
)

__all__ = ["dequantize_kv", "dequantize_kv_ref", "unpack_codes"]

# Tokens per program of the value kernel. Not tuned: no GPU measurement exists yet.
VALUE_BLOCK_TOKENS = 16


@triton.jit
def _dequantize_key_kernel(
    codes_ptr,  # [T, H, D * BITS / 8] uint8
    scale_ptr,  # [T / G, H, D] fp16
    zero_ptr,  # [T / G, H, D] fp16
    out_ptr,  # [T, H, D] float output
    stride_ct,  # codes: token stride
    stride_ch,  # codes: head stride
    stride_sg,  # scale / zero: group stride
    stride_sh,  # scale / zero: head stride
    stride_ot,  # out: token stride
    stride_oh,  # out: head stride
    HALF_D: tl.constexpr,  # D / 2: channel pairs per head
    BLOCK_HALF_D: tl.constexpr,  # next power of two >= HALF_D
    GROUP: tl.constexpr,  # G: tokens per key group
    BITS: tl.constexpr,  # 8 or 4
):
    # One program: one token group x one head.
    grp = tl.program_id(0)
    head = tl.program_id(1)
    tok = grp * GROUP + tl.arange(0, GROUP)
    pair = tl.arange(0, BLOCK_HALF_D)
    mask = (tok[:, None] >= 0) & (pair[None, :] < HALF_D)
    src = codes_ptr + tok[:, None] * stride_ct + head * stride_ch
    if BITS == 8:
        q_even = tl.load(src + 2 * pair[None, :], mask=mask, other=0)
        q_odd = tl.load(src + 2 * pair[None, :] + 1, mask=mask, other=0)
    else:
        byte = tl.load(src + pair[None, :], mask=mask, other=0)
        q_even = byte & 0xF
        q_odd = byte >> 4
    meta = grp * stride_sg + head * stride_sh + 2 * pair
    s_even = tl.load(scale_ptr + meta, mask=pair < HALF_D, other=0.0).to(tl.float32)
    s_odd = tl.load(scale_ptr + meta + 1, mask=pair < HALF_D, other=0.0).to(tl.float32)
    z_even = tl.load(zero_ptr + meta, mask=pair < HALF_D, other=0.0).to(tl.float32)
    z_odd = tl.load(zero_ptr + meta + 1, mask=pair < HALF_D, other=0.0).to(tl.float32)
    x_even = q_even.to(tl.float32) * s_even[None, :] + z_even[None, :]
    x_odd = q_odd.to(tl.float32) * s_odd[None, :] + z_odd[None, :]
    out = out_ptr + tok[:, None] * stride_ot + head * stride_oh + 2 * pair[None, :]
    tl.store(out, x_even.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out + 1, x_odd.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dequantize_value_kernel(
    codes_ptr,  # [T, H, D * BITS / 8] uint8
    scale_ptr,  # [T, H, D / G] fp16
    zero_ptr,  # [T, H, D / G] fp16
    out_ptr,  # [T, H, D] float output
    num_tokens,  # T
    stride_ct,  # codes: token stride
    stride_ch,  # codes: head stride
    stride_st,  # scale / zero: token stride
    stride_sh,  # scale / zero: head stride
    stride_ot,  # out: token stride
    stride_oh,  # out: head stride
    GROUP: tl.constexpr,  # G: channels per value group
    BITS: tl.constexpr,  # 8 or 4
    BLOCK_T: tl.constexpr,  # tokens per program
):
    # One program: BLOCK_T tokens x one head x one channel group.
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)
    grp = tl.program_id(2)
    pair = tl.arange(0, GROUP // 2)
    row = tok < num_tokens
    mask = row[:, None] & (pair[None, :] >= 0)
    chan = grp * GROUP + 2 * pair
    src = codes_ptr + tok[:, None] * stride_ct + head * stride_ch
    if BITS == 8:
        q_even = tl.load(src + chan[None, :], mask=mask, other=0)
        q_odd = tl.load(src + chan[None, :] + 1, mask=mask, other=0)
    else:
        byte = tl.load(src + (chan // 2)[None, :], mask=mask, other=0)
        q_even = byte & 0xF
        q_odd = byte >> 4
    meta = tok * stride_st + head * stride_sh + grp
    s = tl.load(scale_ptr + meta, mask=row, other=0.0).to(tl.float32)
    z = tl.load(zero_ptr + meta, mask=row, other=0.0).to(tl.float32)
    x_even = q_even.to(tl.float32) * s[:, None] + z[:, None]
    x_odd = q_odd.to(tl.float32) * s[:, None] + z[:, None]
    out = out_ptr + tok[:, None] * stride_ot + head * stride_oh + chan[None, :]
    tl.store(out, x_even.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out + 1, x_odd.to(out_ptr.dtype.element_ty), mask=mask)


def unpack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes ``[..., D * bits / 8]`` -> one code per channel ``[..., D]`` (uint8)."""
    if bits == 8:
        return codes
    return torch.stack((codes & 0xF, codes >> 4), dim=-1).flatten(-2)


def dequantize_kv_ref(qkv: QuantizedKV, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Pure-torch reference of :func:`dequantize_kv` (same arguments, same result)."""
    q = unpack_codes(qkv.codes, qkv.bits).float()
    num_tokens, num_heads, head_dim = q.shape
    g = qkv.group_size
    if qkv.kind is KVKind.KEY:
        q = q.view(num_tokens // g, g, num_heads, head_dim)
        s, z = qkv.scale.float()[:, None], qkv.zero_point.float()[:, None]
    else:
        q = q.view(num_tokens, num_heads, head_dim // g, g)
        s, z = qkv.scale.float()[..., None], qkv.zero_point.float()[..., None]
    return (q * s + z).reshape(num_tokens, num_heads, head_dim).to(dtype)


def _check(qkv: QuantizedKV, dtype: torch.dtype) -> None:
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {[str(d) for d in FLOAT_DTYPES]}, got {dtype}")
    check_kv_tensor("codes", qkv.codes, 3, (torch.uint8,))
    check_kv_tensor("scale", qkv.scale, 3, (META_DTYPE,))
    check_kv_tensor("zero_point", qkv.zero_point, 3, (META_DTYPE,))
    check_same_device(codes=qkv.codes, scale=qkv.scale, zero_point=qkv.zero_point)
    num_tokens, num_heads, width = qkv.codes.shape
    check_format(qkv.kind, num_tokens, qkv.head_dim, qkv.bits, qkv.group_size)
    if width != codes_width(qkv.head_dim, qkv.bits):
        raise ValueError(f"codes last dim {width} != head_dim * bits / 8 for {qkv.bits}-bit")
    want = scale_shape(qkv.kind, num_tokens, num_heads, qkv.head_dim, qkv.group_size)
    for name, t in (("scale", qkv.scale), ("zero_point", qkv.zero_point)):
        if tuple(t.shape) != want:
            raise ValueError(f"{name} shape {tuple(t.shape)} != {want} for {qkv.kind.value}s")


def dequantize_kv(
    qkv: QuantizedKV, dtype: torch.dtype = torch.float16, *, backend: Backend | None = None
) -> torch.Tensor:
    """Reconstruct keys or values from their codes, scales and zero points.

    Args:
        qkv: output of ``quantize_kv`` (or pages of a cache in the same layout).
        dtype: output dtype (fp16, bf16 or fp32).
        backend: force ``"triton"`` or ``"ref"``; ``None`` chooses (see ``dispatch``).

    Returns:
        ``[num_tokens, num_kv_heads, head_dim]`` tensor of ``dtype``.

    Raises:
        ValueError: inconsistent shapes, dtypes, devices or a non-contiguous tensor.
    """
    _check(qkv, dtype)
    kernel = _dequantize_key_kernel if qkv.kind is KVKind.KEY else _dequantize_value_kernel
    if select_backend(kernel, qkv.codes.device, backend) == "ref":
        return dequantize_kv_ref(qkv, dtype)
    num_tokens, num_heads, _ = qkv.codes.shape
    head_dim, g = qkv.head_dim, qkv.group_size
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=dtype, device=qkv.codes.device)
    c, s, z = qkv.codes, qkv.scale, qkv.zero_point
    if num_tokens:
        if qkv.kind is KVKind.KEY:
            _dequantize_key_kernel[(num_tokens // g, num_heads)](
                c, s, z, out,
                c.stride(0), c.stride(1), s.stride(0), s.stride(1), out.stride(0), out.stride(1),
                HALF_D=head_dim // 2,
                BLOCK_HALF_D=triton.next_power_of_2(head_dim // 2),
                GROUP=g,
                BITS=qkv.bits,
            )  # fmt: skip
        else:
            grid = (triton.cdiv(num_tokens, VALUE_BLOCK_TOKENS), num_heads, head_dim // g)
            _dequantize_value_kernel[grid](
                c, s, z, out, num_tokens,
                c.stride(0), c.stride(1), s.stride(0), s.stride(1), out.stride(0), out.stride(1),
                GROUP=g,
                BITS=qkv.bits,
                BLOCK_T=VALUE_BLOCK_TOKENS,
            )  # fmt: skip
    return out
