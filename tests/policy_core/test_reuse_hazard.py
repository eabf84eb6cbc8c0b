"""The reuse-hazard expert (``policy_core.reuse_hazard``) and the adaptive predictor's union
shadows, on hand-made sequences worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from superinfer.policy_core.reuse_adaptive import (
    ADAPTIVE_EXPERTS,
    AdaptiveCache,
    HeapCache,
    make_block_cache,
)
from superinfer.policy_core.reuse_hazard import AGE_EDGES_S, HazardCache, hazard_tables, rho_index
from tests.factories import random_forest, root_path


def test_hazard_tables_are_kaplan_meier_by_hand() -> None:
    # Bins [0, 1), [1, 2), [2, 4), [4, 4 * 2^0.25). Closed gaps: 2 in bin 1, 1 in bin 3; one
    # interval still open at an age in bin 2. At risk: bin 0: 4, bin 1: 4, bin 2: 2, bin 3: 1;
    # hazards 0, 2/4, 0, 1/1. S at the points 0, 1, 2, 4, 4.757: 1, 1, 0.5, 0.5, 0.
    # I: 0, 1, 1 + 0.75 = 1.75, 1.75 + 2 * 0.5 = 2.75, 2.75 + (4 * 2^0.25 - 4) * 0.25.
    x, s, integral = hazard_tables(np.array([0, 2, 0, 1]), np.array([0, 0, 1, 0]), [0, 1, 2, 4])
    last = 4 * 2**0.25
    assert x.tolist() == [0, 1, 2, 4, last]
    assert s.tolist() == [1.0, 1.0, 0.5, 0.5, 0.0]
    assert integral.tolist() == pytest.approx([0, 1, 1.75, 2.75, 2.75 + 0.25 * (last - 4)])


def test_rho_index_by_hand() -> None:
    # S = 1, 1, 0.2, 0.2 at I = 0, 1, 1.6, 2.0. rho[0] = max(0/1, 0.8/1.6, 0.8/2.0) = 0.5;
    # rho[1] = max(0.8/0.6, 0.8/1.0) = 4/3; rho[2] = 0/0.4 = 0; rho[3] = 0 (no later point).
    # The age that has waited out the dead zone (point 1) is worth more than a fresh one.
    rho = rho_index(np.array([1.0, 1.0, 0.2, 0.2]), np.array([0.0, 1.0, 1.6, 2.0]))
    assert rho.tolist() == pytest.approx([0.5, 4 / 3, 0.0, 0.0])


def _bin_of(x: float) -> int:
    return max(i for i, e in enumerate(AGE_EDGES_S) if e <= x)


def test_hazard_evicts_the_block_farthest_from_its_learned_reuse() -> None:
    # Independent blocks, 2 slots, one class. a at 0, 30, 60: two gaps of 30 s, both in the
    # bin [e_k, e_k+1) = [26.9, 32) s. b at 65, c at 85: at 85 the three open intervals are
    # censored at ages 25 (a), 20 (b), 0 (c), all below e_k: S = 1 up to e_k and 0 from
    # e_k+1 (every interval reaching bin k closed in it), I(e_k+1) = e_k + (e_k+1 - e_k) / 2.
    # At an edge e <= e_k, rho(e) = 1 / (I(e_k+1) - e) (stop at e_k+1); in between, rho is
    # interpolated: about 1/4.45 (a), 1/9.45 (b), 1/29.45 (c). c, the block just brought in,
    # leaves; LRU drops a, the oldest.
    parent, depth = [-1] * 3, [0] * 3
    seq = [(0.0, 0), (30.0, 0), (60.0, 0), (65.0, 1), (85.0, 2)]
    haz = HazardCache(2, parent, depth, classes=1, min_intervals=2, refit_blocks=1)
    lru = HeapCache(2, parent, depth)
    gone_h = [haz.request([b], t) for t, b in seq]
    gone_l = [lru.request([b], t) for t, b in seq]
    assert gone_h == [[], [], [], [], [2]]
    assert gone_l == [[], [], [], [], [0]]
    assert haz.fitted and haz.num_closed == 2
    k = _bin_of(30.0)
    e0, e1 = AGE_EDGES_S[k], AGE_EDGES_S[k + 1]
    assert e0 <= 30.0 < e1
    i_end = e0 + 0.5 * (e1 - e0)
    assert haz.rho[0][0] == pytest.approx(1 / i_end)
    for age in (0.0, 20.0, 25.0):
        m = _bin_of(age)
        lo, hi = AGE_EDGES_S[m], AGE_EDGES_S[m + 1]
        want = np.interp(age, [lo, hi], [1 / (i_end - lo), 1 / (i_end - hi)])
        assert float(np.interp(age, haz.x, haz.rho[0])) == pytest.approx(want)
    assert [b for b in range(3) if b in haz] == [0, 1]


def test_hazard_cold_start_is_exactly_lru() -> None:
    # Before min_intervals closed intervals, every score is -age: the content after every
    # request equals LRU's (deeper first inside a request) on a random prefix forest.
    rng = np.random.default_rng(5)
    nodes = 60
    parent, depth = random_forest(rng, nodes, many_roots=True)
    haz = HazardCache(7, parent, depth, min_intervals=10**9)
    lru = HeapCache(7, parent, depth)
    for t in range(400):
        path = root_path(parent, int(rng.integers(0, nodes)))[:5]
        assert haz.prefix_hit(path) == lru.prefix_hit(path)
        assert sorted(haz.request(path, float(t))) == sorted(lru.request(path, float(t)))
        held = [b for b in range(nodes) if b in haz]
        assert held == [b for b in range(nodes) if b in lru]
        assert all(parent[b] < 0 or parent[b] in held for b in held)  # prefix-closed
    assert not haz.fitted


def test_hazard_keeps_prefixes_closed_once_fitted() -> None:
    rng = np.random.default_rng(8)
    nodes = 50
    parent, depth = random_forest(rng, nodes, many_roots=False)
    haz = HazardCache(6, parent, depth, min_intervals=20, refit_blocks=10)
    for t in range(500):
        gone = haz.request(root_path(parent, int(rng.integers(0, nodes)))[:6], float(t) * 0.7)
        held = [b for b in range(nodes) if b in haz]
        assert len(held) == min(haz.size, 6) and haz.size <= 6
        assert not set(gone) & set(held)
        assert all(parent[b] < 0 or parent[b] in held for b in held)
    assert haz.fitted and haz.fits > 1


def test_hazard_is_a_default_adaptive_expert() -> None:
    assert "hazard" in ADAPTIVE_EXPERTS
    cache = make_block_cache("hazard", 3, [-1], [0])
    assert isinstance(cache, HazardCache) and cache.name == "hazard"
    with pytest.raises(ValueError, match=">= 1"):
        HazardCache(3, [-1], [0], classes=0)
    assert [HazardCache(3, [-1], [0]).block_class(n) for n in (1, 2, 3, 4, 7, 8, 100)] == [
        0, 1, 1, 2, 2, 3, 3,
    ]  # fmt: skip


def test_adaptive_cpu_tier_drops_what_the_union_leader_does_not_hold() -> None:
    # A hot block 0 every third request between fresh blocks; 1 HBM slot, 1 CPU slot (the
    # union holds 2). Union-sized LRU never hits 0 (two fresh blocks push it out); the union
    # shadows that keep 0 hit it every time and take the lead. From then on the CPU tier's key
    # of a block the union leader holds is raised by UNION_HELD, so 0 outlasts a fresh block,
    # and cpu_rekey() names the blocks the union leader drops.
    n = 900
    parent, depth = [-1] * n, [0] * n
    seq = [0 if t % 3 == 0 else t for t in range(n)]
    ada = AdaptiveCache(1, parent, depth, cpu_capacity=1)
    assert set(ada.union) == set(ADAPTIVE_EXPERTS) and ada.union["lru"].capacity == 2
    assert ada.cpu_key(0, 7) == (1, 7) and ada.cpu_rekey() == []
    rekeyed: list[int] = []
    for t, b in enumerate(seq):
        ada.request([b], float(t))
        rekeyed += ada.cpu_rekey()
    assert ada.union_leader != "lru" and ada.union_switches
    assert 0 in ada.union[ada.union_leader]
    assert ada.cpu_key(0, 7) == (1 + AdaptiveCache.UNION_HELD, 7)
    # The last two requests are the fresh 898 and 899: the union leader dropped 898 for 899.
    assert seq[-2:] == [898, 899] and rekeyed[-1] == 898
    assert ada.cpu_key(898, 8) == (1, 8)
    assert 0 not in rekeyed and all(b % 3 != 0 for b in rekeyed)
    # Without a CPU tier there are no union shadows and the key is the offload order.
    plain = AdaptiveCache(1, parent, depth)
    assert plain.union == {} and plain.cpu_key(0, 3) == (1, 3) and plain.cpu_rekey() == []
