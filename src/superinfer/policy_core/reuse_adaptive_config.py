"""The adaptive reuse predictor's hyperparameters (:class:`AdaptiveConfig`) and the names of
its variants (issue 22), for :class:`~superinfer.policy_core.reuse_adaptive.AdaptiveCache`.

Pure: stdlib.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ADAPTIVE_EXPERTS", "AdaptiveConfig", "adaptive_sample_rate", "lrfu_half_life"]

#: The shadow policies of :class:`AdaptiveCache`, in tie-break order (first wins a tie).
ADAPTIVE_EXPERTS = ("lru", "arc", "s3fifo", "lfu", "lrfu20", "lrfu200", "hazard")


@dataclass(frozen=True, slots=True)
class AdaptiveConfig:
    """Hyperparameters of :class:`AdaptiveCache` (chosen a priori, not tuned per trace).

    Attributes:
        experts: shadow policies (names of :func:`make_block_cache`); the first is the cold
            start.
        half_life_blocks: half-life of the hit scores, in block references.
        switch_margin: a policy takes the lead when its score exceeds the leader's by this
            fraction of the decayed block references (a lead in hit rate, 0.003 = 0.3 points)
            and by ``min_lead`` hits.
        min_lead: absolute lead needed, in decayed hit blocks.
        switch_cost: the lead must also exceed this multiple of the measured cost of a switch:
            the hits the cache lost to its leader (the leader's HBM prefix hits minus its own)
            over the last leader's tenure, while its content converged to the leader's (or over
            the current tenure so far, if more); 0: off.
        sample_rate: fraction R in (0, 1] of the blocks the shadow caches see (a fixed spatial
            sample; shadows of ``capacity * R`` blocks, hits scaled by 1/R; Waldspurger et al.,
            USENIX ATC 2017); 1: unsampled, full-size shadows (the default).
        warm_window: with ``sample_rate`` < 1, the block references (as a multiple of the
            full-size leader's capacity) replayed to warm a new leader's full-size cache.

    Raises:
        ValueError: an unknown expert or a value out of range.
    """

    experts: tuple[str, ...] = ADAPTIVE_EXPERTS
    half_life_blocks: float = 20_000.0
    switch_margin: float = 0.003
    min_lead: float = 5.0
    switch_cost: float = 1.0
    sample_rate: float = 1.0
    warm_window: float = 2.0

    def __post_init__(self) -> None:
        known = ("lru", "lfu", "arc", "s3fifo", "learned", "hazard")
        if not self.experts or any(e not in known and lrfu_half_life(e) is None
                                   for e in self.experts):  # fmt: skip
            raise ValueError(
                f"experts must be among {', '.join(known)}, lrfuH (H s): {self.experts}"
            )
        if not self.half_life_blocks > 0:
            raise ValueError(f"half_life_blocks must be > 0, got {self.half_life_blocks}")
        if min(self.switch_margin, self.min_lead, self.switch_cost) < 0:
            raise ValueError("switch_margin, min_lead and switch_cost must be >= 0")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate}")
        if not self.warm_window > 0:
            raise ValueError(f"warm_window must be > 0, got {self.warm_window}")


def adaptive_sample_rate(name: str) -> float | None:
    """``adaptive-sN`` -> 1/N, the adaptive predictor with shadows sampled at rate 1/N
    (:attr:`AdaptiveConfig.sample_rate`; N an integer >= 1); None for any other name."""
    if not name.startswith("adaptive-s") or not name[10:].isdigit() or int(name[10:]) < 1:
        return None
    return 1.0 / int(name[10:])


def lrfu_half_life(name: str) -> float | None:
    """``lrfuH`` -> H (a half-life in s, > 0); None for any other name."""
    if not name.startswith("lrfu"):
        return None
    try:
        h = float(name[4:])
    except ValueError:
        return None
    return h if h > 0 and math.isfinite(h) else None
