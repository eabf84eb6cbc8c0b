"""``bench --suite seed``: native vs the whole stack, the table's arithmetic and its files."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from superinfer.harness.bench import BenchConfig, suite_defaults
from superinfer.harness.errors import UserError
from superinfer.harness.suites_seed import (
    COMPARISONS,
    METRICS,
    REFERENCE,
    SEED_COLUMNS,
    run_seed_suite,
)


def test_seed_suite_writes_both_sides_and_their_ratios(tmp_path: Path) -> None:
    config = BenchConfig(engines=("sim:vllm",), rate_scale=0.6, duration_s=10.0, replicas=1)
    table, files = run_seed_suite(config, tmp_path / "seed", command=["test"])
    assert files == "summary.csv, report.md, manifest.json"
    written = pd.read_csv(tmp_path / "seed" / "summary.csv")
    assert tuple(written.columns) == SEED_COLUMNS
    assert len(written) == 3 * len(METRICS) + len(COMPARISONS)
    assert set(written["stack"]) == {"none", "full", "full/none"}
    assert set(written.loc[written["stack"] == "none", "policy"]) == {"fcfs"}  # sim:vllm's native
    assert set(written.loc[written["stack"] == "full/none", "policy"]) == {"superinfer/fcfs"}
    assert list(written["policy"].iloc[-len(METRICS) :]) == [REFERENCE[0]] * len(METRICS)
    values = {(r.policy, r.stack, r.metric): r.value for r in table.itertuples()}
    for name, (metric, kind, _, _) in COMPARISONS.items():
        native, full = values[("fcfs", "none", metric)], values[("superinfer", "full", metric)]
        want = full / native if kind == "ratio" else (full - native) * 100
        got = values[("superinfer/fcfs", "full/none", name)]
        assert got == pytest.approx(want, rel=1e-12, nan_ok=True)
    article = written.set_index(["policy", "stack", "metric"])["seed_article_value"]
    assert article[("fcfs", "none", "chat_slo_attainment")] == 0.78
    assert article[("superinfer/fcfs", "full/none", "chat_p99_latency_ratio")] == 0.6
    assert pd.isna(article[(*REFERENCE, "chat_slo_attainment")])  # no article value
    report = (tmp_path / "seed" / "report.md").read_text()
    assert "| `sim:vllm` | peak_kv_ratio |" in report
    # the oracle's column: its chat attainment and its points over native, from the table
    points = (
        values[(*REFERENCE, "chat_slo_attainment")]
        - values[("fcfs", "none", "chat_slo_attainment")]
    ) * 100
    assert f"({points:+.1f} pts) |" in report
    assert "applied rotation, reuse, quant; not applied: none." in report


def test_seed_suite_defaults_are_the_headline_load_on_the_three_sim_engines() -> None:
    own = suite_defaults("seed", workload_given=False, given=set())
    assert own["engines"] == "sim:vllm,sim:sglang,sim:trtllm" and own["rate_scale"] == 0.6


def test_seed_suite_policy_opts_reach_the_stack_side_only(tmp_path: Path) -> None:
    config = BenchConfig(
        engines=("sim:vllm",), rate_scale=0.6, duration_s=10.0, replicas=1,
        policy_opts=("superinfer.ttft_boost_whole=true", "credit_step_memory=2000"),
        engine_options={"mixed_batches": "1"},
    )  # fmt: skip
    table, _ = run_seed_suite(config, tmp_path / "seed", command=["test"])
    assert set(table.loc[table["stack"] == "none", "policy"]) == {"fcfs"}  # ran, no option error
    meta = json.loads((tmp_path / "seed" / "manifest.json").read_text())
    assert meta["config"]["policy_opts"] == []
    assert meta["config"]["policy_options"] == {
        "superinfer": {"ttft_boost_whole": "true", "credit_step_memory": "2000"},
        "oracle": {"credit_step_memory": "2000"},
    }
    report = (tmp_path / "seed" / "report.md").read_text()
    assert (
        "Settings other than the defaults: `oracle`: `credit_step_memory=2000`; `superinfer`: "
        "`credit_step_memory=2000`, `ttft_boost_whole=true`; engine options (both sides): "
        "`mixed_batches=1`.\n" in report
    )


def test_seed_suite_rejects_an_option_of_another_policy(tmp_path: Path) -> None:
    config = BenchConfig(engines=("sim:vllm",), duration_s=10.0, replicas=1,
                         policy_opts=("fcfs.nonesuch=1",))  # fmt: skip
    with pytest.raises(UserError, match=r"'fcfs' is not among the selected \(superinfer, oracle\)"):
        run_seed_suite(config, tmp_path / "seed")
    assert not (tmp_path / "seed").exists()
