"""Fleet planning: the search on hand-made pass/fail patterns, the peak window, a tiny plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from superinfer.harness.errors import UserError
from superinfer.harness.grid.cells import CellCache, load_workload
from superinfer.harness.grid.executors import CellRunner
from superinfer.harness.grid.fleet import (
    PLAN_COLUMNS,
    FleetConfig,
    next_count,
    peak_window_start,
    plan_count,
    plan_fleet,
)
from superinfer.harness.workload.workload import CHAT_SLO, Workload
from superinfer.sim.request import RequestSpec


def search(passes: Callable[[int], bool], lo: int = 1, hi: int = 64, confirm: int = 1):
    """Run the search against ``passes``; the plan and the counts tried, in order."""
    known: dict[int, bool] = {}
    while (n := next_count(known, lo, hi, confirm)) is not None:
        assert n not in known and lo <= n <= hi
        known[n] = passes(n)
    return plan_count(known, lo, hi, confirm), list(known)


def test_monotone_gives_the_smallest_passing_count() -> None:
    for answer in range(1, 40):
        plan, tried = search(lambda n, a=answer: n >= a)
        assert plan == answer, tried
    assert search(lambda n: n >= 11) == (11, [1, 2, 4, 8, 16, 9, 10, 11, 12])


def test_a_pass_followed_by_a_fail_is_not_a_plan() -> None:
    # 9 passes by luck of routing, 10 fails: the plan is 11 (11 and 12 pass).
    plan, tried = search(lambda n: n >= 11 or n == 9)
    assert plan == 11 and tried == [1, 2, 4, 8, 16, 9, 10, 11, 12]
    # Without the confirmation the fluke would be the plan.
    assert search(lambda n: n >= 11 or n == 9, confirm=0)[0] == 9


def test_infeasible_and_first_count() -> None:
    assert search(lambda n: False, hi=20) == (None, [1, 2, 4, 8, 16, 20])
    assert search(lambda n: True, lo=3) == (3, [3, 4])
    assert search(lambda n: n >= 20, hi=20) == (20, [1, 2, 4, 8, 16, 20, 17, 18, 19])
    with pytest.raises(ValueError, match="not finished"):
        plan_count({}, 1, 8, 1)


def test_peak_window_is_the_busiest_by_tokens() -> None:
    def req(i: int, t: float, tokens: int) -> RequestSpec:
        return RequestSpec(f"r{i}", t, tokens, 1, 1, CHAT_SLO)

    reqs = [req(0, 0.0, 10), req(1, 70.0, 500), req(2, 130.0, 500), req(3, 250.0, 100)]
    wl = Workload("x", tuple(reqs), (), 1.0, None)
    assert peak_window_start(wl, 120.0) == 60.0  # [60, 180) holds 1000 tokens
    assert peak_window_start(wl, 1000.0) == 0.0


#: A tiny plan: 8B on single A100s, one busy minute of the Azure mix after 30 s of warm-up.
TINY = FleetConfig(
    engines=("sim:vllm",),
    policies=("native", "fcfs", "priority"),
    model="llama-3.1-8b",
    gpu="a100-80gb",
    tp=1,
    window_s=60.0,
    window_start_s=1200.0,
    warmup_s=30.0,
    max_replicas=8,
    split=True,
)


def test_tiny_plan_exact_and_resumed_from_the_cache(tmp_path: Path) -> None:
    wl = load_workload(TINY.trace, 1.0)
    with CellRunner("local", workers=1, cache=CellCache(tmp_path)) as runner:
        result = plan_fleet(TINY, wl, runner)
    assert list(result.plan.columns) == list(PLAN_COLUMNS)
    rows = result.plan[["policy", "layout", "replicas", "gpus", "meets_slo"]].values.tolist()
    # native is fcfs on sim:vllm, so it is planned once. Mixing batch prefills into chat decode
    # steps costs the shared cluster more replicas than two separate ones.
    assert rows == [
        ["fcfs", "shared", 4, 4, True],
        ["fcfs", "separate", 2, 2, True],
        ["priority", "shared", 3, 3, True],
        ["priority", "separate", 2, 2, True],
    ]
    trail = result.search[result.search.policy == "fcfs"]
    assert trail[["layout", "cluster", "replicas", "passed"]].values.tolist() == [
        ["shared", "batch+chat", 1, False],  # gallop 1, 2, 4; scan 3; confirm 5
        ["shared", "batch+chat", 2, False],
        ["shared", "batch+chat", 3, False],
        ["shared", "batch+chat", 4, True],
        ["shared", "batch+chat", 5, True],
        ["separate", "batch", 1, True],
        ["separate", "batch", 2, True],
        ["separate", "chat", 1, True],
        ["separate", "chat", 2, True],
    ]
    assert trail.stopped_early.tolist()[0].startswith("chat 4 > 3 misses at ")
    assert result.detail.split.tolist() == ["", "1 batch + 1 chat", "", "1 batch + 1 chat"]
    assert (result.plan[["chat_attainment", "batch_attainment"]] >= 0.99).all().all()
    with CellRunner("local", workers=1, cache=CellCache(tmp_path)) as runner:
        again = plan_fleet(TINY, wl, runner)
    assert runner.num_run == 0
    assert again.plan.equals(result.plan) and again.search.drop(columns="wall_s").equals(
        result.search.drop(columns="wall_s")
    )


def test_bad_plans_are_user_errors() -> None:
    wl = load_workload("azure", 1.0)
    runner = CellRunner("local", workers=1)
    cases = [
        (dataclasses.replace(TINY, targets=(("video", 0.9),)), "no SLO class 'video'"),
        (dataclasses.replace(TINY, min_replicas=9), "need 1 <= --min-replicas <= --max-replicas"),
        (dataclasses.replace(TINY, engines=("sim:tgi",)), "unknown engine 'sim:tgi'"),
        (dataclasses.replace(TINY, policies=("nosuch",)), "unknown policy 'nosuch'"),
    ]
    for config, message in cases:
        with pytest.raises(UserError, match=message):
            plan_fleet(config, wl, runner)
