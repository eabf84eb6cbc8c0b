"""A transformers KV cache that stores K/V through ``quantize_kv`` / ``dequantize_kv``.

Each batch row has its own storage format (full precision, fp16, or int8 / int4 with KIVI
grouping), so one batch can hold the same sequence at several precisions and compare them in one
pass. Storage follows the paged kernel's layout (:mod:`superinfer.kernels.paged_decode_attention`):
tokens in whole key groups are quantized, the last ``n % G`` tokens stay in full precision
(KIVI's residual, Liu et al. ICML 2024), and a step's own new tokens are attended in full
precision (what a prefill kernel does before the cache write).

A group is quantized once, when it completes; the layer keeps its dequantized values (exactly
``dequantize_kv(quantize_kv(x))``) and the byte count of its codes, scales and zero points, so a
decode step does not dequantize the whole cache again. This is a measurement cache (accuracy of
a storage format), not a memory-saving one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from superinfer.kernels import KVKind, dequantize_kv, quantize_kv
from superinfer.kernels.dispatch import Backend
from superinfer.policy_core.types import KVPrecision

__all__ = ["KVFormat", "KIVICacheLayer", "make_kivi_cache"]


@dataclass(frozen=True, slots=True)
class KVFormat:
    """How one batch row stores its KV.

    Attributes:
        precision: ``None`` keeps the model's dtype (the unquantized reference); FP16 rounds to
            fp16; INT8 / INT4 quantize with KIVI grouping.
        group_size: ``G`` for INT8 / INT4.
    """

    precision: KVPrecision | None
    group_size: int | None = None

    def __post_init__(self) -> None:
        quantized = self.precision in (KVPrecision.INT8, KVPrecision.INT4)
        if quantized != (self.group_size is not None):
            raise ValueError(f"group_size is needed exactly for int8/int4, got {self}")
        if self.precision is KVPrecision.FP8:
            raise ValueError("fp8 KV storage is not implemented by the kernels")

    @property
    def bits(self) -> int:
        """Bits per stored element (32 stands for the model's own dtype)."""
        return {None: 32, KVPrecision.FP16: 16, KVPrecision.INT8: 8, KVPrecision.INT4: 4}[
            self.precision
        ]


class KIVICacheLayer(DynamicLayer):
    """One attention layer's cache; rows are stored in their own :class:`KVFormat`.

    K/V tensors are ``[rows, kv_heads, tokens, head_dim]`` (transformers' layout). A prefill of
    batch 1 is shared by every row (its attention runs in full precision anyway); later steps
    must have one row per format.
    """

    def __init__(self, formats: Sequence[KVFormat], backend: Backend | None = "ref") -> None:
        super().__init__()
        if not formats:
            raise ValueError("need at least one row format")
        self.formats = tuple(formats)
        self.backend = backend
        self.quantized_tokens = [0] * len(formats)  # per row: tokens held as codes
        self.quantized_bytes = [0] * len(formats)  # per row: bytes of codes, scales, zero points

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = len(self.formats)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        old = self.get_seq_length()
        if key_states.shape[0] not in (1, rows) or (key_states.shape[0] != rows and old):
            raise ValueError(
                f"batch {key_states.shape[0]} does not fit {rows} row formats after {old} tokens"
            )
        new_k = key_states.expand(rows, -1, -1, -1)
        new_v = value_states.expand(rows, -1, -1, -1)
        if old:
            assert self.keys is not None and self.values is not None
            out_k = torch.cat((self.keys, key_states), dim=-2)
            out_v = torch.cat((self.values, value_states), dim=-2)
            keys = torch.cat((self.keys, new_k), dim=-2)
            values = torch.cat((self.values, new_v), dim=-2)
        else:
            out_k, out_v = key_states, value_states
            keys, values = new_k.clone(), new_v.clone()
        for row, fmt in enumerate(self.formats):
            self._store(keys, values, row, fmt, old)
        self.keys, self.values = keys, values
        return out_k, out_v

    def _store(
        self, keys: torch.Tensor, values: torch.Tensor, row: int, fmt: KVFormat, old: int
    ) -> None:
        """Bring row ``row`` of ``keys`` / ``values`` (tokens from ``old`` on are new, exact)
        into its format, in place."""
        if fmt.precision is None:
            return
        if fmt.precision is KVPrecision.FP16:
            for t in (keys, values):
                t[row, :, old:] = t[row, :, old:].to(torch.float16).to(t.dtype)
            return
        assert fmt.group_size is not None
        start = self.quantized_tokens[row]
        end = keys.shape[-2] // fmt.group_size * fmt.group_size
        if end <= start:
            return
        for t, kind in ((keys, KVKind.KEY), (values, KVKind.VALUE)):
            x = t[row, :, start:end].transpose(0, 1).contiguous()  # [tokens, heads, head_dim]
            q = quantize_kv(x, kind, fmt.bits, fmt.group_size, backend=self.backend)
            t[row, :, start:end] = dequantize_kv(q, t.dtype, backend=self.backend).transpose(0, 1)
            self.quantized_bytes[row] += q.nbytes
        self.quantized_tokens[row] = end


def make_kivi_cache(
    num_layers: int, formats: Sequence[KVFormat], backend: Backend | None = "ref"
) -> Cache:
    """A transformers ``Cache`` of ``num_layers`` :class:`KIVICacheLayer` (one format per row)."""
    return Cache(layers=[KIVICacheLayer(formats, backend) for _ in range(num_layers)])
