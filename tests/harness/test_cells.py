"""Cells: windows and classes, the early stop agreeing with a full run, cache keys and files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.engines.sim import run_sim_cell
from superinfer.harness.errors import UserError
from superinfer.harness.grid.cells import (
    AttainmentGuard,
    CellCache,
    CellSpec,
    allowed_misses,
    attainment,
    cell_key,
    check_cell,
    load_workload,
    run_cell,
    select_requests,
    slo_bound_s,
)
from superinfer.harness.policies import resolve_policy
from superinfer.harness.workload.workload import BATCH_SLO, CHAT_SLO
from superinfer.policy_core.types import SLO

#: A small cell on the Azure mix: 8B on one A100, a minute at the trace's busiest stretch.
TINY = CellSpec(
    engine="sim:vllm",
    policy="fcfs",
    model="llama-3.1-8b",
    gpu="a100-80gb",
    tp=1,
    replicas=2,
    start_s=1200.0,
    duration_s=60.0,
    warmup_s=30.0,
)


@given(st.integers(0, 3000), st.floats(0.0001, 1.0))
def test_allowed_misses_is_the_largest_budget_that_keeps_the_target(n: int, target: float) -> None:
    m = allowed_misses(n, target)
    if n == 0:
        assert m == 0
        return
    assert (n - m) / n >= target
    assert m == n or (n - m - 1) / n < target


def test_select_requests_keeps_warmup_window_and_classes() -> None:
    wl = load_workload("azure", 1.0)
    reqs, measured = select_requests(wl, TINY)
    assert all(1170.0 <= r.arrival_s < 1260.0 for r in reqs)
    assert {r.request_id for r in reqs if r.arrival_s >= 1200.0} == measured
    expected = [r for r in wl.requests if 1170.0 <= r.arrival_s < 1260.0]
    assert len(reqs) == len(expected)
    tight = SLO("chat", ttft_ms=200.0, tpot_ms=50.0)
    chat_only = dataclasses.replace(TINY, classes=("chat",), slo=(tight,))
    reqs, measured = select_requests(wl, chat_only)
    assert {r.slo for r in reqs} == {tight}
    assert len(reqs) == sum(r.slo.name == "chat" for r in expected)
    with pytest.raises(UserError, match="has no SLO class 'video'"):
        select_requests(wl, dataclasses.replace(TINY, classes=("video",)))
    with pytest.raises(UserError, match="no requests in"):
        select_requests(wl, dataclasses.replace(TINY, start_s=1e6))


def test_slo_bound() -> None:
    assert slo_bound_s(CHAT_SLO, 1000) == pytest.approx(1.0 + 0.1 * 999)
    assert slo_bound_s(BATCH_SLO, 2048) == 600.0
    assert slo_bound_s(SLO("x", ttft_ms=500.0, tpot_ms=10.0, deadline_s=5.0), 1000) == 5.0
    assert slo_bound_s(SLO("x", ttft_ms=500.0), 10) is None


def test_guard_counts_exactly_the_misses_the_metrics_count() -> None:
    """The guard's per-request verdict (at finish time) equals ``met_slo`` of the metrics."""
    tight = SLO("chat", ttft_ms=300.0, tpot_ms=40.0)
    cell = dataclasses.replace(TINY, slo=(tight,))
    wl = load_workload("azure", 1.0)
    reqs, measured = select_requests(wl, cell)
    guard = AttainmentGuard(measured, {})
    config = BenchConfig(model=cell.model, gpu=cell.gpu, tp=1, replicas=2)
    result = run_sim_cell(
        config, "sim:vllm", "fcfs", dataclasses.replace(wl, requests=reqs), plugins=[guard]
    )
    df = result.requests[result.requests.request_id.isin(measured)]
    misses = df[~df.met_slo].groupby("slo_class").size().to_dict()
    assert misses.get("chat", 0) > 0
    assert guard.misses == misses


def test_early_stop_agrees_with_the_full_run() -> None:
    full = run_cell(TINY)
    att = attainment(full)
    assert full["stopped"] is None and att["chat"] < 0.99 <= att["batch"]
    stopped = run_cell(dataclasses.replace(TINY, targets=(("batch", 0.99), ("chat", 0.99))))
    assert stopped["stopped"]["slo_class"] == "chat" and stopped["summary"] == []
    n_chat = full["n_measured"]["chat"]
    assert stopped["stopped"]["allowed"] == allowed_misses(n_chat, 0.99)
    # A target the cell meets: no stop, and the horizon changes no attainment.
    low = att["chat"] - 0.01
    passed = run_cell(dataclasses.replace(TINY, targets=(("chat", low),)))
    assert passed["stopped"] is None and attainment(passed) == att


