"""``superinfer conform`` on the simulated engines: exact verdicts and values of the scenarios
(the simulator is deterministic), the declared request-field table checked against behaviour,
what is not observable, the matrix files, and the bench warning for an ignored field."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from superinfer.cli import cli
from superinfer.harness.conform.runner import (
    MATRIX_COLUMNS,
    Target,
    conform_rows,
    default_policies,
    open_target,
    write_matrix,
)
from superinfer.harness.conform.scenarios import RunResult, scenario_names
from superinfer.harness.conform.workloads import make_workload
from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.engines.sim import sim_options
from superinfer.harness.errors import UserError
from superinfer.harness.policies import POLICY_FIELDS, ignored_field_warnings, registered_policies
from superinfer.harness.workload.workload import Workload

BASE = BenchConfig(cpu_kv_ratio=0.0)
SIM_GPU_ENGINES = ("sim:vllm", "sim:sglang", "sim:trtllm")


@contextlib.contextmanager
def _target(engine: str, policy: str, base: BenchConfig = BASE) -> Iterator[Target]:
    with open_target(engine, policy, base) as target:
        yield target


def _rows(engine: str, policy: str) -> dict[str, dict[str, object]]:
    with _target(engine, policy) as target:
        return {r["scenario"]: r for r in conform_rows(target)}


@pytest.fixture(scope="module")
def vllm() -> dict[str, dict[str, dict[str, object]]]:
    return {p: _rows("sim:vllm", p) for p in default_policies("sim:vllm")}


def test_every_scenario_reports_value_unit_threshold_and_reason(vllm: dict) -> None:
    for policy, rows in vllm.items():
        assert list(rows) == scenario_names()
        for name, row in rows.items():
            assert row["passed"] in ("pass", "fail", "not exercised", "info"), (policy, name)
            assert row["unit"] and row["threshold"] and row["detail"], (policy, name)


def test_verdicts_on_sim_vllm(vllm: dict) -> None:
    verdicts = {p: {s: r["passed"] for s, r in rows.items()} for p, rows in vllm.items()}
    # fcfs never looks at priority or SLO: every promise about them is broken or vacuous
    assert verdicts["fcfs"] == {
        "priority_inversion": "fail", "readmission_order": "pass", "recompute_excess": "pass",
        "chunked_prefill_preemption": "pass", "head_of_line": "fail",
        "class_separation": "fail", "fields_honoured": "pass", "priority_polarity": "info",
        "kv_retention": "fail",
    }  # fmt: skip
    # the priority baseline ranks by priority but, like vLLM (#40004), never preempts for it
    assert verdicts["priority"]["priority_inversion"] == "fail"
    assert verdicts["priority"]["priority_polarity"] == "pass"
    assert verdicts["superinfer"] == {
        "priority_inversion": "pass", "readmission_order": "fail", "recompute_excess": "pass",
        "chunked_prefill_preemption": "not exercised", "head_of_line": "pass",
        "class_separation": "pass", "fields_honoured": "pass", "priority_polarity": "info",
        "kv_retention": "fail",
    }  # fmt: skip
    assert verdicts["native"] == verdicts["fcfs"]  # sim:vllm's own policy is fcfs


def test_exact_values_on_sim_vllm(vllm: dict) -> None:
    inv = vllm["superinfer"]["priority_inversion"]
    assert inv["value"] == 0.031 and "1 lower-priority request(s) preempted" in inv["detail"]
    assert vllm["fcfs"]["priority_inversion"]["value"] == 1.0  # waited for a slot to free
    assert vllm["fcfs"]["head_of_line"]["value"] == 1.003  # blocked behind the long prefill
    # short0 and short1 arrive during the long prompt's first 2,048-token step and are due before
    # it ends: rejected as unattainable (reject_hopeless); the first-token guard (a default) trims
    # the long prompt's next chunk so that step ends by short2's deadline: short2 and short3 get
    # their first tokens at 321 and 291 ms (TTFT target 325 ms)
    hol = vllm["superinfer"]["head_of_line"]
    assert hol["value"] == 0.09 and "short TTFT max 321 ms" in hol["detail"]
    assert "2 short(s) rejected as unattainable" in hol["detail"]
    assert vllm["fcfs"]["class_separation"]["value"] == -0.25
    assert vllm["superinfer"]["class_separation"]["value"] == 0.25
    rec = vllm["fcfs"]["recompute_excess"]
    assert (rec["value"], rec["detail"]) == (
        0,
        "591 tokens recomputed for 591 lost in 2 preemption(s)",
    )
    chunked = vllm["fcfs"]["chunked_prefill_preemption"]
    assert (
        chunked["value"] == 0
        and "6/6 finished; 2 of 2 preemption(s) mid prefill" in chunked["detail"]
    )


def test_without_the_first_token_guard_the_shorts_are_late_on_sim_vllm() -> None:
    # guard off: short2 and short3 share the next step with the long prompt's 2,016-token chunk
    # (679, 650 ms: late for a 325 ms TTFT)
    base = BenchConfig(
        cpu_kv_ratio=0.0, policy_options={"superinfer": {"first_token_guard": "false"}}
    )
    with _target("sim:vllm", "superinfer", base) as target:
        (row,) = conform_rows(target, ["head_of_line"])
    assert row["value"] == 0.191 and "short TTFT max 679 ms" in row["detail"]


@pytest.mark.parametrize("engine", SIM_GPU_ENGINES)
def test_declared_fields_match_behaviour(engine: str) -> None:
    """POLICY_FIELDS (which feeds the bench warning) is what each policy's decisions depend on."""
    for policy in registered_policies():
        with _target(engine, policy) as target:
            (row,) = conform_rows(target, ["fields_honoured"])
        assert row["passed"] == "pass", (engine, policy, row["detail"])
        assert row["value"] == len(POLICY_FIELDS[policy])


