"""Exact KV-cache byte accounting per precision: codes, scales and zero points included.

The layout is the one the kernels store (``superinfer.kernels.layout``; KIVI grouping, Liu et
al., ICML 2024): per layer and KV head, with ``D`` channels, ``G`` the group size and ``b`` bits::

    keys    codes D*b/8 bytes per token; fp16 scale + fp16 zero point per channel per G tokens
    values  codes D*b/8 bytes per token; fp16 scale + fp16 zero point per G channels per token
    => whole groups: D*b/4 + 8*D/G bytes per token (K and V together)

A quantized sequence of ``n`` tokens keeps its last ``n % G`` tokens unquantized at 16 bits
(KIVI's residual: a key group is quantized once its ``G`` tokens exist). FP16 is 2 bytes per
element, FP8 1 byte (its per-tensor scales, as vLLM's ``k_scale`` / ``v_scale``, are a few bytes
per layer, independent of tokens, and not counted). Counts cover every layer and every KV head
of the model, across all tensor-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.policy_core.types import KVPrecision

__all__ = [
    "DEFAULT_GROUP_SIZE",
    "META_BYTES",
    "KVPacking",
    "kv_bytes_per_token",
    "kv_bytes_ratio",
    "kv_page_bytes",
    "kv_sequence_bytes",
]

DEFAULT_GROUP_SIZE = 32  # KIVI's group size (Liu et al., ICML 2024, section 4)
META_BYTES = 2  # one fp16 scale or zero point
_BITS = {KVPrecision.FP16: 16, KVPrecision.FP8: 8, KVPrecision.INT8: 8, KVPrecision.INT4: 4}
_GROUPED = (KVPrecision.INT8, KVPrecision.INT4)


def _check(
    num_layers: int, num_kv_heads: int, head_dim: int, precision: KVPrecision, group_size: int
) -> None:
    if min(num_layers, num_kv_heads, head_dim) < 1:
        raise ValueError(
            f"num_layers, num_kv_heads, head_dim must be >= 1, got "
            f"{num_layers}, {num_kv_heads}, {head_dim}"
        )
    if precision in _GROUPED:
        if group_size < 2 or group_size & (group_size - 1):
            raise ValueError(f"group_size must be a power of two >= 2, got {group_size}")
        if head_dim % group_size or head_dim % 2:
            raise ValueError(
                f"head_dim {head_dim} must be even and a multiple of group_size {group_size} "
                "(values are grouped per group_size channels)"
            )


def _group_bytes_per_layer_head(head_dim: int, bits: int, group_size: int) -> int:
    """K+V bytes of one whole group of ``group_size`` tokens, one layer, one KV head."""
    codes = 2 * group_size * head_dim * bits // 8
    key_meta = 2 * META_BYTES * head_dim  # scale + zero point per channel, once per group
    value_meta = 2 * META_BYTES * (head_dim // group_size) * group_size  # per token per group
    return codes + key_meta + value_meta


def kv_sequence_bytes(
    num_tokens: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    precision: KVPrecision,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> int:
    """Exact bytes the KV of one sequence of ``num_tokens`` tokens occupies.

    Args:
        num_tokens: tokens with KV (prompt plus generated so far).
        num_layers: transformer layers.
        num_kv_heads: KV heads (all TP ranks).
        head_dim: channels per head.
        precision: storage precision.
        group_size: ``G`` for INT8 / INT4 (ignored otherwise).

    Returns:
        Bytes: codes, scales and zero points of whole groups, plus the 16-bit residual.

    Raises:
        ValueError: negative ``num_tokens``, non-positive shapes, or a group size that does not
            fit ``head_dim``.
    """
    _check(num_layers, num_kv_heads, head_dim, precision, group_size)
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    per_layer_head_16 = 2 * head_dim * 2  # K and V, 2 bytes each
    if precision not in _GROUPED:
        per_token = 2 * head_dim * _BITS[precision] // 8
        return num_tokens * num_layers * num_kv_heads * per_token
    groups, residual = divmod(num_tokens, group_size)
    per_layer_head = (
        groups * _group_bytes_per_layer_head(head_dim, _BITS[precision], group_size)
        + residual * per_layer_head_16
    )
    return num_layers * num_kv_heads * per_layer_head


def kv_bytes_per_token(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    precision: KVPrecision,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> float:
    """Bytes per token of KV in whole groups (the long-sequence rate; residual excluded).

    ``kv_sequence_bytes(n) == n * kv_bytes_per_token()`` whenever ``n`` is a multiple of
    ``group_size``. The value is exact (a multiple of ``8 / group_size``, representable in a
    float for power-of-two groups).

    Raises:
        ValueError: as :func:`kv_sequence_bytes`.
    """
    _check(num_layers, num_kv_heads, head_dim, precision, group_size)
    g = group_size if precision in _GROUPED else 1
    return kv_sequence_bytes(g, num_layers, num_kv_heads, head_dim, precision, group_size) / g


def kv_bytes_ratio(
    head_dim: int, precision: KVPrecision, group_size: int = DEFAULT_GROUP_SIZE
) -> float:
    """Bytes per token relative to FP16 (e.g. 0.3125 for INT4, ``head_dim`` 128, ``G`` 32)."""
    return kv_bytes_per_token(1, 1, head_dim, precision, group_size) / (4 * head_dim)


def kv_page_bytes(
    page_size_tokens: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    precision: KVPrecision,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> int:
    """Bytes of one full page of ``page_size_tokens`` tokens in the pool of ``precision``.

    Raises:
        ValueError: a quantized page that is not a whole number of groups, or as
            :func:`kv_sequence_bytes`.
    """
    if precision in _GROUPED and page_size_tokens % group_size:
        raise ValueError(
            f"page of {page_size_tokens} tokens is not whole {group_size}-token groups"
        )
    return kv_sequence_bytes(
        page_size_tokens, num_layers, num_kv_heads, head_dim, precision, group_size
    )


@dataclass(frozen=True, slots=True)
class KVPacking:
    """How an engine packs a quantized request's KV into its FP16-sized pages.

    The simulator stores a request's KV at the request's precision, in its exact bytes
    (:func:`kv_sequence_bytes`), in pages of ``block_bytes`` (one FP16 page), so a quantized
    request holds fewer pages than its tokens would fill at FP16. An engine that packs this way
    hands its packing over in ``StepState.kv_packing``, and the block arithmetic that policies
    and the decision check share (``policy_core.batching.step_blocks``) counts with it; an
    engine that pages every request at FP16 gives none.

    Attributes:
        num_layers, num_kv_heads, head_dim: the model's KV shape (KV heads of every TP rank).
        group_size: ``G`` of INT8 / INT4 KV.
        block_bytes: bytes of one page (``block_size_tokens`` FP16 tokens across the replica).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    group_size: int
    block_bytes: int

    def blocks(self, num_tokens: int, precision: KVPrecision) -> int:
        """Pages ``num_tokens`` tokens of KV at ``precision`` fill (not monotone in
        ``num_tokens``: completing a group quantizes its FP16 residual).

        Raises:
            ValueError: as :func:`kv_sequence_bytes`.
        """
        size = kv_sequence_bytes(num_tokens, self.num_layers, self.num_kv_heads,
                                 self.head_dim, precision, self.group_size)  # fmt: skip
        return -(-size // self.block_bytes)

    def tokens_that_fit(self, num_tokens: int, precision: KVPrecision, blocks: int) -> int:
        """Tokens a sequence of ``num_tokens`` tokens at ``precision`` can add, one at a time,
        while its KV stays within ``blocks`` pages (0 if none), for a grouped precision at most
        to the end of its current group: there the FP16 residual is quantized, the sequence
        shrinks, and an engine that pages exactly (the simulator frees the surplus) holds fewer
        pages, so what fits after that is counted again from there."""
        size = kv_sequence_bytes(num_tokens, self.num_layers, self.num_kv_heads,
                                 self.head_dim, precision, self.group_size)  # fmt: skip
        room = blocks * self.block_bytes - size
        if room <= 0:
            return 0
        heads = self.num_layers * self.num_kv_heads
        if precision not in _GROUPED:
            return room // (heads * 2 * self.head_dim * _BITS[precision] // 8)
        residual_token = heads * 4 * self.head_dim  # K and V of one FP16 token
        return min(room // residual_token, self.group_size - num_tokens % self.group_size)
