"""The step-time fit's total, each real run's host speed and replays at that speed (issue 19)."""

from __future__ import annotations

import dataclasses
import json
import math
import runpy
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from superinfer.harness.bench import BenchConfig, run_bench
from superinfer.harness.engines.hf import hf_options
from superinfer.harness.engines.hf_sim import sim_profile
from superinfer.harness.errors import UserError
from superinfer.harness.offline.calibrate_hf import fit_steps, run_speeds
from superinfer.harness.suites_engines import run_engines
from superinfer.harness.suites_engines_options import suite_options
from superinfer.harness.suites_engines_replay import host_speeds, resimulate
from superinfer.sim.hf_cpu import HFCPUStepTime, shape_of_totals

ROOT = Path(__file__).resolve().parents[2]
TRUE = HFCPUStepTime((0.02, 0.004, 0.001, 0.0005, 0.00002, 0.0, 0.0, 0.0))


def _steps(model: HFCPUStepTime, speeds: dict[str, float], n: int = 40) -> pd.DataFrame:
    """A step log of ``n`` steps per run whose durations are ``model``'s times ``speeds[run]``."""
    rng = np.random.default_rng(0)
    rows = []
    for run, speed in speeds.items():
        for i in range(n):
            seqs = int(rng.integers(1, 8))
            prefill = i % 4 == 0
            tokens = int(rng.integers(32, 512)) if prefill else seqs
            kv = tokens + int(rng.integers(0, 2000))
            shape = shape_of_totals(tokens, seqs, seqs, kv)
            rows.append({
                "run": run, "kind": "prefill" if prefill else "decode", "num_tokens": tokens,
                "num_seqs": seqs, "num_samples": seqs, "kv_tokens": kv,
                "duration_ms": model.step_time_s(shape) * 1e3 * speed,
            })  # fmt: skip
    return pd.DataFrame(rows)


def test_a_scaled_model_times_every_step_by_the_factor() -> None:
    spilling = dataclasses.replace(TRUE, spill_tokens=1000.0, spill_s_per_token=1e-5)
    shape = shape_of_totals(64, 2, 2, 1500)
    assert spilling.scaled(1.5).step_time_s(shape) == pytest.approx(
        1.5 * spilling.step_time_s(shape), rel=1e-12
    )
    assert spilling.scaled(1.5).spill_tokens == 1000.0
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="step-time scale must be finite and > 0"):
            TRUE.scaled(bad)
    doc = {"coefficients": TRUE.to_dict(), "kv_spill": spilling.spill_dict()}
    assert HFCPUStepTime.from_calibration(doc) == spilling
    with pytest.raises(ValueError, match="bad calibration"):
        HFCPUStepTime.from_calibration({"kv_spill": {}})


def test_run_speeds_are_each_runs_measured_over_predicted_time() -> None:
    steps = _steps(TRUE, {"hf_fcfs_0.2_0": 1.0, "hf_fcfs_0.2_1": 1.25})
    got = run_speeds(steps, TRUE)
    assert list(got) == ["hf_fcfs_0.2_0", "hf_fcfs_0.2_1"]
    assert got["hf_fcfs_0.2_0"] == pytest.approx(1.0, rel=1e-12)
    assert got["hf_fcfs_0.2_1"] == pytest.approx(1.25, rel=1e-12)
    # an SGLang log is timed per scheduler iteration: a busy gap (<= 20 ms) is added, an idle
    # one is replaced by the median busy gap (here 2 ms)
    one = _steps(TRUE, {"sglang_native_1_0": 1.0}, n=3)
    one["gap_ms"] = [2.0, 2.0, 500.0]
    total = one["duration_ms"].sum()
    assert run_speeds(one, TRUE)["sglang_native_1_0"] == pytest.approx((total + 6.0) / total)
    with pytest.raises(UserError, match="step log lacks column 'run'"):
        run_speeds(steps.drop(columns="run"), TRUE)
    with pytest.raises(UserError, match="run hf_fcfs_0.2_0: the step-time model predicts no time"):
        run_speeds(steps, HFCPUStepTime((0.0,) * 8))


