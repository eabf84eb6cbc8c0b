"""Prompts of exact token lengths cut from real ShareGPT text (the real engines' prompts)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from superinfer.harness.errors import DataError
from superinfer.harness.workload.data import trace_path

__all__ = ["SHAREGPT_FILE", "PromptBuilder", "load_sharegpt_prompts"]

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
