"""Opt-in fix for SGLang's CPU attention: a one-token extend attends like a decode.

SGLang 0.5.23's ``torch_native`` backend (``sglang/srt/layers/attention/torch_native_backend.py``,
``TorchNativeAttnBackend._run_sdpa_forward_extend``) runs every request of an extend batch with
its query padded to the request's whole context (``seq_len_kv`` rows, causal) and keeps the
last ``extend_seq_len`` rows: a request that extends by one token over an L-token context costs
an L x L attention per layer instead of 1 x L. With ``--enable-mixed-chunk`` every running
decode rides in the prefill batches as such a one-token extend, and the CPU server's mixed
steps took 1.9x the same work as separate batches (results/sglang-mixed-chunk/README.md).

With ``SUPERINFER_SGLANG_EXTEND_ROWS=1`` in a server's environment this module's entry point
(:func:`register`, plugin ``superinfer-extend-rows`` in group ``sglang.srt.plugins``) wraps that
method (an AROUND hook of SGLang's ``HookRegistry``) so that the one-token extends of a causal,
full-attention batch go to SGLang's decode path, ``_run_sdpa_forward_decode``, as a batch of
decodes (one query row over each request's keys; the padded square's last row to bf16 rounding:
the kernel sums in another order), and every other request of the batch goes to SGLang's own
extend function, unchanged (bit for bit). Nothing else changes; off by default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["ENV_EXTEND_ROWS", "extend_rows", "install_extend_rows", "register"]

ENV_EXTEND_ROWS = "SUPERINFER_SGLANG_EXTEND_ROWS"

_TARGET = (
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"
    "._run_sdpa_forward_extend"
)


def extend_rows(
    original: Callable[..., Any],
    backend: Any,
    query: Any,
    output: Any,
    k_cache: Any,
    v_cache: Any,
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    extend_prefix_lens: Any,
    extend_seq_lens: Any,
    encoder_lens: Any = None,
    **kwargs: Any,
) -> Any:
    """``_run_sdpa_forward_extend`` (same arguments and result: ``output`` filled, shape
    ``[num_tokens, num_heads, head_dim]``) with its one-token extends run as decodes.

    Falls back to ``original`` whole for what it was not written for: cross or encoder
    attention, a sliding window, a non-causal batch, or a batch without a one-token extend.
    """
    import torch

    window = kwargs.get("sliding_window_size")
    plain = encoder_lens is None and not kwargs.get("is_cross_attn") and kwargs.get("causal")
    ones = extend_seq_lens == 1
    if not plain or (window is not None and window > -1) or not bool(ones.any()):
        return original(
            backend, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
            seq_lens, extend_prefix_lens, extend_seq_lens, encoder_lens, **kwargs,
        )  # fmt: skip
    starts = torch.cumsum(extend_seq_lens, 0) - extend_seq_lens  # each request's first row
    rest = ~ones
    if bool(rest.any()):  # the other requests, gathered into a batch of their own
        rows = torch.cat(
            [
                torch.arange(int(s), int(s) + int(n))
                for s, n in zip(starts[rest], extend_seq_lens[rest], strict=True)
            ]
        )
        sub_out = output.new_empty((len(rows), *output.shape[1:]))
        original(
            backend, query[rows], sub_out, k_cache, v_cache, req_to_token,
            req_pool_indices[rest], seq_lens[rest], extend_prefix_lens[rest],
            extend_seq_lens[rest], None, **kwargs,
        )  # fmt: skip
        output[rows] = sub_out
    rows = starts[ones]  # one row each: SGLang's decode path on them, as a batch of decodes
    sub_out = output.new_empty((len(rows), *output.shape[1:]))
    backend._run_sdpa_forward_decode(
        query[rows], sub_out, k_cache, v_cache, req_to_token, req_pool_indices[ones],
        seq_lens[ones], scaling=kwargs.get("scaling"), enable_gqa=kwargs.get("enable_gqa", False),
        causal=False,
    )  # fmt: skip
    output[rows] = sub_out
    return output


def install_extend_rows() -> None:
    """Register :func:`extend_rows` with SGLang's ``HookRegistry`` (applied by
    ``load_plugins``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_TARGET, extend_rows, HookType.AROUND)


def register() -> None:
    """Entry point (``sglang.srt.plugins``, name ``superinfer-extend-rows``): installs the fix
    when ``SUPERINFER_SGLANG_EXTEND_ROWS`` is ``1``, does nothing otherwise."""
    if os.environ.get(ENV_EXTEND_ROWS) == "1":
        install_extend_rows()
