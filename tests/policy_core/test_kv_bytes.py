"""Exact KV byte accounting (policy_core.kv_bytes), hand-computed.

Per layer and KV head, head_dim D, group G, b bits: whole groups take D*b/4 + 8*D/G bytes per
token (K and V codes, fp16 scale and zero point per key channel per G tokens and per value
channel group per token); the last n % G tokens of a quantized sequence take 4*D bytes each.
"""

from __future__ import annotations

import pytest

from superinfer.policy_core.kv_bytes import (
    KVPacking,
    kv_bytes_per_token,
    kv_bytes_ratio,
    kv_page_bytes,
    kv_sequence_bytes,
)
from superinfer.policy_core.types import KVPrecision as P

LLAMA_70B = (80, 8, 128)  # layers, KV heads, head_dim
SMOLLM2_135M = (30, 3, 64)


@pytest.mark.parametrize(
    ("precision", "group", "expected"),
    [
        (P.FP16, 32, 327_680),  # 2 * 80 * 8 * 128 * 2, as sim ModelSpec.kv_bytes_per_token()
        (P.FP8, 32, 163_840),
        (P.INT8, 32, 184_320),  # 640 layer-heads * (128*8/4 + 8*128/32 = 256 + 32)
        (P.INT4, 32, 102_400),  # 640 * (128 + 32)
        (P.INT4, 128, 87_040),  # 640 * (128 + 8)
        (P.INT8, 64, 174_080),  # 640 * (256 + 16)
    ],
)
def test_bytes_per_token_llama_70b(precision: P, group: int, expected: int) -> None:
    assert kv_bytes_per_token(*LLAMA_70B, precision, group) == expected


def test_sequence_bytes_count_whole_groups_and_the_16_bit_residual() -> None:
    # 100 tokens, int4, G=32: 3 groups of (K+V codes 2*32*64*4/8 = 2048 + key meta 4*64 = 256
    # + value meta 32 tokens * 2 groups * 4 = 256 -> 2560 bytes) + 4 residual tokens * 256 bytes
    # = 8704 per layer-head; 90 layer-heads.
    assert kv_sequence_bytes(100, *SMOLLM2_135M, P.INT4, 32) == 783_360
    assert kv_sequence_bytes(31, *SMOLLM2_135M, P.INT4, 32) == 31 * 90 * 256  # all residual
    assert kv_sequence_bytes(0, *SMOLLM2_135M, P.INT8, 32) == 0
    assert kv_sequence_bytes(100, *SMOLLM2_135M, P.FP16) == 100 * 90 * 256


def test_per_token_rate_is_the_sequence_bytes_of_whole_groups() -> None:
    for n in (32, 64, 4096):
        assert kv_sequence_bytes(n, *LLAMA_70B, P.INT4, 32) == n * kv_bytes_per_token(
            *LLAMA_70B, P.INT4, 32
        )


def test_ratio_and_page_bytes() -> None:
    assert kv_bytes_ratio(128, P.INT4, 32) == 0.3125
    assert kv_bytes_ratio(128, P.INT8, 32) == 0.5625
    assert kv_bytes_ratio(64, P.INT4, 16) == 0.375
    assert kv_bytes_ratio(128, P.FP16) == 1.0
    assert kv_page_bytes(64, 1, 1, 128, P.INT4, 32) == 64 * 160
    with pytest.raises(ValueError, match="not whole 32-token groups"):
        kv_page_bytes(48, 1, 1, 128, P.INT4, 32)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((10, 1, 1, 48, P.INT4, 32), "multiple of group_size"),
        ((10, 1, 1, 64, P.INT4, 24), "power of two"),
        ((-1, 1, 1, 64, P.INT8, 32), "num_tokens must be >= 0"),
        ((10, 0, 1, 64, P.FP16, 32), ">= 1"),
    ],
)
def test_bad_arguments_raise(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        kv_sequence_bytes(*args)


#: Llama-3.1-70B in 16-token FP16 pages: 16 * 327,680 bytes.
PACK_70B = KVPacking(80, 8, 128, 32, 16 * 327_680)


@pytest.mark.parametrize(
    ("tokens", "precision", "pages"),
    [
        (352, P.INT8, 13),  # 11 groups: 640 * 11 * 9,216 = 64,880,640 bytes = 12.375 pages
        (351, P.INT8, 14),  # 10 groups + 31 FP16 tokens: 640 * (92,160 + 15,872) = 13.19 pages
        (362, P.INT8, 13),  # 11 groups + 10 FP16 tokens: 68,157,440 bytes, 13 pages exactly
        (363, P.INT8, 14),
        (32, P.FP8, 1),  # 32 * 163,840 bytes = one page
        (33, P.FP8, 2),
        (17, P.FP16, 2),  # FP16: ceil(tokens / 16)
    ],
)
def test_packing_counts_pages_of_the_exact_bytes(tokens: int, precision: P, pages: int) -> None:
    assert PACK_70B.blocks(tokens, precision) == pages


@pytest.mark.parametrize(
    ("tokens", "precision", "blocks", "fit"),
    [
        (352, P.INT8, 13, 10),  # room 3,276,800 bytes = 10 FP16 residual tokens
        (362, P.INT8, 13, 0),  # full: the next token needs a page
        # 14 pages hold 13 more FP16 tokens, but the group ends after 1: there it shrinks to
        # 12.375 pages, and an exact pager frees one (the simulator's case this guards)
        (351, P.INT8, 14, 1),
        (10, P.FP8, 1, 22),  # (5,242,880 - 1,638,400) / 163,840
        (20, P.FP16, 2, 12),
    ],
)
def test_packing_tokens_that_fit_stop_at_the_group_end(
    tokens: int, precision: P, blocks: int, fit: int
) -> None:
    assert PACK_70B.tokens_that_fit(tokens, precision, blocks) == fit
