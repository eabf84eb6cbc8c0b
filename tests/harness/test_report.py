"""Reports: metrics.csv in long format, plots, rebuilding and comparing run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from superinfer.harness.bench import BenchConfig, run_bench
from superinfer.harness.errors import UserError
from superinfer.harness.report import results
from superinfer.harness.report.markdown import (
    as_written,
    compare_runs,
    rebuild_report,
    render_markdown,
    write_plots,
)
from superinfer.harness.report.metrics import METRIC_COLUMNS, metrics_long, summarize
from superinfer.harness.report.plots import PLOT_FILES
from superinfer.harness.report.results import manifest, short_sha, write_run
from tests.harness.test_metrics import table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_metrics_long_has_every_summary_number_with_its_unit() -> None:
    requests = table().assign(engine="e", policy="p")
    summary = pd.DataFrame(
        summarize(requests, engine="e", policy="p", kv_peak_bytes={"all": 3e9, "chat": 2e9})
    )
    long = metrics_long(summary, requests)
    assert tuple(long.columns) == METRIC_COLUMNS
    row = long.set_index(["metric", "slo_class"])
    assert row.loc[("slo_attainment", "chat"), "value"] == pytest.approx(1 / 3)
    assert row.loc[("slo_attainment", "chat"), "unit"] == "fraction"
    assert row.loc[("kv_peak_gb", "chat"), ["unit", "value"]].tolist() == ["GB", 2.0]
    assert row.loc[("goodput_rps", "all"), "unit"] == "req/s"
    # p90 over the finished chat requests' TTFT (200 and 1500 ms): 200 + 0.9 * 1300.
    assert row.loc[("ttft_p90_ms", "chat"), "value"] == pytest.approx(1370.0)
    per_key = 17 + 3  # the 17 numeric summary columns + three p90s
    assert len(long) == 3 * per_key
    assert set(long["engine"]) == {"e"} and set(long["policy"]) == {"p"}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 90 s slice of azure-mixed on one replica, both policies, written like `bench` does."""
    out = tmp_path_factory.mktemp("run")
    config = BenchConfig(
        workload="azure-mixed", replicas=1, duration_s=90.0, policies=("fcfs", "priority")
    )
    result = run_bench(config)
    meta = manifest(result.info, command=["test"])
    plots = write_plots(out, result.summary, result.requests, result.timeline, meta)
    write_run(
        out,
        result.summary,
        result.requests,
        meta,
        render_markdown(as_written(result.summary), meta, plots),
        result.timeline,
    )
    return out


def test_bench_run_has_plots_metrics_and_a_report_that_shows_them(small_run: Path) -> None:
    for name in ("ttft_cdf.png", "e2e_cdf.png", "attainment.png", "kv_hbm.png", "queue.png"):
        assert (small_run / name).read_bytes()[:8] == PNG_MAGIC, name
    report = (small_run / "report.md").read_text()
    assert "![ttft_cdf.png](ttft_cdf.png)" in report and PLOT_FILES["queue.png"] in report
    assert "| chat | ≤ 1,000 ms | ≤ 100 ms | – | 0 |" in report  # the SLO class table
    assert "Workload: `azure-mixed`" in report
    metrics = pd.read_csv(small_run / "metrics.csv")
    summary = pd.read_csv(small_run / "summary.csv")
    att = metrics[(metrics.metric == "slo_attainment") & (metrics.policy == "priority")]
    expected = summary[summary.policy == "priority"].set_index("slo_class")["slo_attainment"]
    assert att.set_index("slo_class")["value"].to_dict() == pytest.approx(expected.to_dict())


def test_report_rebuilds_a_run_and_plots_a_sweep(small_run: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.csv"
    pd.DataFrame(
        {
            "rate_scale": [1.0, 2.0, 1.0, 2.0],
            "engine": ["sim:vllm"] * 4,
            "policy": ["fcfs", "fcfs", "priority", "priority"],
            "slo_class": ["chat"] * 4,
            "slo_attainment": [0.9, 0.5, 0.95, 0.7],
        }
    ).to_csv(sweep, index=False)
    out = tmp_path / "rebuilt"
    report = rebuild_report(small_run, out_dir=out, sweep=sweep)
    assert (out / "sweep.png").read_bytes()[:8] == PNG_MAGIC
    text = report.read_text()
    assert "![sweep.png](sweep.png)" in text
    assert (
        text.split("## Results")[1].split("## Plots")[0]
        == ((small_run / "report.md").read_text().split("## Results")[1].split("## Plots")[0])
    )


def test_compare_two_runs(small_run: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    for name in ("summary.csv", "requests.parquet", "timeline.parquet", "manifest.json"):
        (other / name).write_bytes((small_run / name).read_bytes())
    report = compare_runs([small_run, other], tmp_path / "cmp")
    summary = pd.read_csv(tmp_path / "cmp" / "summary.csv")
    assert summary["run"].unique().tolist() == [small_run.name, "other"]
    assert len(summary) == 2 * len(pd.read_csv(small_run / "summary.csv"))
    assert (tmp_path / "cmp" / "attainment.png").read_bytes()[:8] == PNG_MAGIC
    assert f"| {small_run.name} | `{small_run}` | `azure-mixed` |" in report.read_text()


def test_report_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a run directory"):
        rebuild_report(tmp_path / "missing")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "manifest.json").write_text(json.dumps({}))
    with pytest.raises(UserError, match="not a complete run directory"):
        rebuild_report(tmp_path / "half")
    with pytest.raises(UserError, match="at least two"):
        compare_runs([tmp_path], tmp_path / "cmp")


def test_a_folder_with_only_a_sweep_gets_a_sweep_report(tmp_path: Path) -> None:
    pd.DataFrame(
        {
            "rate_scale": [0.5, 1.0],
            "engine": ["sim:vllm"] * 2,
            "policy": ["fcfs"] * 2,
            "slo_class": ["chat"] * 2,
            "slo_attainment": [0.99, 0.61],
        }
    ).to_csv(tmp_path / "sweep.csv", index=False)
    text = rebuild_report(tmp_path).read_text()
    assert (tmp_path / "sweep.png").read_bytes()[:8] == PNG_MAGIC
    assert "| sim:vllm | fcfs | chat | 0.5 | 0.990 |" in text
    assert "| sim:vllm | fcfs | chat | 1 | 0.610 |" in text


@pytest.mark.parametrize(
    ("full", "length", "short"),
    [
        ("0123456789abcdef0123456789abcdef01234567", 7, "0123456"),
        ("0123456789abcdef0123456789abcdef01234567-dirty", 12, "0123456789ab-dirty"),
        ("unknown", 12, "unknown"),
    ],
)
def test_short_sha_cuts_the_commit_and_keeps_the_dirty_mark(
    monkeypatch: pytest.MonkeyPatch, full: str, length: int, short: str
) -> None:
    monkeypatch.setattr(results, "git_sha", lambda: full)
    assert short_sha(length) == short
