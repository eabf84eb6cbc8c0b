"""Double of ``tensorrt_llm.sampling_params``: the fields the adapter reads."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SamplingParams"]


@dataclass
class SamplingParams:
    max_tokens: int = 32
    end_id: int | None = None
    pad_id: int | None = None
    ignore_eos: bool = False
    temperature: float | None = None
    n: int = 1
