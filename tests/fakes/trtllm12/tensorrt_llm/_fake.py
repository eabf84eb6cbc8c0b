"""Test-only controls of the double (no counterpart in TensorRT-LLM)."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A manual clock in seconds; the double's executor advances it by one step time per step."""

    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