def test_the_fit_predicts_the_steps_total_time() -> None:
    """Exact data: the least squares finds the model and the scale is 1; one slow run pulls the
    relative-error fit below the total, and the scale restores it exactly."""
    exact = _steps(TRUE, {"a": 1.0})
    model, report = fit_steps(exact)
    assert report["total_scale"] == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(exact["predicted_ms"], exact["duration_ms"], rtol=1e-9)
    assert model.step_time_s(shape_of_totals(300, 3, 3, 900)) == pytest.approx(
        TRUE.step_time_s(shape_of_totals(300, 3, 3, 900)), rel=1e-9
    )
    mixed = _steps(TRUE, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.6})
    model, report = fit_steps(mixed)
    assert report["total_scale"] > 1.0
    assert mixed["predicted_ms"].sum() == pytest.approx(mixed["duration_ms"].sum(), rel=1e-12)
    assert report["scaled_fit"]["mean_abs_rel_err"] == round(
        float(((mixed["predicted_ms"] - mixed["duration_ms"]).abs() / mixed["duration_ms"]).mean()),
        4,
    )


def _one_request_ttft(options: dict[str, str]) -> float:
    config = BenchConfig(
        engines=("sim:hf-cpu",), policies=("fcfs",), engine_options=options, seed=0,
        duration_s=20.0, rate_scale=0.05,
    )  # fmt: skip
    return float(run_bench(config).requests["ttft_ms"].iloc[0])