@pytest.mark.parametrize("engine", SIM_GPU_ENGINES)
def test_every_request_finishes_through_chunked_preemption(engine: str) -> None:
    # superinfer and oracle may reject a chat they can no longer serve in time (sim:sglang: one
    # of six, under pressure from the other urgent chat): accounted for, with its reason
    for policy in registered_policies():
        with _target(engine, policy) as target:
            (row,) = conform_rows(target, ["chunked_prefill_preemption"])
        assert row["passed"] in ("pass", "not exercised"), (engine, policy, row["detail"])
        assert row["value"] == 0


def test_recomputed_tokens_count_what_the_engine_ran() -> None:
    # sim:sglang runs a new prompt's prefill batch without the decodes decided for that step
    # (mixed_batches=False): those tokens ran a step later, and are not counted twice
    with _target("sim:sglang", "fcfs") as target:
        (row,) = conform_rows(target, ["recompute_excess"])
    assert (row["passed"], row["value"], row["detail"]) == (
        "pass",
        0,
        "341 tokens recomputed for 341 lost in 1 preemption(s)",
    )


def test_hopeless_shorts_are_served_late_without_queueing_pressure() -> None:
    # sim:sglang's long prompt runs in 8,192-token steps longer than the shorts' TTFT: no short
    # can make it, none waits behind a feasible one, so none is rejected (reject_hopeless only
    # sheds under pressure); each gets its first token after the step it arrived in
    with _target("sim:sglang", "superinfer") as target:
        (row,) = conform_rows(target, ["head_of_line"])
    assert (row["passed"], row["value"]) == ("pass", 0.073)
    assert row["detail"] == (
        "short TTFT max 1666 ms, median 1624 ms while a 65536-token prompt took 22825 ms to "
        "its first token"
    )


def _flipped(target: Target) -> Target:
    """The same engine with the opposite priority polarity (it reads every rank negated)."""
    inner = target.run

    def run(workload: Workload, kv: int | None) -> RunResult:
        reqs = [dataclasses.replace(r, slo=dataclasses.replace(r.slo, priority=-r.slo.priority))
                for r in workload.requests]  # fmt: skip
        return inner(make_workload("flipped", reqs), kv)

    return dataclasses.replace(target, run=run)


def test_polarity_is_detected_not_assumed() -> None:
    with _target("sim:vllm", "priority") as target:
        (right,) = conform_rows(target, ["priority_polarity"])
        (wrong,) = conform_rows(_flipped(target), ["priority_polarity"])
    assert (right["passed"], right["value"]) == ("pass", 1)
    assert (wrong["passed"], wrong["value"]) == ("fail", -1)
    assert "opposite" in str(wrong["detail"])


def test_what_an_http_engine_cannot_expose_is_not_observable() -> None:
    runs: list[str] = []
    with _target("sim:vllm", "fcfs") as sim:

        def run(workload: Workload, kv: int | None) -> RunResult:
            runs.append(workload.name)
            got = sim.run(workload, kv)
            return RunResult(got.requests.drop(columns=["cached_tokens"]))

        http = dataclasses.replace(sim, engine="http", run=run, observes=frozenset())
        rows = {r["scenario"]: r for r in conform_rows(http)}
    for name in ("readmission_order", "recompute_excess", "kv_retention"):
        assert rows[name]["passed"] == "not observable" and rows[name]["value"] is None
    assert "in-process engine" in str(rows["readmission_order"]["detail"])
    assert "not observable over HTTP" in str(rows["chunked_prefill_preemption"]["detail"])
    assert "preemptions not observable" in str(rows["priority_inversion"]["detail"])
    assert not any("kv_pressure" in n or "kv_retention" in n for n in runs)  # never run


