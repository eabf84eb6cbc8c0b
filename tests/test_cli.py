"""The ``superinfer`` command: run directories, determinism, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from superinfer.harness.report.metrics import SUMMARY_COLUMNS

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


def test_bench_a_workload_spec_then_rebuild_its_report(tmp_path: Path) -> None:
    out = tmp_path / "sg"
    args = ["--workload", "sharegpt-poisson", "--duration-s", "30", "--replicas", "1"]
    proc = run("bench", *args, "--policies", "fcfs", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "manifest.json").read_text())
    assert meta["workload"]["name"] == "sharegpt-poisson"
    assert meta["workload"]["details"]["sources"][0]["arrivals"] == "poisson"
    summary = pd.read_csv(out / "summary.csv")
    assert summary["slo_class"].tolist() == ["chat", "all"]
    assert summary.loc[0, "n_requests"] == 123  # Poisson at 4 req/s for 30 s, seed 0
    assert (out / "metrics.csv").is_file() and (out / "ttft_cdf.png").is_file()
    (out / "report.md").unlink()
    proc = run("report", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "![attainment.png](attainment.png)" in (out / "report.md").read_text()


def test_workload_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    spec = tmp_path / "w.toml"
    spec.write_text('[[source]]\nname = "a"\nformat = "azure"\nslo = "chat"\n')
    cases = [
        (["bench", "--workload", str(spec)], f"error: {spec}:1: field 'source[0].file': missing"),
        (["bench", "--workload", "nope"], "error: unknown workload 'nope'; use a built-in"),
        (
            ["bench", "--workload", "azure-mixed", "--trace", "azure"],
            "error: give --workload or --trace, not both",
        ),
        (["report", str(tmp_path / "none")], f"error: {tmp_path / 'none'}: not a run directory"),
    ]
    for args, expected in cases:
        proc = run(*args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(expected), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_workloads_lists_the_builtins() -> None:
    proc = run("workloads")
    assert [line.split()[0] for line in proc.stdout.splitlines()] == [
        "azure-mixed",
        "mooncake-chat",
        "reasoning-long",
        "sharegpt-poisson",
    ]


def test_bench_help_states_the_suites_own_defaults() -> None:
    # The --suite help quotes the defaults the suites apply (harness.bench): a change of either
    # without the other fails here (the help said 0.7 and azure-conv x 1 replica until 12-06).
    from superinfer.harness.bench import HEADLINE_RATE_SCALE, ROTATION_DEFAULTS

    text = " ".join(run("bench", "--help").stdout.split())
    assert f"--rate-scale {HEADLINE_RATE_SCALE:g} as the headline load" in text
    rotation = (
        f"--workload {ROTATION_DEFAULTS['workload']}, --replicas {ROTATION_DEFAULTS['replicas']},"
        f" --duration-s {ROTATION_DEFAULTS['duration_s']:g}"
    )
    assert rotation in text


TINY_SPEC = """
[cell]
model = "llama-3.1-8b"
gpu = "a100-80gb"
tp = 1
start_s = 1200
duration_s = 30