def test_run_cell_is_deterministic_and_accounts_for_every_request() -> None:
    one, two = run_cell(TINY), run_cell(TINY)
    one.pop("wall_s"), two.pop("wall_s")
    assert one == two
    rows = {r["slo_class"]: r for r in one["summary"]}
    assert rows["all"]["n_requests"] == sum(one["n_measured"].values())
    done = rows["all"]["n_finished"] + rows["all"]["n_rejected"] + rows["all"]["n_failed"]
    assert done == rows["all"]["n_requests"]
    assert 0 < one["mfu"] < one["busy_fraction"] <= 1


def test_native_resolves_to_the_profile_or_falls_back_with_a_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert resolve_policy("native", "sim:trtllm") == ("fcfs", None)
    # SGLang 0.5.23's shipped --schedule-policy is fcfs (issue 19); the fallback is checked on a
    # profile whose native policy (lpm) is made unregistered.
    assert resolve_policy("native", "sim:sglang") == ("fcfs", None)
    assert resolve_policy("priority", "sim:sglang") == ("priority", None)
    from dataclasses import replace

    import superinfer.harness.policies as policies
    from superinfer.sim.profiles import SIM_SGLANG

    without_lpm = {k: v for k, v in policies.available_policies().items() if k != "lpm"}
    monkeypatch.setattr(policies, "available_policies", lambda: without_lpm)
    lpm_profile = replace(SIM_SGLANG, native_policy="lpm")
    monkeypatch.setattr(policies, "get_profile", lambda engine: lpm_profile)
    policy, note = resolve_policy("native", "sim:sglang")
    assert policy == "fcfs" and note == (
        "sim:sglang's native policy 'lpm' is not registered: ran 'fcfs'"
    )
    with pytest.raises(UserError, match="unknown policy 'fifo'; registered: "):
        resolve_policy("fifo", "sim:vllm")


def test_cell_key_depends_on_every_field() -> None:
    key = cell_key(TINY)
    assert key == cell_key(dataclasses.replace(TINY))
    for change in ({"replicas": 3}, {"seed": 1}, {"warmup_s": 0.0}, {"targets": (("chat", 0.9),)}):
        assert cell_key(dataclasses.replace(TINY, **change)) != key  # type: ignore[arg-type]


def test_cache_round_trip_and_corrupt_files(tmp_path: Path) -> None:
    cache = CellCache(tmp_path)
    outcome = {"summary": [{"slo_class": "chat", "slo_attainment": 0.5}], "stopped": None}
    assert cache.get("k") is None
    cache.put("k", TINY, outcome)
    assert cache.get("k") == outcome
    assert json.loads((tmp_path / "k.json").read_text())["cell"]["replicas"] == 2
    assert CellCache(tmp_path, read=False).get("k") is None
    (tmp_path / "k.json").write_text("{truncated")
    assert cache.get("k") is None
    assert CellCache(None).get("k") is None


def test_a_full_stack_cell_runs_the_planner_and_a_bad_stack_is_refused() -> None:
    """``stack="full"`` is ``bench --stack full``: on sim:vllm the rotation, the reuse placement
    and the KV quantization planner, which quantizes under KV pressure (one 70B replica on four
    A100s, 589 requests in the minute): peak KV falls, every request is still accounted for."""
    base = dataclasses.replace(TINY, policy="superinfer", model="llama-3.1-70b", tp=4, replicas=1)
    plain, full = run_cell(base), run_cell(dataclasses.replace(base, stack="full"))
    rows = {s: {r["slo_class"]: r for r in o["summary"]} for s, o in (("none", plain),
                                                                      ("full", full))}  # fmt: skip
    assert rows["full"]["all"]["n_requests"] == rows["none"]["all"]["n_requests"]
    assert rows["full"]["all"]["n_requests"] == 589
    # issue 18's seed target, peak KV <= 0.67x (0.611x here: 24.59 of 40.25 GB)
    assert rows["full"]["all"]["kv_peak_gb"] <= 0.67 * rows["none"]["all"]["kv_peak_gb"]
    with pytest.raises(UserError, match=r"--stack 'half': expected none, full or .*unknown: half"):
        check_cell(dataclasses.replace(TINY, stack="half"))
    with pytest.raises(
        UserError, match="stack 'quant,rotation' is not canonical: 'rotation,quant'"
    ):
        check_cell(dataclasses.replace(TINY, stack="quant,rotation"))
    check_cell(dataclasses.replace(TINY, stack="rotation,reuse"))
