"""The ``superinfer`` command: run directories, determinism, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from superinfer.harness.metrics import SUMMARY_COLUMNS

SMALL = ["--duration-s", "120", "--replicas", "1", "--policies", "fcfs,priority"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "superinfer", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_bench_writes_the_run_directory_and_is_deterministic(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    assert run("bench", *SMALL, "--out", str(one)).returncode == 0
    assert run("bench", *SMALL, "--out", str(two)).returncode == 0
    assert (one / "summary.csv").read_bytes() == (two / "summary.csv").read_bytes()
    summary = pd.read_csv(one / "summary.csv")
    assert list(summary.columns[: len(SUMMARY_COLUMNS)]) == list(SUMMARY_COLUMNS)
    assert summary[["policy", "slo_class"]].values.tolist() == [
        ["fcfs", "batch"],
        ["fcfs", "chat"],
        ["fcfs", "all"],
        ["priority", "batch"],
        ["priority", "chat"],
        ["priority", "all"],
    ]
    requests = pd.read_parquet(one / "requests.parquet")
    n = int(summary.loc[0, "n_requests"] + summary.loc[1, "n_requests"])
    assert len(requests) == 2 * n
    all_rows = summary[summary.slo_class == "all"]
    assert (all_rows.n_finished + all_rows.n_rejected + all_rows.n_failed == n).all()
    meta = json.loads((one / "manifest.json").read_text())
    assert meta["seed"] == 0 and meta["config"]["tp"] == 4 and meta["git_sha"]
    assert "| fcfs | chat |" in (one / "report.md").read_text()


def test_user_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,x,3\n")
    cases = [
        (["bench", "--policies", "fifo"], "error: unknown policy 'fifo'; registered: "),
        (["bench", "--trace", str(bad)], f"error: {bad}:2: field 'ContextTokens': 'x' is not"),
        (["bench", "--gpu", "v100"], "error: unknown GPU 'v100'; known: a100-80gb"),
        (["bench", "--tp", "3"], "error: --tp must divide llama-3.1-70b's 8 KV heads"),
        (["bench", "--rate-scale", "0"], "error: --rate-scale must be > 0"),
    ]
    for args, expected in cases:
        proc = run(*args, "--out", str(tmp_path / "out"))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == proc.stderr.strip().splitlines()[0], proc.stderr
        assert proc.stderr.startswith(expected), proc.stderr


def test_policy_opt_reaches_the_policy_and_mistakes_are_one_line(tmp_path: Path) -> None:
    out = tmp_path / "opt"
    args = ["--duration-s", "30", "--replicas", "1", "--policies", "superinfer"]
    proc = run("bench", *args, "--policy-opt", "superinfer.aging_s=5", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "manifest.json").read_text())
    assert meta["config"]["policy_options"] == {"superinfer": {"aging_s": "5"}}
    for opt, expected in [
        ("superinfer.aging_s=soon", "error: policy 'superinfer': option aging_s='soon' is not"),
        ("superinfer.aging_s=-1", "error: superinfer: aging_s must be > 0, got -1.0"),
        ("nosuch=1", "error: --policy-opt 'nosuch=1': no selected policy has option 'nosuch'"),
    ]:
        proc = run("bench", *args, "--policy-opt", opt, "--out", str(out))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == proc.stderr.strip().splitlines()[0], proc.stderr
        assert proc.stderr.startswith(expected), proc.stderr


def test_policies_lists_options_with_help() -> None:
    proc = run("policies", "--options")
    assert proc.returncode == 0
    assert "    aging_s = 120.0: queueing time after which a request is aged, s" in proc.stdout
    names = [line.split()[0] for line in proc.stdout.splitlines() if not line.startswith(" ")]
    assert names == ["edf", "fcfs", "lpm", "mlfq", "oracle", "priority", "superinfer"]


def test_headline_suite_writes_its_files(tmp_path: Path) -> None:
    out = tmp_path / "headline"
    proc = run(
        "bench",
        "--suite",
        "headline",
        "--duration-s",
        "60",
        "--replicas",
        "1",
        "--policies",
        "fcfs,superinfer",
        "--rate-scales",
        "0.5,1",
        "--rate-scale",
        "1",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns[: len(SUMMARY_COLUMNS)]) == list(SUMMARY_COLUMNS)
    assert "native" in summary.columns
    assert summary.set_index(["policy", "slo_class"]).native.to_dict() == {
        ("fcfs", "chat"): True,
        ("fcfs", "all"): True,
        ("superinfer", "chat"): False,
        ("superinfer", "all"): False,
    }
    sweep = pd.read_csv(out / "sweep.csv")
    assert list(sweep.columns) == ["rate_scale", "engine", "policy", "slo_class", "slo_attainment"]
    assert sorted(sweep.rate_scale.unique()) == [0.5, 1.0]
    starvation = pd.read_csv(out / "starvation.csv")
    assert "max_batch_wait_s" in starvation.columns
    for name in ("sweep.png", "starvation.png", "report.md", "manifest.json"):
        assert (out / name).stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "1 replica(s) × TP 4 = **4 GPUs**" in report and "×1" in report


def test_rotation_suite_needs_a_cpu_tier(tmp_path: Path) -> None:
    proc = run("bench", "--suite", "rotation", "--duration-s", "20", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        "error: --suite rotation needs an engine with a CPU KV tier; sim:vllm showed the policy "
        "none"
    ), proc.stderr
