"""The adaptive predictor's spatially sampled shadow caches (issue 22: its cost).

Exact checks on a hand-made forest: which blocks are in the sample (the splitmix64 hash of the
id), the sampled forest, which references each sampled shadow sees and its capacity; and that
sample rate 1 makes exactly today's decisions (a digest of every eviction, CPU key, re-key and
leader on a seeded sequence, recorded from the unsampled predictor before sampling existed).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from superinfer.policy_core.reuse_adaptive import (
    AdaptiveCache,
    AdaptiveConfig,
    adaptive_sample_rate,
    make_block_cache,
)
from superinfer.policy_core.reuse_blocks import BlockCache, HeapCache
from superinfer.policy_core.reuse_sampled import (
    SAMPLE_SPACE,
    WarmLog,
    in_sample,
    sample_mask,
    sampled_forest,
    splitmix64,
)

# Three prompts: A = 0 1 2 3 4, B = 0 1 5 6 7 (shares 0 1 with A), C = 8 9 10 11.
PARENT = [-1, 0, 1, 2, 3, 1, 5, 6, -1, 8, 9, 10]
DEPTH = [0, 1, 2, 3, 4, 2, 3, 4, 0, 1, 2, 3]
A, B, C = [0, 1, 2, 3, 4], [0, 1, 5, 6, 7], [8, 9, 10, 11]


class Recorder(BlockCache):
    """Holds nothing; records the requests it is given."""

    def __init__(self, capacity: int, parent: Sequence[int]) -> None:
        super().__init__(capacity, parent, [0] * len(parent))
        self.seen: list[list[int]] = []

    def __contains__(self, block: object) -> bool:
        return False

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        self.seen.append(list(blocks))
        return []


def test_splitmix64_is_the_reference_finalizer() -> None:
    # splitmix64 seeded with 0 first outputs 0xE220A8397B1DCDAF (Steele et al. 2014).
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    # splitmix64(b) mod 2**24 for b = 0..4: 1953199, 154817, 9918158, 102381, 3377866.
    assert [splitmix64(b) % SAMPLE_SPACE for b in range(5)] == [
        1953199, 154817, 9918158, 102381, 3377866,
    ]  # fmt: skip


def test_the_sample_is_the_hash_below_the_rate() -> None:
    # At 1/4 a block is sampled when its hash mod 2**24 < 2**22 = 4194304: of 0..11, blocks
    # 0, 1, 3, 4 (3377866) and 7 (3280343); 2 (9918158), 5 (9028442), 6 (15720448), ... not.
    assert [b for b in range(12) if in_sample(b, 0.25)] == [0, 1, 3, 4, 7]
    assert [b for b, m in enumerate(sample_mask(12, 0.25)) if m] == [0, 1, 3, 4, 7]
    assert sample_mask(1000, 1 / 8) == [in_sample(b, 1 / 8) for b in range(1000)]
    assert all(sample_mask(1000, 1.0))
    # Each block is in the sample at a rate if it is at any higher one (nested samples).
    assert {b for b in range(24) if in_sample(b, 1 / 8)} == {0, 1, 3, 20, 23}
    assert {b for b in range(24) if in_sample(b, 1 / 2)} >= {0, 1, 3, 4, 7, 20, 23}


def test_the_sampled_forest_links_each_block_to_its_nearest_sampled_ancestor() -> None:
    mask = sample_mask(12, 0.25)  # 0, 1, 3, 4, 7
    # 2's parent 1 is sampled; 3's parent 2 is not, so 1; 4 -> 3; 5 -> 1; 6 -> 5 -> 1; 7 -> 1;
    # C has no sampled block: -1 throughout.
    assert sampled_forest(PARENT, mask) == [-1, 0, 1, 1, 3, 1, 1, 1, -1, -1, -1, -1]
    with pytest.raises(ValueError, match="parent ids"):
        sampled_forest([1, -1], [True, True])


def test_a_sampled_shadow_sees_the_sampled_blocks_of_each_request() -> None:
    cfg = AdaptiveConfig(experts=("lru", "lfu"), sample_rate=0.25)
    ada = AdaptiveCache(8, PARENT, DEPTH, cfg, cpu_capacity=16)
    # Capacities: HBM 8 * 1/4 = 2, its CPU tier 16 * 1/4 = 4, the union (8 + 16) / 4 = 6.
    assert ada.shadow_capacity == 2 and ada.shadow_cpu_capacity == 4
    assert [e.capacity for e in ada.experts.values()] == [2, 2]
    assert [u.capacity for u in ada.union.values()] == [6, 6]
    assert ada.experts["lru"].parent == [-1, 0, 1, 1, 3, 1, 1, 1, -1, -1, -1, -1]
    assert ada.follow is None  # LRU leads: the cache's own order is LRU's
    rec, urec = Recorder(2, PARENT), Recorder(6, PARENT)
    ada.experts["lfu"], ada.union["lfu"] = rec, urec
    for t, req in enumerate((A, B, C, A)):
        ada.request(req, float(t))
    assert rec.seen == urec.seen == [[0, 1, 3, 4], [0, 1, 7], [], [0, 1, 3, 4]]
    # The LRU shadow (2 blocks) keeps 0 1 of A (deeper blocks leave first on a tie), its CPU
    # tier (4 blocks) 4 3: B hits 0 1 (7 is new, and goes to the CPU tier), the second A all
    # 4 sampled blocks: 6 hits, counted x 4 (hits scaled by 1/R) = 24, decay aside.
    lru = ada.experts["lru"]
    assert isinstance(lru, HeapCache) and lru.content() == [0, 1]
    assert list(ada.shadow_cpu["lru"]) == [7, 4, 3]  # A took 4 3 back, then evicted them
    assert ada.scores["lru"] == pytest.approx(24.0, rel=0.01)
    assert ada.scores["lfu"] == 0.0
    # The real cache is full-size (8 blocks, LRU while LRU leads): C evicted A's 4 3 2 and B's
    # 7, the second A then B's 6 5 and C's 11.
    assert ada.content() == [0, 1, 2, 3, 4, 8, 9, 10]


def test_a_sampled_switch_follows_a_full_size_cache_warmed_on_the_recent_references() -> None:
    cfg = AdaptiveConfig(
        experts=("lru", "lfu"), half_life_blocks=1e300, switch_margin=0.0, min_lead=1.0,
        sample_rate=0.25, warm_window=1.0,
    )  # fmt: skip
    ada = AdaptiveCache(4, PARENT, DEPTH, cfg)
    rec = Recorder(1, PARENT)
    ada.experts["lru"] = rec  # the cold start never hits: LFU leads after its first hit
    ada.request(A, 0.0)
    ada.request(B, 1.0)  # LFU's shadow (0 1) hits 2 sampled blocks: it leads by 8
    assert ada.switches == [(10, "lru", "lfu")]
    follow = ada.follow
    # A full-size LFU (4 blocks) warmed on the last 4 references (warm_window 1 x 4): B alone.
    assert isinstance(follow, HeapCache) and follow.lfu and follow.capacity == 4
    assert follow.parent == PARENT and follow.content() == [0, 1, 5, 6]
    assert ada.lead_cache() is follow
    # The cache evicts first what its leader does not hold: 2, 3, 4 leave for B's 5 6 7 -> 7
    # is deepest and not held by LFU's 4 blocks (0 1 5 6).
    assert ada.content() == [0, 1, 5, 6]


SEQ_DIGEST = "79946bbcf7daf5390ae51566c6e6720f0fe1e2060e975c94c6286dda1866038d"


def _sequence(seed: int = 7, n: int = 400) -> tuple[list[int], list[int], list[list[int]]]:
    """A seeded random prefix forest and ``n`` requests (chains of 1..7 blocks)."""
    rnd = random.Random(seed)
    parent: list[int] = []
    depth: list[int] = []
    kids: dict[int, list[int]] = {}
    reqs = []
    for _ in range(n):
        node, blocks = -1, []
        for d in range(rnd.randint(1, 7)):
            opts = kids.setdefault(node, [])
            if opts and rnd.random() < 0.8:
                nxt = opts[min(int(rnd.expovariate(1.0)), len(opts) - 1)]
            else:
                nxt = len(parent)
                parent.append(node)
                depth.append(d)
                opts.append(nxt)
            blocks.append(nxt)
            node = nxt
        reqs.append(blocks)
    return parent, depth, reqs


@pytest.mark.parametrize("rate", [None, 1.0])
def test_sample_rate_one_makes_exactly_the_unsampled_decisions(rate: float | None) -> None:
    # SEQ_DIGEST was recorded from the predictor before sample_rate existed (commit 0e87956):
    # every request's hit, evictions, their CPU keys, the re-keys, the leader and the CPU
    # epoch, then the switches and scores, without and with a CPU tier (2 switches and 2 union
    # switches happen).
    parent, depth, reqs = _sequence()
    h = hashlib.sha256()
    for cpu in (0, 9):
        cfg = AdaptiveConfig(half_life_blocks=200.0, min_lead=2.0)
        if rate is not None:
            cfg = replace(cfg, sample_rate=rate)
        cache = AdaptiveCache(6, parent, depth, cfg, cpu_capacity=cpu)
        for t, blocks in enumerate(reqs):
            hit = cache.prefix_hit(blocks)
            gone = cache.request(blocks, float(t))
            keys = [cache.cpu_key(v, 0) for v in gone]
            state = (hit, gone, keys, cache.cpu_rekey(), cache.leader, cache.cpu_epoch)
            h.update(repr(state).encode())
        h.update(repr((cache.switches, cache.scores)).encode())
    assert h.hexdigest() == SEQ_DIGEST


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, float("nan")])
def test_a_bad_sample_rate_is_refused_naming_the_field(bad: float) -> None:
    with pytest.raises(ValueError, match="^sample_rate must be in"):
        AdaptiveConfig(sample_rate=bad)
    with pytest.raises(ValueError, match="sample_rate"):
        sample_mask(4, bad)


def test_adaptive_sn_names_a_sampled_predictor() -> None:
    assert adaptive_sample_rate("adaptive-s8") == 0.125
    assert adaptive_sample_rate("adaptive-s1") == 1.0
    assert [adaptive_sample_rate(n) for n in ("adaptive", "adaptive-s0", "adaptive-sx")] == [
        None, None, None,
    ]  # fmt: skip
    cache = make_block_cache("adaptive-s4", 8, PARENT, DEPTH, cpu_capacity=4)
    assert isinstance(cache, AdaptiveCache) and cache.config.sample_rate == 0.25
    with pytest.raises(ValueError, match="unknown block cache"):
        make_block_cache("adaptive-s0", 8, PARENT, DEPTH)


def test_the_warm_log_keeps_the_newest_requests_covering_its_references() -> None:
    log = WarmLog(6)
    for t, req in enumerate((A, B, C)):
        log.add(req, float(t))
    # A (5) leaves once B and C (9 >= 6) remain; C alone (4) would not cover 6.
    assert [list(b) for b, _ in log.log] == [B, C]
    lru = log.replay(HeapCache(12, PARENT, DEPTH), 4)  # C alone covers 4
    assert lru.content() == C
    with pytest.raises(ValueError, match="refs"):
        WarmLog(0)
