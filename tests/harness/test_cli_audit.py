"""Bad input a helper's audit of the CLI found (2026-12-05; 335 probes): each was a traceback,
a silent drop or an unclear error, and is now one line naming the flag, file or field, before
any work. Exact messages, through the CLI where the check lives there."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from superinfer.cli import cli
from superinfer.harness.errors import DataError, TraceFormatError, UserError
from superinfer.harness.grid.cells import CellSpec, check_cell
from superinfer.harness.report.metrics import SUMMARY_COLUMNS
from superinfer.harness.workload.traces import load_azure_csv


def _error(*args: str) -> BaseException | None:
    """The exception ``superinfer ARGS`` ends with (``None``: it succeeded)."""
    return CliRunner().invoke(cli, list(args)).exception


def _user_error(*args: str) -> str:
    err = _error(*args)
    assert isinstance(err, UserError | DataError), repr(err)
    return str(err)


def test_weights_that_leave_no_kv_memory_are_a_tp_error_before_the_run(tmp_path: Path) -> None:
    # was: ValueError from sim/config.py in the middle of bench, sweep and fleet plan
    out = str(tmp_path / "run")
    got = _user_error(
        "bench", "--workload", "sharegpt-poisson", "--engine", "sim:vllm", "--policies", "fcfs",
        "--duration-s", "30", "--replicas", "1", "--tp", "1", "--out", out,
    )  # fmt: skip
    assert got == (
        "--tp 1: llama-3.1-70b's weights leave no KV memory on a100-80gb at TP1; use a larger TP"
    )
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserError) as err:
        check_cell(CellSpec(engine="sim:vllm", policy="fcfs", tp=1, gpu="h100-80gb"))
    assert str(err.value) == (
        "tp 1: llama-3.1-70b's weights leave no KV memory on h100-80gb at TP1; use a larger TP"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": -1}, "seed must be >= 0, got -1"),
        ({"cpu_kv_ratio": float("inf")}, "cpu_kv_ratio must be >= 0 and finite, got inf"),
        ({"cpu_kv_ratio": -1.0}, "cpu_kv_ratio must be >= 0 and finite, got -1.0"),
        ({"warmup_s": -5.0}, "warmup_s must be >= 0 and finite, got -5.0"),  # was: which one?
    ],
)
def test_a_sweep_or_fleet_cell_checks_seed_and_cpu_tier(
    change: dict[str, Any], message: str
) -> None:
    # was: a numpy ValueError, an OverflowError, and a policy blamed for -29610 free CPU blocks
    with pytest.raises(UserError) as err:
        check_cell(replace(CellSpec(engine="sim:vllm", policy="fcfs"), **change))
    assert str(err.value) == message


def test_bench_refuses_a_negative_seed_and_an_empty_engine_list(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "--seed", "-1", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "-1 is not in the range x>=0" in result.output
    for value in ("", " , "):
        assert _user_error(
            "bench", "--workload", "sharegpt-poisson", "--engine", value, "--out",
            str(tmp_path / "r"),
        ) == f"--engine {value!r} names no engine"  # fmt: skip


def test_conform_checks_its_engine_lists_and_out_before_any_scenario(tmp_path: Path) -> None:
    base = ["conform", "--engine", "sim:vllm", "--scenarios", "head_of_line"]
    assert (
        _user_error(
            "conform", "--engine", "sim:nope", "--policy", "fcfs", "--out", str(tmp_path / "c")
        )
        == "unknown engine 'sim:nope'; known: sim:sglang, sim:trtllm, sim:vllm"
    )
    assert _user_error(*base, "--policy", "", "--out", str(tmp_path / "c")) == (
        "--policy '' names nothing (leave it out for all)"
    )
    afile = tmp_path / "afile.txt"
    afile.write_text("x")
    assert (
        _user_error(*base, "--out", str(afile)) == f"--out {afile}: exists and is not a directory"
    )
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "matrix.csv").write_text('a,"b\nc\n')
    assert _user_error(*base, "--policy", "fcfs", "--out", str(bad)) == (
        f"{bad / 'matrix.csv'}: not a readable matrix (Error tokenizing data. C error: EOF "
        "inside string starting at row 0); move it away"
    )
    (bad / "matrix.csv").write_text("a,b\n1,2\n")
    assert _user_error(*base, "--policy", "fcfs", "--out", str(bad)) == (
        f"{bad / 'matrix.csv'}: no column 'engine', not a conformance matrix; move it away"
    )
    assert (bad / "matrix.csv").read_text() == "a,b\n1,2\n"  # left whole


def test_report_names_the_file_it_cannot_use(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.csv").write_text(",".join(SUMMARY_COLUMNS) + "\n")
    (run / "manifest.json").write_text(json.dumps({}))
    import pandas as pd

    pd.DataFrame({"x": [1]}).to_parquet(run / "requests.parquet")
    assert _user_error("report", str(run)) == (
        f"{run / 'summary.csv'}: no rows (a run writes one per policy and class)"
    )  # was: ZeroDivisionError in the plots
    (run / "manifest.json").write_text("{")
    assert _user_error("report", str(run)).startswith(
        f"{run / 'manifest.json'}: not a complete run directory (Expecting property name"
    )
    afile = tmp_path / "afile.txt"
    afile.write_text("x")
    assert _user_error("report", str(run), "--out", str(afile)) == (
        f"--out {afile}: exists and is not a directory"
    )  # was: FileExistsError


def test_calibrate_checks_out_and_steps_before_it_fits(tmp_path: Path) -> None:
    assert (
        _user_error("calibrate", "--engine", "sglang", "--steps", "x.csv", "--out", str(tmp_path))
        == f"--out {tmp_path}: is a directory (give a file name)"
    )  # was: IsADirectoryError
    afile = tmp_path / "afile.txt"
    afile.write_text("x")
    assert _user_error(
        "calibrate", "--engine", "gpu", "--out", str(afile / "x"), "--no-install"
    ) == (f"--out {afile / 'x'}: {afile} is not a directory")
    assert _user_error("calibrate", "--engine", "published", "--steps", "x.csv") == (
        "--steps applies to calibrate --engine hf or sglang, not published"
    )  # was: ignored, and a long run


def test_cache_eval_refuses_a_nan_cpu_ratio_and_a_foreign_hit_rates_file(tmp_path: Path) -> None:
    assert (
        _user_error(
            "cache-eval",
            "--trace",
            "gen-one-shot",
            "--cpu-ratio",
            "nan",
            "--out",
            str(tmp_path / "c"),
        )
        == "--cpu-ratio must be >= 0 and finite, got nan"
    )  # was: the CPU-tier runs left out
    out = tmp_path / "ce"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    for name in ("hit_rates.csv", "hit_rates_detail.csv", "hit_rates_by_minute.csv"):
        (out / name).write_text("a,b\n1,2\n")
    assert _user_error("cache-eval", "--report-only", "--out", str(out)) == (
        f"{out / 'hit_rates.csv'}:1: field 'trace': missing column"
    )  # was: KeyError: 'trace'


def test_a_trace_row_with_a_value_past_the_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    path.write_text(head + "2023-11-16 18:15:46.6805900,374,44,99\n")
    with pytest.raises(TraceFormatError) as err:
        load_azure_csv(path)
    assert str(err.value) == f"{path}:2: 4 fields, header has 3"  # was: the 99 dropped silently
    path.write_text(head + "2023-11-16 18:15:46.6805900,374,44,\n")  # a trailing comma passes
    assert [(r.prompt_tokens, r.output_tokens) for r in load_azure_csv(path)] == [(374, 44)]


def test_a_spec_on_the_cpu_engines_is_not_given_the_traces_default_start() -> None:
    # was: `bench --workload X --engine sim:hf-cpu` refused every spec ("--start-s applies to
    # --trace workloads") though the user gave no --start-s: hf's shaping default (100 s) did
    from superinfer.harness.bench import bench_config
    from tests.harness.test_reliability import PARAMS

    params = {**PARAMS, "engines": "sim:hf-cpu", "workload": "sharegpt-poisson"}
    config = bench_config(params, given={"engines", "workload"})
    assert (config.workload, config.start_s, config.rate_scale) == ("sharegpt-poisson", 0.0, 0.05)
    trace = bench_config({**PARAMS, "engines": "sim:hf-cpu"}, given={"engines"})
    assert trace.start_s == 100.0  # a trace replay keeps it


def test_a_load_sweep_file_with_no_rows_or_a_word_for_a_load_is_refused(tmp_path: Path) -> None:
    from superinfer.harness.report.sweep_file import load_sweep

    path = tmp_path / "sweep.csv"
    head = "rate_scale,engine,policy,slo_class,slo_attainment\n"
    path.write_text(head + "0.5,sim:vllm,fcfs,chat,0.9\nabc,sim:vllm,fcfs,chat,0.8\n")
    with pytest.raises(UserError) as err:
        load_sweep(path)
    assert str(err.value) == f"{path}:3: field 'rate_scale': 'abc' is not a number"  # was: a label
    path.write_text(head)
    with pytest.raises(UserError) as err:
        load_sweep(path)
    assert str(err.value) == (
        f"{path}: no rows (a load sweep has one per load, engine, policy, class)"
    )  # was: the sweep section left out without a word
