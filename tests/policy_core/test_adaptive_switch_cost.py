"""The adaptive reuse predictor's switch rule charges a switch its measured cost (issue 22).

Exact checks on hand-made sequences: the two experts are scripted caches (their content after
each request is given), so every hit, the cache's own content and the switch instants can be
worked out by hand.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from superinfer.policy_core.reuse_adaptive import AdaptiveCache, AdaptiveConfig
from superinfer.policy_core.reuse_blocks import BlockCache


class Scripted(BlockCache):
    """A cache whose content after request ``i`` is ``script[i]``."""

    def __init__(self, script: Sequence[set[int]], n: int) -> None:
        super().__init__(2, [-1] * n, [0] * n)
        self.script, self.i, self.held = script, 0, set[int]()

    def __contains__(self, block: object) -> bool:
        return block in self.held

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        new = self.script[self.i]
        self.i += 1
        gone = sorted((self.held | set(blocks)) - new)
        self.held = set(new)
        return gone


# Requests (one block each) and the experts' content after each: A ("lru", the cold start)
# and B ("lfu").
SEQ = [1, 9, 3, 6, 7, 8, 5, 8, 5, 8, 8, 5, *[6] * 6]
A = [{1}, {1, 9}, {9, 3}, {3, 6}, {5, 8}, *[{5, 8}] * 13]
B = [{1, 9}, {1, 9}, {6, 7}, *[{6, 7}] * 15]


def run(switch_cost: float) -> AdaptiveCache:
    # No decay (the scores are hit counts), no relative margin, a lead of 1 hit suffices.
    cfg = AdaptiveConfig(
        experts=("lru", "lfu"), half_life_blocks=1e300, switch_margin=0.0, min_lead=1.0,
        switch_cost=switch_cost,
    )  # fmt: skip
    ada = AdaptiveCache(2, [-1] * 10, [0] * 10, cfg)
    ada.experts = {"lru": Scripted(A, 10), "lfu": Scripted(B, 10)}
    for t, b in enumerate(SEQ):
        ada.request([b], float(t))
    return ada


def test_a_switch_is_charged_the_hits_it_cost() -> None:
    # r1 (9): B hits, A and the cache miss: B leads by 1, switch at 2 references (the cold-start
    # tenure cost nothing). Its content {1, 9} is B's, then B holds {6, 7}: r2 (3) evicts 1
    # (the oldest block B does not hold), r3 (6) B hits, the cache misses and evicts 9, r4 (7)
    # B hits, the cache misses and evicts 3: {6, 7}, B's content; this tenure cost 2 hits.
    # From r5 A holds {5, 8} and hits every request (B and the cache miss): A = 1, 2, 3, 4, 5
    # against B's 3 after r5..r9. Without the charge A's lead of 1 after r8 switches (9
    # references); charged the 2 hits the tenure cost so far, it needs a lead of 2: after r9.
    free, charged = run(0.0), run(1.0)
    assert free.switches[:2] == [(2, "lru", "lfu"), (9, "lfu", "lru")]
    assert charged.switches[:2] == [(2, "lru", "lfu"), (10, "lfu", "lru")]
    assert charged.switch_costs[:2] == [0.0, 2.0]
    # The switch comes before r9's eviction: the cache held {6, 7, 8} and drops 6, which A
    # does not hold; r10 (8) hits, r11 (5) misses where A hits and evicts 7: {8, 5}, A's
    # content; this tenure cost 1. From r12 every request is 6, which only B holds: B = 4..9
    # against A's 7. Free, B's lead of 1 after r16 switches back (17 references); charged
    # max(last switch 2, this tenure 1) = 2 hits, B needs a lead of 2: after r17.
    assert free.switches[2:] == [(17, "lru", "lfu")]
    assert charged.switches[2:] == [(18, "lru", "lfu")]
    assert charged.switch_costs == [0.0, 2.0, 1.0]
    assert charged.scores == {"lru": 7.0, "lfu": 9.0}


def test_switch_cost_must_be_non_negative() -> None:
    with pytest.raises(ValueError, match="switch_cost"):
        AdaptiveConfig(switch_cost=-1.0)
