"""The shortcuts that cut the reuse predictors' cost per decision (issue 22): the planner's
eviction order, the one-node score and the learned cache's amortized plan, each against the slow
path or a hand-worked value."""

from __future__ import annotations

import numpy as np
import pytest

from superinfer.policy_core.kv_placement_plan import PlacementPlanner, eviction_order
from superinfer.policy_core.reuse import NodeColumns, ReusePredictor
from superinfer.policy_core.reuse_adaptive import AdaptiveCache, make_block_cache
from superinfer.policy_core.reuse_learned import LearnedCache
from tests.factories import random_forest, root_path


def forest(nodes: int, seed: int) -> tuple[list[int], list[int]]:
    return random_forest(np.random.default_rng(seed), nodes, many_roots=True)


def paths(parent: list[int], n: int, seed: int, cut: int = 8) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [root_path(parent, int(rng.integers(0, len(parent))))[:cut] for _ in range(n)]


def test_eviction_order_is_the_plan_in_greedy_order() -> None:
    parent, depth = forest(60, 1)
    score = np.random.default_rng(2).random(60)
    par, dep = np.asarray(parent), np.asarray(depth)
    order = eviction_order(score, par, dep, 25)
    assert len(order) == len(set(order.tolist())) == 25
    for k in (1, 7, 25):
        plan = PlacementPlanner().plan_arrays(
            score=score, parent=par, depth=dep, num_blocks=np.ones(60, dtype=np.int64),
            in_hbm=np.ones(60, dtype=bool), needed_hbm_blocks=k, free_hbm_blocks=0,
            free_cpu_blocks=0, total_hbm_blocks=60, has_cpu_tier=False, calibrated=False,
            pins=False,
        )  # fmt: skip
        assert sorted(order[:k].tolist()) == plan.drop.tolist()
    # A chain of three: the leaf goes first, then the parents it exposes.
    assert eviction_order(np.zeros(3), np.array([-1, 0, 1]), np.array([0, 1, 2]), 3).tolist() == [
        2,
        1,
        0,
    ]


def test_score_one_equals_the_vector_scores() -> None:
    pred = ReusePredictor()
    rng = np.random.default_rng(0)
    n = 50
    cols = NodeColumns(
        age_s=rng.exponential(100.0, n),
        since_first_s=rng.exponential(1000.0, n) + 100.0,
        num_accesses=rng.integers(1, 9, n).astype(np.float64),
        interval_ewma_s=np.where(rng.random(n) < 0.3, np.nan, rng.exponential(50.0, n)),
        depth=rng.integers(0, 40, n).astype(np.float64),
        tokens_per_block=np.where(rng.random(n) < 0.2, 100.0, 512.0),
        num_children=rng.integers(0, 3, n).astype(np.float64),
    )

    def one(i: int) -> float:
        return pred.score_one(
            *(float(getattr(cols, f)[i]) for f in (
                "age_s", "since_first_s", "num_accesses", "interval_ewma_s", "depth",
                "tokens_per_block", "num_children"))
        )  # fmt: skip

    assert [one(i) for i in range(n)] == pytest.approx(pred.scores(cols).tolist(), abs=0)
    pred.weights = rng.normal(0.0, 1.0, len(pred.weights))
    pred.switched_at_s = 0.0  # calibrated: the logistic model
    vec = pred.scores(cols)
    assert [one(i) for i in range(n)] == pytest.approx(vec.tolist(), rel=1e-12, abs=1e-15)


def test_learned_cache_without_lookahead_plans_every_eviction() -> None:
    parent, depth = forest(80, 4)
    reqs = paths(parent, 400, 5)
    exact = LearnedCache(10, parent, depth, lookahead_frac=0.0)
    fast = LearnedCache(10, parent, depth, amortize_min_blocks=1)
    assert (exact.lookahead, fast.lookahead) == (0, 16)  # 16 = min_lookahead
    assert LearnedCache(4095, parent, depth).lookahead == 0  # small: planned every time
    assert LearnedCache(4096, parent, depth).lookahead == 128  # 4096 / 32
    for t, path in enumerate(reqs):
        for cache in (exact, fast):
            cache.request(path, float(t))
            held = cache.content()
            assert len(held) <= 10
            assert all(parent[b] < 0 or parent[b] in held for b in held)  # prefix-closed
    assert exact.num_plans > 4 * fast.num_plans


def test_adaptive_is_lru_until_its_first_switch() -> None:
    parent, depth = forest(2000, 9)
    ada = AdaptiveCache(200, parent, depth)
    lru = make_block_cache("lru", 200, parent, depth)
    for t, path in enumerate(paths(parent, 1500, 10, cut=20)):
        if not ada.switches:
            assert ada.prefix_hit(path) == lru.prefix_hit(path)
            assert ada.request(path, float(t)) == lru.request(path, float(t))
        else:
            ada.request(path, float(t))
            held = [b for b in range(2000) if b in ada]
            assert len(held) <= 200 and all(parent[b] < 0 or parent[b] in held for b in held)