[grid]
engine = ["sim:vllm"]
policy = ["fcfs", "priority"]
replicas = [1, 2]
"""

TINY_PLAN = ["--engine", "sim:vllm", "--policies", "native,priority", "--model", "llama-3.1-8b",
             "--gpu", "a100-80gb", "--tp", "1", "--window-s", "60", "--window-start-s", "1200",
             "--warmup-s", "30", "--max-replicas", "8"]  # fmt: skip


def test_sweep_writes_a_tidy_table_and_resumes(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.toml"
    spec.write_text(TINY_SPEC)
    out = tmp_path / "sweep"
    first = run("sweep", str(spec), "--workers", "2", "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert "4 cells (4 run, 0 cached)" in first.stderr
    table = pd.read_csv(out / "sweep.csv")
    assert table[["policy", "replicas", "slo_class"]].values.tolist() == [
        [p, r, c] for p in ("fcfs", "priority") for r in (1, 2) for c in ("batch", "chat", "all")
    ]
    again = run("sweep", str(spec), "--out", str(out))
    assert "4 cells (0 run, 4 cached)" in again.stderr
    assert pd.read_csv(out / "sweep.csv").equals(table)
    assert json.loads((out / "manifest.json").read_text())["cells_cached"] == 4


def test_fleet_plan_writes_plan_csv(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    proc = run("fleet", "plan", *TINY_PLAN, "--workers", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = (out / "plan.csv").read_text().splitlines()
    assert lines[0] == (
        "workload,engine,policy,layout,replicas,tp,gpus,meets_slo,chat_attainment,"
        "batch_attainment,cost_per_mtok"
    )
    plan = pd.read_csv(out / "plan.csv")
    assert plan[["policy", "layout", "replicas", "gpus", "meets_slo"]].values.tolist() == [
        ["fcfs", "shared", 4, 4, True],  # the same numbers as tests/harness/test_fleet.py
        ["priority", "shared", 3, 3, True],
    ]
    assert "| sim:vllm | priority | shared | 3 | 3 | yes |" in (out / "plan.md").read_text()
    for name in ("plan_detail.csv", "search.csv", "manifest.json"):
        assert (out / name).is_file()


def test_sweep_and_fleet_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text("[grid]\nreplica = [1, 2]\n")
    cases = [
        (["sweep", str(spec)], f"error: {spec}: [grid] unknown field 'replica'; fields: "),
        (["sweep", str(tmp_path / "none.toml")], "error: "),
        (["fleet", "plan", "--target", "chat=1.5"], "error: --target 'chat=1.5': expected"),
        (["fleet", "plan", "--target", "video=0.9"], "error: --target: workload 'azure' has no"),
        (["fleet", "plan", "--slo", "chat:ttft=5"], "error: --slo 'chat:ttft=5': 'ttft=5' is not"),
        (["fleet", "plan", "--slo", "chat:ttft_ms=-1"], "error: --slo chat: SLO 'chat': ttft_ms"),
        (["fleet", "plan", "--window-s", "soon"], "error: --window-s must be a number"),
        (["fleet", "plan", "--policies", "nosuch"], "error: unknown policy 'nosuch'"),
        (["sweep", str(spec), "--address", "auto"], "error: "),
    ]
    for args, expected in cases:
        proc = run(*args, "--out", str(tmp_path / "out"))
        assert proc.returncode == 2, (args, proc.stderr)
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


def test_bench_help_names_every_built_in_workload_and_gpu() -> None:
    from click.testing import CliRunner

    from superinfer.cli import cli
    from superinfer.harness.workload.specs import builtin_specs
    from superinfer.sim.hardware import GPUS

    text = " ".join(CliRunner().invoke(cli, ["bench", "--help"], terminal_width=400).output.split())
    workloads = text.split("Workload spec: a built-in name (")[1].split(";")[0]
    assert workloads.split(", ") == sorted(builtin_specs())
    gpus = text.split("GPU: ")[1].split(".")[0].replace(" or ", ", ")
    assert gpus.split(", ") == list(GPUS)


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
    args = ["--suite", "rotation", "--duration-s", "20", "--cpu-kv-ratio", "0"]
    proc = run("bench", *args, "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        "error: --suite rotation needs an engine with a CPU KV tier; sim:vllm showed the policy "
        "none"
    ), proc.stderr


def test_seed_suite_prints_rounded_values_and_a_dash_for_an_absent_class(tmp_path: Path) -> None:
    # The Azure mix's first batch request arrives at 77 s: a 10 s window has no batch class.
    args = ["--suite", "seed", "--engines", "sim:vllm", "--duration-s", "10", "--replicas", "1"]
    proc = run("bench", *args, "--out", str(tmp_path / "seed"))
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "seed" / "summary.csv")
    rows = {(r.policy, r.metric): r.value for r in table.itertuples()}
    lines = proc.stdout.splitlines()
    (batch,) = [x for x in lines if "fcfs" in x and "batch_output_tok_s" in x]
    assert batch.split()[-2:] == ["–", "–"]  # value and article value: no batch request
    (kv,) = [x for x in lines if "fcfs" in x and "kv_peak_gb" in x]
    assert kv.split()[-2] == f"{rows['fcfs', 'kv_peak_gb']:.4g}"
    report = (tmp_path / "seed" / "report.md").read_text()
    assert "| `sim:vllm` | batch_throughput_ratio | – | – | – | 0.96x |" in report
    assert "–: no value: a class had no finished request in the window on one side" in report


def test_bench_says_when_a_source_has_no_request_in_the_window(tmp_path: Path) -> None:
    args = ["--duration-s", "10", "--replicas", "1", "--policies", "fcfs"]
    proc = run("bench", *args, "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    note = "note: no request of source 'code' (batch) in this window: its class has no row"
    assert note in proc.stderr.splitlines()