def test_step_time_scale_stretches_every_simulated_step(tmp_path: Path) -> None:
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"coefficients": TRUE.to_dict(), "request_latency_ms": 5.0}))
    base = {"step_time_file": str(fit), "request_latency_ms": "0"}
    # the first request arrives to an idle engine: its first token is its prefill steps alone
    t1, t3 = _one_request_ttft(base), _one_request_ttft({**base, "step_time_scale": "3"})
    assert t3 == pytest.approx(3 * t1, rel=1e-9)
    profile = sim_profile(hf_options({"step_time_file": str(fit), "step_time_scale": "2"}))
    assert profile.step_time == TRUE.scaled(2.0) and profile.request_latency_s == 0.005
    for bad in ("0", "-1", "inf", "nan"):
        with pytest.raises(UserError, match="step_time_scale must be > 0"):
            hf_options({"step_time_scale": bad})


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    """A suite run folder of ``sim:hf-cpu`` rows posing as the real hf engine's (2 repeats at
    0.2 req/s), with the fit and a step log whose runs took the fit's time, one 1.5x."""
    tmp = tmp_path_factory.mktemp("suite")
    calibration = tmp / "hf_step_time.json"
    calibration.write_text(json.dumps({"coefficients": TRUE.to_dict()}))
    opts = suite_options({
        "suite.engines": "sim:hf-cpu", "suite.loads.hf": "0.2", "suite.duration_s": "15",
        "suite.repeats": "2", "suite.hf_step_time_file": str(calibration),
    })  # fmt: skip
    ran = run_engines(BenchConfig(seed=3), opts, tmp / "work")
    sim = ran.summary
    sim.assign(engine="hf").to_csv(tmp / "summary.csv", index=False)
    manifest = {
        "seed": 3,
        "options": dataclasses.asdict(opts),
        "engines": ran.info["engines"],  # the sim row's chat TTFT target
        "superinfer_options": {"hf": {}},
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    runs = {f"hf_{p}_0.2_{r}": 1.0 for r in (0, 1) for p in ("fcfs", "priority", "superinfer")}
    _steps(TRUE, {**runs, "hf_priority_0.2_1": 1.5}).to_parquet(tmp / "steps.parquet")
    return tmp, sim


def test_a_replay_at_host_speed_runs_each_cell_at_its_runs_speed(
    folder: tuple[Path, pd.DataFrame],
) -> None:
    src, sim = folder
    assert host_speeds(src, src / "hf_step_time.json", "hf")["hf_priority_0.2_1"] == pytest.approx(
        1.5
    )
    with pytest.raises(UserError, match="no run of sglang"):
        host_speeds(src, src / "hf_step_time.json", "sglang")
    with pytest.raises(UserError, match="host_speed sets each cell's step_time_scale"):
        resimulate(src, "sim:hf-cpu", {"step_time_scale": "2"}, speeds={})
    plain = resimulate(src, "sim:hf-cpu")
    fit = src / "hf_step_time.json"
    fast = resimulate(src, "sim:hf-cpu", speeds=host_speeds(src, fit, "hf"))
    key = ["engine", "policy", "repeat", "load", "slo_class"]
    a = plain.set_index(key).sort_index()
    b = fast.set_index(key).sort_index()
    slow = b.index.get_level_values("policy") == "priority"
    slow &= b.index.get_level_values("repeat") == 1
    slow &= b.index.get_level_values("engine") == "sim:hf-cpu"
    # every cell at speed 1.0 replays exactly as before (one policy per run_bench call)
    pd.testing.assert_frame_equal(a[~slow], b[~slow], check_dtype=False)
    assert (b.loc[slow, "e2e_p50_ms"] > a.loc[slow, "e2e_p50_ms"]).all()
    shutil.copy(src / "steps.parquet", src / "steps.bak")
    pd.read_parquet(src / "steps.parquet").query("run != 'hf_fcfs_0.2_1'").to_parquet(
        src / "steps.parquet"
    )
    try:
        with pytest.raises(UserError, match="no host speed for run hf_fcfs_0.2_1"):
            resimulate(src, "sim:hf-cpu", speeds=host_speeds(src, fit, "hf"))
    finally:
        shutil.move(src / "steps.bak", src / "steps.parquet")


def test_fidelity_host_speed_writes_the_three_replays(
    folder: tuple[Path, pd.DataFrame], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, _ = folder
    mod = runpy.run_path(str(ROOT / "benchmarks" / "fidelity_host_speed.py"), run_name="t")
    assert mod["main"](["--src", str(src), "--out", str(tmp_path)]) == 0
    summary = pd.read_csv(tmp_path / "host_speed_summary.csv")
    assert list(summary.columns) == mod["SUMMARY"] and len(summary) == 1
    rows = pd.read_csv(tmp_path / "host_speed_fidelity.csv")
    assert list(rows["replay"].unique()) == ["as_run", "refit", "host_speed"]
    speeds = pd.read_csv(tmp_path / "host_speed.csv")
    assert len(speeds) == 6 and set(speeds["engine"]) == {"hf"}
    # against the refit, whose prediction totals the steps' time, the runs' predicted times
    # (measured / speed) add up to the measured total; one run is 1.5x the others
    measured = pd.read_parquet(src / "steps.parquet").groupby("run")["duration_ms"].sum()
    speed = speeds.set_index("run")["host_speed"]
    assert (measured / speed).sum() == pytest.approx(measured.sum(), rel=1e-5)
    assert float(speed.max() / speed.min()) == pytest.approx(1.5, rel=1e-5)
    assert summary["speed_max"].iloc[0] == pytest.approx(speed.max(), rel=1e-5)
    assert "rows within" in capsys.readouterr().out
    assert mod["main"](["--src", str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 2


def test_the_suite_records_each_runs_host_speed_against_its_log_fit(tmp_path: Path) -> None:
    from superinfer.harness.suites_engines import collect_step_logs
    from superinfer.harness.suites_engines_knee import MIN_LOG_STEPS, log_fit

    logs = tmp_path / "steps"
    logs.mkdir()
    lone = {"coefficients": TRUE.to_dict(), "source": "lone"}
    info: dict = {}
    said: list[str] = []
    few = _steps(TRUE, {"hf_fcfs_0.3_0": 1.0}, n=10)
    few.drop(columns="run").to_parquet(logs / "hf_fcfs_0.3_0.parquet")
    assert (
        log_fit("hf", lone, collect_step_logs(tmp_path), info, said.append) is lone
    )  # too few steps
    assert "host_speeds" not in info and not said
    n = MIN_LOG_STEPS // 2
    for run, speed in (("hf_fcfs_0.3_0", 1.0), ("hf_superinfer_0.3_0", 1.3)):
        _steps(TRUE, {run: speed}, n=n).drop(columns="run").to_parquet(logs / f"{run}.parquet")
    fit = log_fit("hf", lone, collect_step_logs(tmp_path), info, said.append)
    assert fit["source"].startswith("the hf runs' own step logs") and fit["lone"] == lone
    speeds = info["host_speeds"]["hf"]
    assert list(speeds) == ["hf_fcfs_0.3_0", "hf_superinfer_0.3_0"]
    assert speeds["hf_superinfer_0.3_0"] / speeds["hf_fcfs_0.3_0"] == pytest.approx(1.3)
    # the fit keeps the total: the two runs' predicted times add up to what they took
    took = {r: pd.read_parquet(logs / f"{r}.parquet")["duration_ms"].sum() for r in speeds}
    assert sum(took[r] / speeds[r] for r in speeds) == pytest.approx(sum(took.values()))
    # a log the fit cannot read: the lone fit, said once
    pd.DataFrame({"duration_ms": [1.0] * MIN_LOG_STEPS}).to_parquet(logs / "hf_fcfs_0.3_1.parquet")
    info = {}
    assert log_fit("hf", lone, collect_step_logs(tmp_path), info, said.append) is lone
    assert "host_speeds" not in info and "hf" in info["step_log_fit_failed"]
    assert said == [f"hf: no fit on its step logs ({info['step_log_fit_failed']['hf']}); "
                    "sim:hf-cpu takes the lone fit"]  # fmt: skip


def test_checks_show_each_policys_mean_host_speed() -> None:
    from superinfer.harness.suites_engines_checks import HOST_SPEED_COLUMNS, host_speed_frame
    from superinfer.harness.suites_engines_report import aggregate, policy_checks

    raw = {"hf": {"hf_fcfs_1_0": 1.2, "hf_fcfs_1_1": 1.0, "hf_superinfer_1_0": 0.9,
                  "hf_superinfer_1_1": 0.95, "hf_fcfs_2_0": 1.5}}  # fmt: skip
    speeds = host_speed_frame(raw)
    assert list(speeds.columns) == HOST_SPEED_COLUMNS
    assert speeds.iloc[0].tolist() == ["hf", "fcfs", 1.0, 0, "hf_fcfs_1_0", 1.2]
    with pytest.raises(ValueError, match="run 'hf_fcfs_1' is not <hf>_<policy>_<load>_<repeat>"):
        host_speed_frame({"hf": {"hf_fcfs_1": 1.0}})
    rows = [("hf", p, r, load, "chat", att) for r in (0, 1) for load in (1.0, 2.0)
            for p, att in (("fcfs", 0.7), ("superinfer", 0.9))]  # fmt: skip
    summary = pd.DataFrame(rows, columns=["engine", "policy", "repeat", "load", "slo_class",
                                          "slo_attainment"])  # fmt: skip
    checks = policy_checks(aggregate(summary), {"hf": "fcfs"}, speeds).set_index("load")
    assert checks.loc[1.0, "native_host_speed"] == pytest.approx(1.1)
    assert checks.loc[1.0, "superinfer_host_speed"] == pytest.approx(0.925)
    assert checks.loc[2.0, "native_host_speed"] == 1.5
    assert math.isnan(checks.loc[2.0, "superinfer_host_speed"])  # no log of that run
    plain = policy_checks(aggregate(summary), {"hf": "fcfs"})
    assert plain["native_host_speed"].isna().all()


def test_the_suite_folder_gets_host_speed_csv_and_a_report_line(
    folder: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    from superinfer.harness.suites_engines_checks import host_speed_frame
    from superinfer.harness.suites_engines_report import write_engines

    src, _ = folder
    summary = pd.read_csv(src / "summary.csv")  # hf rows at 0.2 req/s, repeats 0 and 1
    raw = {"hf": {"hf_fcfs_0.2_0": 1.2, "hf_fcfs_0.2_1": 1.0, "hf_superinfer_0.2_0": 0.9,
                  "hf_superinfer_0.2_1": 0.95}}  # fmt: skip
    options = json.loads((src / "manifest.json").read_text())["options"]  # the report reads them
    info = {"host_speeds": raw, "options": options}
    files = write_engines(tmp_path, summary, pd.DataFrame(), info, {"hf": "fcfs"}, ["test"])
    assert "host_speed.csv" in files.split(", ")
    got = pd.read_csv(tmp_path / "host_speed.csv")
    pd.testing.assert_frame_equal(got, host_speed_frame(raw), check_dtype=False)
    checks = pd.read_csv(tmp_path / "checks.csv")
    assert checks[["native_host_speed", "superinfer_host_speed"]].iloc[0].tolist() == pytest.approx(
        [1.1, 0.925]
    )
    assert "`hf` 0.2 req/s: 1.100 / 0.925" in (tmp_path / "report.md").read_text()
    bare = {"options": options}
    again = write_engines(tmp_path, summary, pd.DataFrame(), bare, {"hf": "fcfs"}, ["test"])
    assert "host_speed.csv" not in again and not (tmp_path / "host_speed.csv").exists()
    assert "Host speed of the runs" not in (tmp_path / "report.md").read_text()


def test_bad_steps_and_mixed_logs_give_one_line_errors_or_the_right_runs(
    folder: tuple[Path, pd.DataFrame], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = _steps(TRUE, {"hf_fcfs_0.2_0": 1.0}, n=5)
    late = steps.assign(duration_ms=[*steps["duration_ms"][:-1], math.nan])
    with pytest.raises(UserError, match="a step without a duration_ms"):
        run_speeds(late, TRUE)
    shapeless = steps.astype({"kv_tokens": float}).assign(kv_tokens=math.nan)
    with pytest.raises(UserError, match="a step without a shape"):
        run_speeds(shapeless, TRUE)
    # a suite that ran hf and SGLang keeps both in one log: hf's speeds ignore SGLang's gaps
    src, _ = folder
    mixed = tmp_path / "mixed"
    shutil.copytree(src, mixed)
    hf = pd.read_parquet(src / "steps.parquet")
    sglang = _steps(TRUE, {"sglang_native_1_0": 1.0}, n=5).assign(gap_ms=10.0)
    pd.concat([hf, sglang], ignore_index=True).to_parquet(mixed / "steps.parquet")
    fit = src / "hf_step_time.json"
    assert host_speeds(mixed, fit, "hf") == pytest.approx(host_speeds(src, fit, "hf"))
    assert host_speeds(mixed, fit, "sglang")["sglang_native_1_0"] > 1.0  # its gaps count
    # the suite keeps a good step-log fit when only the host speeds fail
    from superinfer.harness.offline import calibrate_hf
    from superinfer.harness.suites_engines import collect_step_logs
    from superinfer.harness.suites_engines_knee import MIN_LOG_STEPS, log_fit

    logs = tmp_path / "work" / "steps"
    logs.mkdir(parents=True)
    _steps(TRUE, {"x": 1.0}, n=MIN_LOG_STEPS).drop(columns="run").to_parquet(
        logs / "hf_fcfs_0.3_0.parquet"
    )

    def broken(*_a: object) -> dict[str, float]:
        raise UserError("no speeds")

    monkeypatch.setattr(calibrate_hf, "run_speeds", broken)
    info: dict = {}
    said: list[str] = []
    got = log_fit("hf", {"source": "lone"}, collect_step_logs(tmp_path / "work"), info, said.append)
    assert got["source"].startswith("the hf runs' own step logs")
    assert info == {"host_speed_failed": {"hf": "no speeds"}} and said == [
        "hf: no host speeds (no speeds)"
    ]


def test_host_speed_names_policies_with_underscores_and_loads_as_the_runs_print_them() -> None:
    from superinfer.harness.suites_engines_checks import host_speed_frame, host_speed_table
    from superinfer.harness.suites_engines_report import aggregate, policy_checks

    frame = host_speed_frame({"hf": {"hf_my_policy_0.333333_2": 1.25}})
    assert frame.iloc[0].tolist() == [
        "hf",
        "my_policy",
        0.333333,
        2,
        "hf_my_policy_0.333333_2",
        1.25,
    ]
    for bad in ("hf_fcfs_x_0", "hf__1_0", "sglang_fcfs_1_0", "hf_fcfs_1"):
        with pytest.raises(ValueError, match=f"run '{bad}' is not <hf>_<policy>_<load>_<repeat>"):
            host_speed_frame({"hf": {bad: 1.0}})
    info: dict = {"host_speeds": {"hf": {"hf_fcfs_1": 1.0}}}
    assert host_speed_table(info).empty and "hf_fcfs_1" in info["host_speed_failed"]["names"]
    # a load given with more digits than a run name keeps (f"{load:g}") still finds its runs
    load = 0.3333333
    speeds = host_speed_frame(
        {"hf": {f"hf_fcfs_{load:g}_0": 1.2, f"hf_superinfer_{load:g}_0": 0.9}}
    )
    rows = [("hf", p, 0, load, "chat", a) for p, a in (("fcfs", 0.7), ("superinfer", 0.9))]
    summary = pd.DataFrame(rows, columns=["engine", "policy", "repeat", "load", "slo_class",
                                          "slo_attainment"])  # fmt: skip
    checks = policy_checks(aggregate(summary), {"hf": "fcfs"}, speeds)
    assert checks[["native_host_speed", "superinfer_host_speed"]].iloc[0].tolist() == [1.2, 0.9]


def test_the_refit_measures_the_request_path_on_the_lone_log_the_folder_kept(
    tmp_path: Path,
) -> None:
    mod = runpy.run_path(str(ROOT / "benchmarks" / "fidelity_host_speed.py"), run_name="t")
    lone_request_path = mod["lone_request_path"]
    # two lone requests sent one at a time and a batched probe of two (concurrency 2), whose
    # prefills the lone pass's log does not pair with: it must be left out, or no pairing
    pd.DataFrame(
        {
            "engine": ["sglang"] * 4,
            "concurrency": [1, 1, 2, 2],
            "arrival_s": [1.0, 6.0, 11.0, 11.0],
            "prompt_tokens": [160, 900, 64, 64],
            "status": ["finished"] * 4,
            "ttft_ms": [95.0, 410.0, 120.0, 125.0],
        }
    ).to_csv(tmp_path / "lone.csv", index=False)
    assert lone_request_path(tmp_path, "sglang") is None  # no lone log kept: nothing measured
    steps = pd.DataFrame(
        {
            "kind": ["prefill", "decode", "prefill", "prefill", "decode"],
            "num_prefill_tokens": [160, 0, 512, 388, 0],
            "prefix_tokens": [0, 0, 0, 512, 0],
            "duration_ms": [80.0, 40.0, 200.0, 190.0, 45.0],
            "gap_ms": [900.0, 1.0, 500.0, 2.0, 1.0],
        }
    )
    steps.to_parquet(tmp_path / "lone_steps.parquet")
    # 95 - 80 = 15 and 410 - (200 + 2 + 190) = 18: their median
    assert lone_request_path(tmp_path, "sglang") == 16.5
    assert lone_request_path(tmp_path, "hf") is None  # another engine's lone requests: none
    (tmp_path / "lone.csv").write_text("engine,concurrency\n\x00", encoding="utf-8")
    (tmp_path / "lone_steps.parquet").write_text("not parquet", encoding="utf-8")
    with pytest.raises(UserError):
        lone_request_path(tmp_path, "sglang")
