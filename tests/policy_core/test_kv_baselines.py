"""ARC and S3-FIFO against hits and states worked out by hand from the papers' definitions
(Megiddo & Modha, FAST 2003, Fig. 4; Yang et al., SOSP 2023, Algorithm 1), and the leaf
constraint of the prefix-cache versions."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np
import pytest

from superinfer.policy_core import reuse_blocks
from superinfer.policy_core.kv_baselines import ArcCache, S3FifoCache
from superinfer.policy_core.reuse_adaptive import (
    AdaptiveCache,
    ArcBlocks,
    HeapCache,
    S3FifoBlocks,
    make_block_cache,
)
from superinfer.policy_core.reuse_blocks import LrfuCache, _KeyedAlgo
from tests.factories import random_forest, root_path


def run(cache: ArcCache[str] | S3FifoCache[str], seq: str) -> tuple[list[bool], list[list[str]]]:
    hits, gone = [], []
    for key in seq:
        hits.append(key in cache)
        gone.append(cache.access(key))
    return hits, gone


def test_arc_exact_on_a_hand_made_sequence() -> None:
    # c = 2. a, b miss (T1 = [a, b]); a hits (T2 = [a]); c: T1 + T2 full, p = 0 < |T1| = 1:
    # b -> B1. b: ghost hit in B1, p = 0 + max(0/1, 1) = 1; |T1| = 1 is not > p, so T2's a ->
    # B2; b -> T2. d: L1 = |T1| + |B1| = 1 < 2, total 3: REPLACE takes T2's b -> B2 (|T1| = p).
    # a: ghost hit in B2, p = max(0, 1 - max(0/2, 1)) = 0; |T1| = 2 > 0: c -> B1; a -> T2.
    arc: ArcCache[str] = ArcCache(2)
    hits, gone = run(arc, "abacbda")
    assert hits == [False, False, True, False, False, False, False]
    assert gone == [[], [], [], ["b"], ["a"], ["b"], ["c"]]
    assert (list(arc.t1), list(arc.t2), list(arc.b1), list(arc.b2)) == (["d"], ["a"], ["c"], ["b"])
    assert arc.p == 0.0


def test_arc_resists_a_scan_where_lru_does_not() -> None:
    # a twice (T2), then b and c once each: the second miss evicts b from T1, not a.
    arc: ArcCache[str] = ArcCache(2)
    hits, gone = run(arc, "aabca")
    assert hits == [False, True, False, False, True]
    assert gone == [[], [], [], ["b"], []]


def test_s3fifo_exact_on_a_hand_made_sequence() -> None:
    # c = 3: |S| share = max(1, round(0.3)) = 1, G holds 3 - 1 = 2 keys.
    s3: S3FifoCache[str] = S3FifoCache(3)
    assert (s3.small_size, s3.ghost_size) == (1, 2)
    hits, gone = run(s3, "abcdacebadffg")
    # a b c fill S. d: S's tail a (never hit) -> G. a: b -> G, then a is in G: enters M.
    # c hits (counter 1). e: S's tail c was hit: moves to M (counter 0); d -> G = [b, d].
    # b: e -> G = [b, d, e], trimmed to [d, e]; b is no longer a ghost: enters S. a hits.
    # d: b -> G = [e, b], d not a ghost -> S. f: d -> G = [b, d]. f hits (counter 1).
    # g: S's tail f was hit -> M = [a, c, f]; S empty: M's tail a has counter 1 -> reinserted
    # with 0; c (counter 0) leaves.
    assert [i for i, h in enumerate(hits) if h] == [5, 8, 11]
    assert gone == [[], [], [], ["a"], ["b"], [], ["d"], ["e"], [], ["b"], ["d"], [], ["c"]]
    assert (list(s3.small), list(s3.main), list(s3.ghost)) == (["g"], ["f", "a"], ["b", "d"])
    assert s3.freq == {"g": 0, "f": 0, "a": 0}


def test_s3fifo_drops_one_hit_wonders_before_a_reused_key() -> None:
    s3: S3FifoCache[int] = S3FifoCache(10)
    for key in (0, 0, *range(1, 30)):
        s3.access(key)
    assert 0 in s3 and 1 not in s3  # 0 was hit in S, moved to M; the scan went through S


def test_order_and_forget() -> None:
    arc: ArcCache[str] = ArcCache(3)
    run(arc, "abca")  # T1 = [b, c], T2 = [a], p = 0
    assert arc.eviction_order() == ["b", "c", "a"]
    arc.forget("c")
    assert "c" in arc.b1 and "c" not in arc
    s3: S3FifoCache[str] = S3FifoCache(3)
    run(s3, "abcb")  # S = [a, b, c], b hit
    assert s3.eviction_order() == ["a", "c", "b"]
    s3.forget("a")
    assert list(s3.ghost) == ["a"] and len(s3) == 2


@pytest.mark.parametrize(
    "cls", [ArcBlocks, S3FifoBlocks, HeapCache, AdaptiveCache, partial(LrfuCache, half_life_s=3.0)]
)
def test_prefix_versions_evict_leaves_only(cls: type) -> None:
    rng = np.random.default_rng(3)
    nodes = 40
    parent, depth = random_forest(rng, nodes, many_roots=False)
    cache = cls(6, parent, depth)
    for t in range(300):
        cache.request(root_path(parent, int(rng.integers(0, nodes)))[:6], float(t))
        held = [b for b in range(nodes) if b in cache]
        assert len(held) <= 6
        assert all(parent[b] < 0 or parent[b] in held for b in held)  # prefix-closed


def test_adaptive_leaves_lru_when_another_policy_leads() -> None:
    # A hot one-block prompt twice in a row, then three fresh ones, 2 slots: LRU hits only the
    # second of each pair; LFU keeps the hot block (2 accesses against 1) and hits both.
    n = 1500
    parent, depth = [-1] * n, [0] * n
    seq = [0 if t % 5 < 2 else t for t in range(n)]
    caches = {name: make_block_cache(name, 2, parent, depth) for name in ("lru", "lfu")}
    ada = AdaptiveCache(2, parent, depth)
    hits = {"lru": 0, "lfu": 0, "adaptive": 0}
    for t, b in enumerate(seq):
        for name, cache in (*caches.items(), ("adaptive", ada)):
            hits[name] += cache.prefix_hit([b])
            cache.request([b], float(t))
    assert (hits["lru"], hits["lfu"]) == (n // 5, 2 * (n // 5) - 1)
    assert ada.leader != "lru" and ada.switches[0][1] == "lru"
    # From the switch on it hits what the leader hits (the hot block is cached when it leads).
    switch_req = ada.switches[0][0]
    assert hits["adaptive"] >= hits["lfu"] - switch_req // 5 * 2 - 2


def test_arc_request_reports_only_blocks_that_left() -> None:
    # Chain 0 -> 1 -> 2, capacity 2; [0, 1] then [0, 1, 2], fed deepest first. access(2) evicts
    # 1 (T1's LRU leaf: its child 2 is not counted yet), access(1) brings 1 back (ghost hit)
    # and evicts 0 (a leaf again), access(0) brings 0 back and evicts 2 (1 has a child now).
    # 1 and 0 left and came back inside the request: only 2 left.
    parent, depth = [-1, 0, 1], [0, 1, 2]
    arc = ArcBlocks(2, parent, depth)
    assert arc.request([0, 1], 0.0) == []
    assert arc.request([0, 1, 2], 1.0) == [2]
    assert sorted(arc.content()) == [0, 1]


@pytest.mark.parametrize("cls", [ArcBlocks, S3FifoBlocks])
def test_request_returns_exactly_the_departures(cls: type) -> None:
    # Requests longer than the cache: what request() returns is exactly (cached before, plus
    # the request) minus cached after, once each (a replay's tier bookkeeping relies on it).
    rng = np.random.default_rng(5)
    nodes = 60
    parent = [-1] + [int(rng.integers(max(0, i - 3), i)) for i in range(1, nodes)]
    depth = [0] * nodes
    for v in range(1, nodes):
        depth[v] = depth[parent[v]] + 1
    cache = cls(4, parent, depth)
    for t in range(300):
        v, path = int(rng.integers(0, nodes)), []
        while v >= 0:
            path.append(v)
            v = parent[v]
        before = set(cache.content())
        gone = cache.request(path[::-1][:9], float(t))
        after = set(cache.content())
        assert len(gone) == len(set(gone))
        assert set(gone) == (before | set(path[::-1][:9])) - after


def test_lfu_counts_survive_a_cpu_tier_when_resumed() -> None:
    # One slot, [0, 1, 1, 0]: 1 evicts 0 (both count 1, 0 older), 1 reaches count 2. 0 comes
    # back: without resume at count 1, so it leaves again at once (1 has 2); held in the CPU
    # tier (resume) it goes on at count 2, ties 1 and is the more recent: 1 leaves.
    parent, depth = [-1, -1], [0, 0]
    plain, kept = HeapCache(1, parent, depth, lfu=True), HeapCache(1, parent, depth, lfu=True)
    kept.resume = {0}
    gone = {}
    for name, cache in (("plain", plain), ("kept", kept)):
        gone[name] = [cache.request([b], float(t)) for t, b in enumerate([0, 1, 1, 0])]
    assert gone["plain"] == [[], [0], [], [0]] and gone["kept"] == [[], [0], [], [1]]
    assert (plain.count[0], kept.count[0]) == (1, 2)


def test_adaptive_cpu_tier_follows_lfu_when_lfu_leads() -> None:
    # A hot block 0 twice in a row, then two fresh ones; 1 HBM slot, 1 CPU slot. LRU (and its
    # LRU CPU tier) hits only the second 0 of each pair: the two fresh blocks push 0 out of both
    # tiers. LFU keeps 0 (count >= 2 against 1) and hits both: it leads, and the adaptive
    # cache's own CPU tier is then keyed by LFU counts, (count, offload order); under any other
    # leader, and for every other cache, by offload order alone.
    n = 1200
    parent, depth = [-1] * n, [0] * n
    seq = [0 if t % 4 < 2 else t for t in range(n)]
    ada = AdaptiveCache(1, parent, depth, cpu_capacity=1)
    assert ada.cpu_key(0, 7) == (1, 7)  # LRU leads at the start
    for t, b in enumerate(seq):
        ada.request([b], float(t))
    assert ada.leader == "lfu"
    lfu = ada.experts["lfu"]
    assert isinstance(lfu, HeapCache)
    # The union-sized shadows that keep 0 lead too (union-sized LRU misses every 0): a block
    # the union leader holds (0 and the newest fresh block) has UNION_HELD added to its key.
    held = AdaptiveCache.UNION_HELD
    assert ada.union_leader != "lru"
    assert lfu.count[0] >= 2 and ada.cpu_key(0, 7) == (lfu.count[0] + held, 7)
    assert ada.cpu_key(n - 1, 8) == (1 + held, 8) and ada.cpu_key(n - 2, 8) == (1, 8)
    assert HeapCache(1, parent, depth).cpu_key(0, 7) == (1, 7)


def test_lrfu_exact_on_a_hand_made_sequence() -> None:
    # a at t=0 and t=1, b at t=2, c at t=3; 2 slots, three independent blocks. Keys at the last
    # access, log2 F + t / h: half-life 10 s: a = log2(1 + 2^-0.1) + 0.1 = 1.051, b = 0.2,
    # c = 0.3: b (one access, older than c) leaves, where LRU would drop a. Half-life 0.1 s:
    # a = log2(1 + 2^-10) + 10 = 10.001, b = 20, c = 30: a leaves, as under LRU.
    parent, depth = [-1, -1, -1], [0, 0, 0]
    for half_life, victim in ((10.0, 1), (0.1, 0)):
        cache = LrfuCache(2, parent, depth, half_life)
        gone = [cache.request([b], float(t)) for t, b in enumerate([0, 0, 1, 2])]
        assert gone == [[], [], [], [victim]]
        assert cache.log_f[0] == pytest.approx(math.log2(1 + 2 ** (-1 / half_life)))
    assert make_block_cache("lrfu200", 2, parent, depth).name == "lrfu200"
    with pytest.raises(ValueError, match="unknown block cache"):
        make_block_cache("lrfu-1", 2, parent, depth)
    with pytest.raises(ValueError, match="half_life_s"):
        LrfuCache(2, parent, depth, 0.0)


class _ReferenceS3FifoBlocks(_KeyedAlgo):
    """S3-FIFO over blocks through the plain :class:`S3FifoCache` with its leaf predicate: the
    reference the fast ``S3FifoBlocks`` (``_S3FifoLeaves``: hit case inlined, leaf scans read
    ``kids``, long passes over S from a snapshot) must match decision for decision."""

    def __init__(self, capacity: int, parent: list[int], depth: list[int]) -> None:
        super().__init__(capacity, parent, depth)
        kids = self.kids
        self.algo = S3FifoCache(capacity, evictable=lambda b: kids[b] == 0)
        self._held = (self.algo.freq, {})


def test_fast_s3fifo_blocks_match_the_plain_algorithm_step_for_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A deep forest (each block's parent among the 10 % of blocks just before it; paths up to
    # 85 blocks, the cache 120): S's tail comes to hold blocks with a cached child (a child
    # promoted through the ghost while its parent, evicted from M, came back into S), so scans
    # pass over more than 16 of them and take the snapshot path. Every request's departures and
    # the FIFOs, counters and child counts after it equal the plain algorithm's.
    snapshots = []
    real_islice = reuse_blocks.islice

    def counting_islice(*args: Any) -> Any:
        snapshots.append(args[1])
        return real_islice(*args)

    monkeypatch.setattr(reuse_blocks, "islice", counting_islice)
    rng = np.random.default_rng(1)
    nodes = 1000
    parent = [-1] + [int(rng.integers(max(0, i - int(0.1 * i) - 2), i)) for i in range(1, nodes)]
    depth = [0] * nodes
    for v in range(1, nodes):
        depth[v] = depth[parent[v]] + 1
    fast, ref = S3FifoBlocks(120, parent, depth), _ReferenceS3FifoBlocks(120, parent, depth)
    for t in range(2000):
        path = root_path(parent, int(rng.integers(0, nodes)))
        assert fast.request(path, float(t)) == ref.request(path, float(t)), t
        assert list(fast.algo.small) == list(ref.algo.small), t
        assert list(fast.algo.main) == list(ref.algo.main), t
        assert list(fast.algo.ghost) == list(ref.algo.ghost), t
        assert fast.algo.freq == ref.algo.freq and fast.kids == ref.kids, t
    assert max(depth) == 85 and len(snapshots) == 812


def test_lru_cache_by_hand() -> None:
    from superinfer.policy_core.kv_baselines import LruCache

    cache = LruCache[str](2)
    assert [cache.access(k) for k in "abacd"] == [[], [], [], ["b"], ["a"]]
    assert cache.eviction_order() == ["c", "d"] and "a" not in cache and len(cache) == 2
    cache.forget("c")
    assert cache.eviction_order() == ["d"]
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        LruCache[str](0)
