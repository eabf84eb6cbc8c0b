"""Storage layout of quantized KV: KIVI-style groups, codes, scales and zero points.

KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", ICML 2024)
groups **keys per channel** across ``group_size`` consecutive tokens (key outliers live in a few
channels) and **values per token** across ``group_size`` consecutive channels. Each group stores
``bits``-bit unsigned codes and an fp16 ``scale`` and ``zero_point``; a value is recovered as::

    x_hat = code * scale + zero_point     zero_point = min(group)
                                          scale = (max - min) / (2**bits - 1)

Codes of one token, head and channel row are bytes: int8 keeps one code per byte, int4 packs two
(channel ``2j`` in the low nibble of byte ``j``, channel ``2j + 1`` in the high nibble).

Shapes for ``T`` tokens, ``H`` KV heads, ``D`` channels per head, group size ``G``::

    input / dequantized    [T, H, D]            fp16 / bf16 / fp32
    codes                  [T, H, D * bits / 8] uint8
    key scale, zero_point  [T / G, H, D]        fp16   (one per channel per token group)
    value scale, zero_pt   [T, H, D / G]        fp16   (one per token per channel group)

A page of ``P`` tokens of a paged cache is the same layout with ``T = P`` (``P % G == 0``).
Tensors are contiguous (the wrappers check it), so kernels take the strides of every dim but the
last, whose stride is 1.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

__all__ = [
    "FLOAT_DTYPES",
    "META_DTYPE",
    "KVKind",
    "KVPages",
    "QuantizedKV",
    "check_format",
    "check_kv_tensor",
    "check_same_device",
    "codes_width",
    "scale_shape",
]

META_DTYPE = torch.float16  # scale and zero point, as KIVI stores them (2 bytes each)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SUPPORTED_BITS = (8, 4)


class KVKind(str, enum.Enum):
    """Which half of the KV cache a tensor holds; it decides the grouping axis."""

    KEY = "key"  # grouped per channel across group_size tokens
    VALUE = "value"  # grouped per token across group_size channels


@dataclass(frozen=True)
class QuantizedKV:
    """Quantized keys or values of ``num_tokens`` tokens (see the module docstring for shapes).

    Attributes:
        codes: uint8 codes, ``[T, H, D * bits / 8]``.
        scale: fp16 scale per group.
        zero_point: fp16 zero point (the group minimum) per group.
        kind: keys or values.
        bits: 8 or 4.
        group_size: ``G``, tokens per key group and channels per value group.
        head_dim: ``D``.
    """

    codes: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor
    kind: KVKind
    bits: int
    group_size: int
    head_dim: int

    @property
    def num_tokens(self) -> int:
        """Tokens stored."""
        return int(self.codes.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held: codes, scales and zero points."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.zero_point))


def codes_width(head_dim: int, bits: int) -> int:
    """Bytes of codes per token and head: ``head_dim * bits / 8``."""
    return head_dim * bits // 8


def scale_shape(
    kind: KVKind, num_tokens: int, num_heads: int, head_dim: int, group_size: int
) -> tuple[int, int, int]:
    """Shape of the scale (and zero point) tensor of ``num_tokens`` tokens."""
    if kind is KVKind.KEY:
        return (num_tokens // group_size, num_heads, head_dim)
    return (num_tokens, num_heads, head_dim // group_size)


def check_format(kind: KVKind, num_tokens: int, head_dim: int, bits: int, group_size: int) -> None:
    """Check that ``(kind, bits, group_size)`` can hold ``num_tokens`` tokens of ``head_dim``.

    Raises:
        ValueError: unsupported bits, a group size that is not a power of two, an odd head_dim,
            keys whose token count is not a multiple of the group size, or values whose head_dim
            is not a multiple of the group size.
    """
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
    if group_size < 2 or group_size & (group_size - 1):
        raise ValueError(f"group_size must be a power of two >= 2, got {group_size}")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (int4 packs channel pairs), got {head_dim}")
    if kind is KVKind.KEY and num_tokens % group_size:
        raise ValueError(
            f"keys are grouped per {group_size} tokens: num_tokens must be a multiple of it, "
            f"got {num_tokens} (keep the remainder unquantized, as KIVI's residual)"
        )
    if kind is KVKind.VALUE and head_dim % group_size:
        raise ValueError(
            f"values are grouped per {group_size} channels: head_dim {head_dim} is not a multiple"
        )


def check_kv_tensor(name: str, x: torch.Tensor, ndim: int, dtypes: tuple[torch.dtype, ...]) -> None:
    """Check rank, dtype and contiguity of a kernel argument.

    Raises:
        ValueError: wrong rank, dtype, or a non-contiguous tensor (the kernels index with the
            strides of a contiguous tensor).
    """
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name} must be one of {[str(d) for d in dtypes]}, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {x.stride()}")


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """Return the one device all ``tensors`` live on.

    Raises:
        ValueError: tensors on different devices (names them).
    """
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        raise ValueError(f"tensors on different devices: {devices}")
    return first


@dataclass(frozen=True)
class KVPages:
    """One pool of KV pages at one precision (keys and values of every layer-local page).

    A 16-bit pool holds plain tensors; a quantized pool holds codes plus per-group metadata in
    the :class:`QuantizedKV` layout with ``T = page_size``. ``N`` pages of ``P`` tokens::

        bits == 16:  k, v      [N, P, H, D]              fp16 / bf16 / fp32
        bits in 8/4: k, v      [N, P, H, D * bits / 8]   uint8 codes
                     k_scale, k_zero_point  [N, P / G, H, D]   fp16
                     v_scale, v_zero_point  [N, P, H, D / G]   fp16

    Attributes:
        k: keys (or key codes).
        v: values (or value codes).
        bits: 16, 8 or 4.
        group_size: ``G`` for a quantized pool, ``None`` for a 16-bit one.
        k_scale, k_zero_point, v_scale, v_zero_point: metadata of a quantized pool.
    """

    k: torch.Tensor
    v: torch.Tensor
    bits: int = 16
    group_size: int | None = None
    k_scale: torch.Tensor | None = None
    k_zero_point: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    v_zero_point: torch.Tensor | None = None

    @classmethod
    def from_quantized(cls, k: QuantizedKV, v: QuantizedKV, page_size: int) -> KVPages:
        """Cut quantized keys and values of ``N * page_size`` tokens into ``N`` pages.

        Raises:
            ValueError: token counts that are not a multiple of ``page_size``, a page size
                that is not a multiple of the group size, or mismatched keys and values.
        """
        if k.kind is not KVKind.KEY or v.kind is not KVKind.VALUE:
            raise ValueError("from_quantized needs keys then values")
        if (k.bits, k.group_size, k.num_tokens) != (v.bits, v.group_size, v.num_tokens):
            raise ValueError("keys and values differ in bits, group size or token count")
        if k.num_tokens % page_size or page_size % k.group_size:
            raise ValueError(
                f"{k.num_tokens} tokens do not fill pages of {page_size} tokens made of "
                f"{k.group_size}-token key groups"
            )

        def paged(t: torch.Tensor, tokens_per_row: int) -> torch.Tensor:
            return t.view(-1, page_size // tokens_per_row, *t.shape[1:])

        return cls(
            k=paged(k.codes, 1),
            v=paged(v.codes, 1),
            bits=k.bits,
            group_size=k.group_size,
            k_scale=paged(k.scale, k.group_size),
            k_zero_point=paged(k.zero_point, k.group_size),
            v_scale=paged(v.scale, 1),
            v_zero_point=paged(v.zero_point, 1),
        )

    @property
    def num_pages(self) -> int:
        """``N``."""
        return int(self.k.shape[0])

    @property
    def page_size(self) -> int:
        """``P``, tokens per page."""
        return int(self.k.shape[1])

    @property
    def num_kv_heads(self) -> int:
        """``H``."""
        return int(self.k.shape[2])

    @property
    def head_dim(self) -> int:
        """``D``."""
        return int(self.k.shape[3]) * 8 // self.bits if self.bits != 16 else int(self.k.shape[3])

    def page_keys(self, pages: torch.Tensor) -> QuantizedKV:
        """Keys of ``pages`` (a 1-D index tensor) as one :class:`QuantizedKV` of their tokens."""
        return self._gather(pages, KVKind.KEY)

    def page_values(self, pages: torch.Tensor) -> QuantizedKV:
        """Values of ``pages`` as one :class:`QuantizedKV` of their tokens."""
        return self._gather(pages, KVKind.VALUE)

    def _gather(self, pages: torch.Tensor, kind: KVKind) -> QuantizedKV:
        if self.bits == 16 or self.group_size is None:
            raise ValueError("a 16-bit pool has no codes")
        key = kind is KVKind.KEY
        codes, scale, zero = (
            (self.k, self.k_scale, self.k_zero_point)
            if key
            else (self.v, self.v_scale, self.v_zero_point)
        )
        assert scale is not None and zero is not None
        return QuantizedKV(
            codes=codes[pages].flatten(0, 1),
            scale=scale[pages].flatten(0, 1),
            zero_point=zero[pages].flatten(0, 1),
            kind=kind,
            bits=self.bits,
            group_size=self.group_size,
            head_dim=self.head_dim,
        )
