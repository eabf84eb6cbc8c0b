"""The headline suite: its tables do not depend on how many processes ran it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
import pytest

from superinfer.harness import suites
from superinfer.harness.bench import BenchConfig
from superinfer.harness.errors import UserError
from superinfer.harness.policies import native_policy
from superinfer.harness.suites import run_headline

TINY = BenchConfig(
    trace="azure",
    engines=("sim:vllm", "sim:trtllm"),
    policies=("fcfs", "superinfer"),
    replicas=1,
    duration_s=40.0,
    rate_scale=1.0,
)


def test_workers_do_not_change_the_tables() -> None:
    one = run_headline(TINY, rate_scales=(0.5,), workers=1)
    two = run_headline(TINY, rate_scales=(0.5,), workers=2)
    for a, b in ((one.summary, two.summary), (one.sweep, two.sweep)):
        pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(one.starvation, two.starvation)
    # every load x engine x policy once, each with its classes and "all"
    cells = one.sweep.groupby(["rate_scale", "engine", "policy"]).slo_class.apply(list)
    assert len(cells) == 2 * 2 * 2 and all(classes[-1] == "all" for classes in cells)
    native = one.summary.set_index(["engine", "policy", "slo_class"]).native
    assert native.to_dict() == {
        (e, p, c): p == native_policy(e) for e, p, c in native.index
    } and set(native.index.get_level_values(1)) == set(TINY.policies)
    assert native.sum() == len(native) // 2  # fcfs is native on both engines here
    assert set(one.summary.rate_scale) == {1.0}
    assert set(one.info["runs"]) == {"x0.5", "x1"}


def _fail_first_run(cfg: BenchConfig) -> None:
    """A stand-in for one headline run (module level: the pool pickles it by name): the first
    load fails at once, every other run leaves a marker file and takes 1 s."""
    if cfg.rate_scale == 0.1 and cfg.engines == ("sim:vllm",):
        raise ValueError("the first run failed")
    marker = Path(os.environ["SUPERINFER_TEST_MARKERS"]) / f"{cfg.rate_scale}-{cfg.engines[0]}"
    marker.touch()
    time.sleep(1.0)


def test_a_failed_run_stops_the_suite_without_running_the_queued_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 10 loads x 2 engines = 20 runs on 2 workers; the first fails. The pool's exit used to run
    # the 19 others (19 markers, about 10 s) before the error came out; now only the run in
    # progress on the other worker ends: 1 marker
    monkeypatch.setenv("SUPERINFER_TEST_MARKERS", str(tmp_path))
    monkeypatch.setattr(suites, "_run_one", _fail_first_run)
    loads = tuple(round(0.1 * i, 1) for i in range(1, 10))
    with pytest.raises(ValueError, match="the first run failed"):
        run_headline(TINY, rate_scales=loads, workers=2)
    assert [p.name for p in tmp_path.iterdir()] == ["0.1-sim:trtllm"]


def test_bad_workers_and_loads_are_user_errors() -> None:
    with pytest.raises(UserError, match="--workers must be >= 1, got 0"):
        run_headline(TINY, rate_scales=(0.5,), workers=0)
    with pytest.raises(UserError, match="--rate-scales must all be > 0"):
        run_headline(TINY, rate_scales=(0.0,))


def test_a_bench_with_placement_planner_and_superinfer_runs_and_keeps_its_stats() -> None:
    """The placement plugins are unhashable dataclasses: collecting the scheduling policy's
    counters must not put plugins in a set (it did, and `bench --kv-policy` crashed)."""
    from superinfer.harness.bench import run_bench

    config = BenchConfig(
        workload="mooncake-chat",
        engines=("sim:vllm",),
        policies=("superinfer",),
        replicas=1,
        duration_s=20.0,
        kv_policy="reuse",
        kv_quant=True,
    )
    result = run_bench(config)
    every = result.summary[result.summary.slo_class == "all"].iloc[0]
    assert every.n_requests == every.n_finished + every.n_rejected + every.n_failed > 0
    stats = result.info["cells"]["sim:vllm/superinfer"]["policy_stats"]
    assert stats["saw_cpu_tier"] == 1 and stats["rejected"] == every.n_rejected
