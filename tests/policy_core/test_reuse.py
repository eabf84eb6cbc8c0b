"""ReusePredictor: exact cold-start fallback and switch, labels, learning; NodeHistory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from superinfer.policy_core.reuse import (
    FEATURE_NAMES,
    NodeColumns,
    NodeHistory,
    ReusePredictor,
    ReusePredictorConfig,
)


def columns(
    age_s: list[float], accesses: list[float] | None = None, **kw: list[float]
) -> NodeColumns:
    n = len(age_s)
    age = np.asarray(age_s, dtype=np.float64)
    return NodeColumns(
        age_s=age,
        since_first_s=np.asarray(kw.get("since_first_s", age_s), dtype=np.float64),
        num_accesses=np.asarray(accesses or [1.0] * n, dtype=np.float64),
        interval_ewma_s=np.asarray(kw.get("interval", [math.nan] * n), dtype=np.float64),
        depth=np.asarray(kw.get("depth", [0.0] * n), dtype=np.float64),
        tokens_per_block=np.asarray(kw.get("tokens", [512.0] * n), dtype=np.float64),
        num_children=np.asarray(kw.get("children", [0.0] * n), dtype=np.float64),
    )


def test_fallback_scores_are_lru_and_lfu_exactly() -> None:
    cols = columns([5.0, 0.0, 30.0, 5.0], accesses=[1.0, 4.0, 9.0, 2.0])
    lru = ReusePredictor()
    assert lru.mode == "fallback_lru" and not lru.calibrated
    assert lru.scores(cols).tolist() == [-5.0, -0.0, -30.0, -5.0]
    lfu = ReusePredictor(ReusePredictorConfig(fallback="lfu"))
    assert lfu.mode == "fallback_lfu"
    assert lfu.scores(cols).tolist() == [1.0 + 1 / 6, 4.0 + 1.0, 9.0 + 1 / 31, 2.0 + 1 / 6]
    # LFU order: more accesses first, recency breaks ties within a count.
    assert np.argsort(lfu.scores(cols)).tolist() == [0, 3, 1, 2]


def test_switches_exactly_when_enough_labels_of_both_kinds_exist() -> None:
    cfg = ReusePredictorConfig(
        min_labels=40, min_labels_per_class=5, samples_per_call=8, initial_horizon_s=10.0
    )
    pred = ReusePredictor(cfg)
    keys = np.arange(8)
    last = np.zeros(8)
    cols = columns([0.0] * 8)
    # Every 10 s: sample all 8 nodes; nodes 0-2 are accessed again each time (positives).
    for step in range(8):
        now = 10.0 * step
        last[:3] = now
        pred.learn(now, lambda k: last[k])
        before = pred.scores(cols)
        if not pred.calibrated:
            assert before.tolist() == [-0.0] * 8  # still LRU
        pred.add_samples(keys[pred.sample_indices(8)], cols, now)
        assert pred.num_labels == 8 * max(step, 0)
        expected_switch = pred.num_labels >= 40
        assert pred.calibrated == expected_switch, step
    # Labels reach 40 at the call at t = 50 s (5 batches of 8): that is the switch instant.
    assert pred.switched_at_s == 50.0 and pred.labels_at_switch == 40
    assert pred.num_positive == 3 * 7
    assert pred.metrics()["mode"] == "model"


def test_no_switch_without_negatives() -> None:
    pred = ReusePredictor(
        ReusePredictorConfig(
            min_labels=10, min_labels_per_class=1, samples_per_call=4, initial_horizon_s=1.0
        )
    )
    last = np.zeros(4)
    for step in range(10):
        last[:] = float(step)  # every node is reused: all labels positive
        pred.learn(float(step), lambda k: last[k])
        pred.add_samples(np.arange(4), columns([0.0] * 4), float(step))
    assert pred.num_labels == 36 and pred.num_positive == 36 and not pred.calibrated


def test_label_is_an_access_after_the_sample_within_the_horizon() -> None:
    pred = ReusePredictor(ReusePredictorConfig(samples_per_call=3, initial_horizon_s=100.0))
    last = np.array([0.0, 0.0, 0.0])
    pred.add_samples(np.arange(3), columns([0.0] * 3), 0.0)
    last[1] = 50.0  # node 1 is reused inside the horizon
    pred.learn(99.9, lambda k: last[k])
    assert pred.num_labels == 0  # not due yet
    pred.learn(100.0, lambda k: last[k])
    assert (pred.num_labels, pred.num_positive) == (3, 1)


def test_horizon_follows_the_age_of_evicted_nodes() -> None:
    cfg = ReusePredictorConfig(initial_horizon_s=60.0, horizon_smoothing=0.5, horizon_scale=2.0)
    pred = ReusePredictor(cfg)
    assert pred.horizon_s == 60.0
    pred.observe_evictions(np.array([100.0, 300.0]))
    assert pred.horizon_s == 2 * 200.0
    pred.observe_evictions(np.array([400.0]))
    assert pred.horizon_s == 2 * (0.5 * 200.0 + 0.5 * 400.0)
    pred.observe_evictions(np.array([]))
    assert pred.horizon_s == 600.0


def test_features_have_the_documented_layout() -> None:
    pred = ReusePredictor()
    cols = columns(
        [0.0, 3.0, 5000.0],
        accesses=[1.0, 2.0, 3.0],
        interval=[math.nan, 10.0, 20.0],
        tokens=[512.0, 100.0, 512.0],
        depth=[0.0, 4.0, 9.0],
        children=[2.0, 0.0, 1.0],
    )
    x = pred.features(cols)
    assert x.shape == (3, len(FEATURE_NAMES)) == (3, 38)
    name = {n: i for i, n in enumerate(FEATURE_NAMES)}
    assert x[0, name["age_bin0_first_use"]] == 1.0  # age 0 s, never reused
    assert x[1, name["age_bin2_reused"]] == 1.0  # log2(1 + 3) = 2
    assert x[2, name["age_bin11_reused"]] == 1.0  # clipped to the last bin
    assert x[:, :24].sum(axis=1).tolist() == [1.0, 1.0, 1.0]
    assert x[:, name["partial_block"]].tolist() == [0.0, 1.0, 0.0]
    assert x[:, name["has_interval"]].tolist() == [0.0, 1.0, 1.0]
    assert x[1, name["age_over_interval"]] == pytest.approx(0.3 / 10)
    assert x[:, name["bias"]].tolist() == [1.0, 1.0, 1.0]


def test_learns_to_rank_reused_nodes_above_one_off_nodes() -> None:
    # 32 full blocks that come back (each with probability 1/4 every 5 s), and every 5 s 32 new
    # partial blocks of the same ages that never come back.
    rng = np.random.default_rng(0)
    pred = ReusePredictor(
        ReusePredictorConfig(min_labels=200, samples_per_call=16, initial_horizon_s=30.0)
    )
    steps, n = 200, 32
    last = np.zeros(n + steps * n)
    for step in range(steps):
        now = 5.0 * step
        due = rng.random(n) < 0.25
        last[:n][due] = now
        fresh = n + step * n + np.arange(n)
        last[fresh] = now - rng.uniform(0.0, 30.0, n)
        keys = np.concatenate([np.arange(n), fresh])
        cols = columns(list(now - last[keys]), tokens=[512.0] * n + [100.0] * n)
        pred.learn(now, lambda k: last[k])
        idx = pred.sample_indices(len(keys))
        pred.add_samples(keys[idx], cols.take(idx), now)
    assert pred.calibrated and pred.switched_at_s is not None
    full, part = pred.scores(columns([10.0, 10.0], tokens=[512.0, 100.0])).tolist()
    assert full - part > 0.3 and part < 0.25  # true values: 0.82 and 0


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="fallback must be 'lru' or 'lfu'"):
        ReusePredictorConfig(fallback="mru")
    with pytest.raises(ValueError, match="learning_rate must be > 0"):
        ReusePredictorConfig(learning_rate=0.0)
    with pytest.raises(ValueError, match="interval_weight must be in"):
        ReusePredictorConfig(interval_weight=1.5)


def test_history_counts_accesses_and_interval_ewma_exactly() -> None:
    hist = NodeHistory(interval_weight=0.5)
    slots = hist.update(["a", "b"], [10.0, 10.0], [0, 0])
    cols = hist.columns(
        slots, 10.0, depth=np.zeros(2), tokens_per_block=np.ones(2), num_children=np.zeros(2)
    )
    assert cols.num_accesses.tolist() == [1.0, 1.0] and np.isnan(cols.interval_ewma_s).all()
    hist.update(["a", "b"], [30.0, 10.0], [1, 0])  # a hit at 30 s
    slots = hist.update(["a", "b"], [40.0, 10.0], [3, 0])  # two more hits seen at once
    cols = hist.columns(
        slots, 50.0, depth=np.zeros(2), tokens_per_block=np.ones(2), num_children=np.zeros(2)
    )
    assert cols.num_accesses.tolist() == [4.0, 1.0]
    assert cols.interval_ewma_s[0] == 0.5 * 10.0 + 0.5 * 20.0
    assert cols.age_s.tolist() == [10.0, 40.0] and cols.since_first_s.tolist() == [40.0, 40.0]
    assert hist.last_access_of(np.array(["a", "zzz"], dtype=object)).tolist() == [40.0, -math.inf]


def test_history_forgets_the_least_recently_accessed_half() -> None:
    hist = NodeHistory(max_keys=4)
    hist.update(["a", "b", "c", "d"], [1.0, 4.0, 2.0, 3.0], [0, 0, 0, 0])
    hist.update(["e"], [5.0], [0])
    assert len(hist) == 4
    assert hist.last_access_of(np.array(["a", "b", "c", "d", "e"], dtype=object)).tolist() == [
        -math.inf,
        4.0,
        2.0,
        3.0,
        5.0,
    ]
