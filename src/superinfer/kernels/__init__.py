"""Triton kernels for quantized KV (one op per module), their pure-torch references, and dispatch.

Importing this package runs nothing: Triton builds kernels lazily. Set ``TRITON_INTERPRET=1``
before the first import to run the kernels on CPU tensors in Triton's interpreter.
"""

from superinfer.kernels.dequantize_kv import dequantize_kv, dequantize_kv_ref
from superinfer.kernels.dispatch import HAS_TRITON, select_backend
from superinfer.kernels.layout import KVKind, KVPages, QuantizedKV
from superinfer.kernels.paged_decode_attention import (
    paged_decode_attention,
    paged_decode_attention_ref,
)
from superinfer.kernels.paged_kv import PagedKV, pack_paged_kv
from superinfer.kernels.quantize_kv import quantize_kv, quantize_kv_ref

__all__ = [
    "HAS_TRITON",
    "KVKind",
    "KVPages",
    "PagedKV",
    "QuantizedKV",
    "dequantize_kv",
    "dequantize_kv_ref",
    "pack_paged_kv",
    "paged_decode_attention",
    "paged_decode_attention_ref",
    "quantize_kv",
    "quantize_kv_ref",
    "select_backend",
]
