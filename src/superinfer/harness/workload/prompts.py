"""Prompts of exact token lengths cut from real ShareGPT text (the real engines' prompts)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from superinfer.harness.errors import DataError
from superinfer.harness.workload.data import trace_path

__all__ = ["SHAREGPT_FILE", "PromptBuilder", "hashed_prompt_ids", "load_sharegpt_prompts"]

#: The ShareGPT conversations file (shared/data/traces) the prompts are cut from.
SHAREGPT_FILE = "ShareGPT_V3_filtered_500.json"


def load_sharegpt_prompts(path: Path | None = None) -> list[str]:
    """First-turn user prompts of ``ShareGPT_V3_filtered_500.json`` (shared/data/traces).

    Raises:
        DataError: missing file, or not the expected JSON (names the file and the entry).
    """
    path = path or trace_path(SHAREGPT_FILE, download=False)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read ShareGPT prompts ({exc})") from None
    if not isinstance(data, list) or not data:
        raise DataError(f"{path}: expected a non-empty JSON array of conversations")
    prompts = []
    for i, entry in enumerate(data):
        try:
            text = entry["conversations"][0]["value"]
        except (KeyError, IndexError, TypeError):
            raise DataError(f"{path}: entry {i}: no conversations[0].value") from None
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{path}: entry {i}: empty prompt")
        prompts.append(text)
    return prompts


class PromptBuilder:
    """Prompts of exact token lengths cut from real ShareGPT text.

    The prompts are tokenized once and laid end to end (separated by a blank line) in an order
    drawn from ``seed``; request ``i`` starts at the ``i``-th prompt of that order and takes as
    many tokens as it needs, running into the following prompts when one is too short.

    Args:
        tokenizer: the model's tokenizer (``__call__`` returning ``input_ids``).
        texts: the prompts (:func:`load_sharegpt_prompts`).
        seed: seed of the order.
    """

    def __init__(self, tokenizer: Any, texts: Sequence[str], seed: int = 0) -> None:
        order = np.random.default_rng(seed).permutation(len(texts))
        sep = list(tokenizer("\n\n", add_special_tokens=False)["input_ids"])
        self._stream: list[int] = []
        self._starts: list[int] = []
        for k in order:
            self._starts.append(len(self._stream))
            self._stream.extend(tokenizer(texts[k], add_special_tokens=False)["input_ids"])
            self._stream.extend(sep)

    def build(self, index: int, num_tokens: int) -> list[int]:
        """Token ids of request ``index``'s prompt, exactly ``num_tokens`` long."""
        start = self._starts[index % len(self._starts)]
        out: list[int] = []
        while len(out) < num_tokens:
            take = self._stream[start : start + num_tokens - len(out)]
            out.extend(take)
            start = 0
        return out


#: Token ids below this are left out of hashed prompts (special and byte tokens sit low in the
#: SmolLM2 and Llama vocabularies).
HASHED_MIN_ID = 256


def hashed_prompt_ids(
    block_hashes: Sequence[int],
    block_tokens: int,
    num_tokens: int,
    *,
    vocab_size: int,
    seed: int = 0,
    index: int = 0,
) -> list[int]:
    """Token ids of a prompt whose prefix sharing follows its block hashes, ``num_tokens`` long.

    Each hash stands for one fixed block of ``block_tokens`` token ids drawn uniformly from
    ``[HASHED_MIN_ID, vocab_size)`` by a generator seeded with ``(seed, hash)``: equal hashes give
    equal blocks, so two prompts whose leading hashes agree share exactly that many tokens of
    prefix in a server's radix or block cache, and differ from the first differing block on (two
    distinct blocks agree on a token with probability ``1 / (vocab_size - HASHED_MIN_ID)``). A
    prompt longer than its blocks is filled with ids seeded by ``(seed, index)``, its own; a
    shorter one is the prefix of its blocks. Mooncake's ``hash_ids`` (512 tokens) and the
    generated traces' hashes (64) are prefix-chained, as this needs.

    Args:
        block_hashes: the prompt's block hashes, first block first (non-negative ints; others
            are taken modulo 2**64).
        block_tokens: tokens per hashed block (> 0).
        num_tokens: the prompt's length in tokens.
        vocab_size: the model's vocabulary size (> ``HASHED_MIN_ID``).
        seed: seed of every block's ids.
        index: the request's index, seeding its own filler.

    Raises:
        ValueError: ``block_tokens < 1`` or ``vocab_size <= HASHED_MIN_ID``.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    if vocab_size <= HASHED_MIN_ID:
        raise ValueError(f"vocab_size must be > {HASHED_MIN_ID}, got {vocab_size}")
    out: list[int] = []
    for h in block_hashes:
        if len(out) >= num_tokens:
            break
        h %= 1 << 64
        rng = np.random.default_rng([seed, h & 0xFFFFFFFF, h >> 32])
        out.extend(rng.integers(HASHED_MIN_ID, vocab_size, block_tokens).tolist())
    if len(out) < num_tokens:
        # 1 << 40 is above any hash's high word (< 2**32): no block is seeded alike
        rng = np.random.default_rng([seed, 1 << 40, index])
        out.extend(rng.integers(HASHED_MIN_ID, vocab_size, num_tokens - len(out)).tolist())
    return out[:num_tokens]