def test_matrix_files_merge_by_engine_and_policy(tmp_path: Path) -> None:
    row = {"engine": "sim:x", "policy": "p", "scenario": "head_of_line", "passed": "pass",
           "value": 0.1, "unit": "ratio", "threshold": "<= 0.5", "detail": "d"}  # fmt: skip
    write_matrix([row, {**row, "policy": "q", "passed": "fail", "value": 0.9}], tmp_path)
    write_matrix([{**row, "value": 0.2}], tmp_path)  # replaces sim:x / p only
    matrix = pd.read_csv(tmp_path / "matrix.csv")
    assert tuple(matrix.columns) == MATRIX_COLUMNS
    assert sorted(zip(matrix["policy"], matrix["value"], strict=True)) == [("p", 0.2), ("q", 0.9)]
    md = (tmp_path / "matrix.md").read_text()
    assert "| scenario | sim:x / p | sim:x / q |" in md
    assert "| `head_of_line` | pass 0.2 | **fail** 0.9 |" in md


def test_cli_writes_matrix_and_manifests(tmp_path: Path) -> None:
    out = tmp_path / "conformance"
    args = ["conform", "--engine", "sim:vllm", "--policy", "fcfs,superinfer", "--out", str(out)]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    matrix = pd.read_csv(out / "matrix.csv")
    assert len(matrix) == 2 * len(scenario_names())
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["manifest.json", "matrix.csv", "matrix.md"]
    assert sorted(manifest["columns"]) == ["sim:vllm / fcfs", "sim:vllm / superinfer"]
    row = re.compile(r"^\| `(?P<file>[^`]+)` \| .+ \| `[0-9a-f]{7,40}(?:\+|-dirty)?` \| .+ \| "
                     r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} \| .+ \|$")  # fmt: skip
    rows = [ln for ln in (out / "MANIFEST.md").read_text().splitlines() if ln.startswith("| `")]
    assert sorted(row.match(ln)["file"] for ln in rows) == sorted(manifest["files"])


def test_cli_bad_input_is_one_line() -> None:
    result = CliRunner().invoke(cli, ["conform", "--engine", "sim:vllm", "--scenarios", "nope"])
    assert result.exit_code != 0 and "unknown scenario 'nope'" in str(result.exception)
    with pytest.raises(UserError, match="unknown engine 'tgi' for conform"):
        with open_target("tgi", "x", BASE):
            pass


def test_sim_engine_options() -> None:
    assert sim_options({"max_num_seqs": "4", "num_gpu_blocks": "64"}) == {
        "max_num_seqs": 4, "num_gpu_blocks": 64}  # fmt: skip
    assert sim_options({"num_threads": "1"}, strict=False) == {}
    with pytest.raises(UserError, match="unknown --engine-option 'num_threads' for a sim engine"):
        sim_options({"num_threads": "1"})
    with pytest.raises(UserError, match="max_num_seqs must be >= 1"):
        sim_options({"max_num_seqs": "0"})


def test_bench_report_warns_when_a_policy_ignores_a_field(tmp_path: Path) -> None:
    from superinfer.harness.workload.resolve import resolve_workload

    wl = resolve_workload("azure", spec=False, seed=0, rate_scale=1.0, duration_s=5.0, start_s=77.0)
    assert ignored_field_warnings(["priority", "superinfer"], "sim:vllm", wl) == [
        "policy `priority` on `sim:vllm` ignores the request field(s) deadline, slo that this "
        "workload sets: its decisions do not depend on them (docs/conformance.md, "
        "fields_honoured)",
        "policy `superinfer` on `sim:vllm` ignores the request field(s) priority that this "
        "workload sets: its decisions do not depend on them (docs/conformance.md, "
        "fields_honoured)",
    ]
    assert ignored_field_warnings(["native"], "sglang", wl) == []  # not ours: no declaration
    out = tmp_path / "run"
    args = ["bench", "--engine", "sim:vllm", "--policies", "fcfs", "--trace", "azure",
            "--start-s", "77", "--duration-s", "5", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    assert "## Warnings" in report
    assert (
        "- policy `fcfs` on `sim:vllm` ignores the request field(s) deadline, priority, slo"
        in report
    )
    assert json.loads((out / "manifest.json").read_text())["warnings"]


@pytest.mark.parametrize("engine", SIM_GPU_ENGINES)
def test_priority_placement_keeps_the_urgent_prefix(engine: str) -> None:
    # the engines' own LRU lets the chat prefix go under 4,096 tokens of batch prompts; the
    # priority plugin evicts batch nodes first and pins the chat prefix (kv_priority.py)
    base = BenchConfig(cpu_kv_ratio=0.0, kv_policy="priority")
    for policy in ("fcfs", "superinfer"):
        with _target(engine, policy) as target:
            (lru,) = conform_rows(target, ["kv_retention"])
        with _target(engine, policy, base) as target:
            (row,) = conform_rows(target, ["kv_retention"])
        assert (lru["passed"], lru["value"]) == ("fail", 0.0), (engine, policy)
        assert (row["passed"], row["value"]) == ("pass", 1.0), (engine, policy)
