"""Issue 20 items 3-9: nothing a user sends can lose a run (one regression test per defect).

Each bad input fails before any work, in one line naming the flag, or the file, line and
field, and the bound where there is one; a run directory is replaced whole or not at all.
"""

from __future__ import annotations

import math
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superinfer.adapters.manager import available_policies
from superinfer.harness.bench import _family_policies, bench_config, bench_out_dir
from superinfer.harness.engines.base import RequestOutcome, requests_frame
from superinfer.harness.engines.registry import engine_family
from superinfer.harness.errors import SpecError, TraceFormatError, UserError
from superinfer.harness.report.results import check_out_dir, staged_dir, write_atomic
from superinfer.harness.workload.limits import MAX_TOKENS, check_numbers, policy_names
from superinfer.harness.workload.spec_build import build_from_spec
from superinfer.harness.workload.specs import load_workload_spec, parse_spec
from superinfer.harness.workload.trace_fields import show_value
from superinfer.harness.workload.traces import load_azure_csv, load_mooncake_jsonl
from superinfer.harness.workload.workload import CHAT_SLO, build_workload
from superinfer.sim.request import RequestSpec

PARAMS: dict[str, Any] = {
    "workload": None, "trace": None, "engines": "sim:vllm", "model": "llama-3.1-70b",
    "gpu": "a100-80gb", "tp": 4, "replicas": 4, "router": "round_robin", "cpu_kv_ratio": None,
    "kv_quant": False, "kv_quant_opts": {}, "kv_policy": None, "policies": None,
    "rate_scale": None, "duration_s": None, "start_s": None, "length_scale": None,
    "max_prompt_tokens": None, "max_output_tokens": None, "engine_options": {}, "url": None,
    "backend": "openai", "policy_opt": (), "seed": 0, "suite": None,
}  # fmt: skip

SOURCE = """[[source]]
name = "s"
format = "sharegpt-lengths"
slo = "chat"
arrivals = {process = "poisson", rate_rps = 1.0}
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "superinfer", *args], capture_output=True, text=True, timeout=120
    )


# -- item 3: hf cannot feed oracle ----------------------------------------------------------


def test_hf_defaults_leave_out_oracle_and_refuse_it_by_name() -> None:
    every = sorted(available_policies())
    assert "oracle" in every
    hf = bench_config({**PARAMS, "engines": "hf"}, given={"engines"})
    assert _family_policies(hf, [engine_family("hf")]) == [p for p in every if p != "oracle"]
    mixed = bench_config({**PARAMS, "engines": "hf,sim:hf-cpu"}, given={"engines"})
    families = [engine_family("hf"), engine_family("sim:hf-cpu")]
    assert _family_policies(mixed, families) == [p for p in every if p != "oracle"]
    # the simulator gives oracle the true lengths: it keeps it
    sim = bench_config(PARAMS, given=set())
    assert _family_policies(sim, [engine_family("sim:vllm")]) == every
    named = bench_config({**PARAMS, "engines": "hf", "policies": "fcfs,oracle"},
                         given={"engines", "policies"})  # fmt: skip
    with pytest.raises(UserError) as err:
        _family_policies(named, [engine_family("hf")])
    assert str(err.value) == (
        "policy 'oracle' cannot run on engine 'hf' (it needs each request's true output "
        "length, which that engine's runner does not feed it); leave it out of --policies"
    )


# -- item 4: --out checked before any work --------------------------------------------------


def test_bad_out_is_one_line_before_any_work(tmp_path: Path) -> None:
    afile = tmp_path / "file"
    afile.write_text("keep")
    cases = [
        (afile, f"--out {afile}: exists and is not a directory"),
        (Path("/dev/null"), "--out /dev/null: exists and is not a directory"),
        (afile / "sub", f"--out {afile / 'sub'}: {afile} is not a directory"),
        (afile / "a" / "b", f"--out {afile / 'a' / 'b'}: {afile} is not a directory"),
    ]
    if sys.platform == "linux":  # /proc takes no new entries, even from root
        cases.append(
            (Path("/proc/superinfer-x/run"),
             "--out /proc/superinfer-x/run: cannot write in /proc (No such file or directory)")
        )  # fmt: skip
    for out, expected in cases:
        with pytest.raises(UserError) as err:
            check_out_dir(out)
        assert str(err.value) == expected
    config = bench_config(PARAMS, given=set())
    assert bench_out_dir(config, None) == Path("results/default")
    assert bench_out_dir(config, None, suite="headline") == Path("results/headline")
    assert bench_out_dir(config, str(tmp_path / "new" / "run")) == tmp_path / "new" / "run"
    assert not (tmp_path / "new").exists()  # checked, not created
    assert afile.read_text() == "keep"


def test_cli_refuses_a_bad_out_at_once(tmp_path: Path) -> None:
    afile = tmp_path / "file"
    afile.write_text("")
    # the whole hour would take minutes: the error must come first
    proc = _run("bench", "--out", str(afile / "sub"))
    assert proc.returncode == 2
    assert proc.stderr == f"error: --out {afile / 'sub'}: {afile} is not a directory\n"


# -- item 5: a run directory is replaced whole, files 0644 ---------------------------------


def _listing(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def test_staged_run_keeps_the_previous_run_whole_on_failure(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.csv").write_text("old summary")
    (out / "manifest.json").write_text("old manifest")
    with pytest.raises(RuntimeError, match="plots failed"), staged_dir(out) as stage:
        (stage / "summary.csv").write_text("new summary")
        raise RuntimeError("plots failed")
    assert _listing(out) == {"manifest.json": "old manifest", "summary.csv": "old summary"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no stage left behind
    (out / "MANIFEST.md").write_text("kept")  # not a run file: moved into the new run
    (out / "logs").mkdir()
    (out / "logs" / "a.log").write_text("log")
    with staged_dir(out) as stage:
        (stage / "summary.csv").write_text("new summary")
        (stage / "report.md").write_text("new report")
    # no old run file beside the new ones (manifest.json was the previous run's)
    assert sorted(p.name for p in out.iterdir()) == [
        "MANIFEST.md",
        "logs",
        "report.md",
        "summary.csv",
    ]
    assert (out / "summary.csv").read_text() == "new summary"
    assert (out / "MANIFEST.md").read_text() == "kept"
    assert (out / "logs" / "a.log").read_text() == "log"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_result_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with staged_dir(tmp_path / "run") as stage:
            write_atomic(stage / "summary.csv", lambda p: p.write_text("x"))
    finally:
        os.umask(old)
    run = tmp_path / "run"
    assert stat.S_IMODE((run / "summary.csv").stat().st_mode) == 0o644
    assert stat.S_IMODE(run.stat().st_mode) == 0o755


# -- item 6: upper bounds on lengths, counts and rates --------------------------------------


def test_huge_trace_lengths_fail_at_load_naming_the_bound(tmp_path: Path) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.68,100,5\n"
        "2023-11-16 18:15:47.68,12,99999999999999999999999\n"
    )
    with pytest.raises(TraceFormatError) as err:
        load_azure_csv(azure)
    assert str(err.value) == (
        f"{azure}:3: field 'GeneratedTokens': 99999999999999999999999 is over the limit of "
        "10,000,000 tokens"
    )
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68," + "9" * 30 + ",5\n"
    )
    with pytest.raises(TraceFormatError, match=":2: field 'ContextTokens': 9{30} is over the lim"):
        load_azure_csv(azure)
    # exactly the bound loads
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10000000,5\n")
    assert load_azure_csv(azure)[0].prompt_tokens == 10_000_000
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 10000001, "output_length": 5, '
                        '"hash_ids": []}\n')  # fmt: skip
    with pytest.raises(TraceFormatError) as err:
        load_mooncake_jsonl(mooncake)
    assert str(err.value) == (
        f"{mooncake}:1: field 'input_length': 10000001 is over the limit of 10,000,000 tokens"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SOURCE + "num_requests = 100000000\n",
         ":6: field 'source[0].num_requests': 100000000 is over the limit of 10,000,000"),
        (SOURCE.replace("rate_rps = 1.0", "rate_rps = 1e12"),
         ":5: field 'source[0].arrivals.rate_rps': 1e+12 is over the limit of 1e+06"),
        (SOURCE + "max_output_tokens = 20000000\n",
         ":6: field 'source[0].max_output_tokens': 20000000 is over the limit of 10,000,000"),
        ("rate_scale = 1e9\n" + SOURCE,
         ":1: field 'rate_scale': 1e+09 is over the limit of 1e+06"),
        ("duration_s = 1e12\n" + SOURCE,
         ":1: field 'duration_s': 1e+12 is over the limit of 1e+09"),
        (SOURCE + "[bench]\ntp = 4096\n",
         ":7: field 'bench.tp': 4096 is over the limit of 1,024"),
        (SOURCE + "[bench]\nreplicas = 0\n", ":7: field 'bench.replicas': 0 must be >= 1"),
        (SOURCE + '[bench]\npolicies = "fcfs,fcfs"\n',
         ":7: field 'bench.policies': names 'fcfs' twice"),
        (SOURCE + '[bench]\npolicies = " , "\n',
         ":7: field 'bench.policies': is empty (leave it out for the default)"),
    ],
)  # fmt: skip
def test_spec_bounds_name_file_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(text, path="w.toml")
    assert str(err.value) == "w.toml" + expected


# -- item 7: synthetic arrivals capped before generating; rate scale finite ------------------


def test_synthetic_arrivals_are_capped_before_any_is_drawn() -> None:
    spec = parse_spec(
        "duration_s = 600\n" + SOURCE.replace("rate_rps = 1.0", "rate_rps = 1e6"), path="w.toml"
    )
    with pytest.raises(UserError) as err:  # 6e8 requests: refused at once, no memory taken
        build_from_spec(spec)
    assert str(err.value) == (
        "source 's': poisson arrivals at 1e+06 req/s over 600 s are about 6e+08 requests, over "
        "the limit of 10,000,000 per source; lower rate_rps, --rate-scale or the window, or "
        "set num_requests"
    )
    with pytest.raises(UserError, match="about 1.2e"):  # --rate-scale counts
        build_from_spec(parse_spec("duration_s = 600\n" + SOURCE, path="w.toml"),
                        rate_scale=2e4)  # fmt: skip
    # num_requests bounds the count instead
    capped = parse_spec(
        "duration_s = 600\n" + SOURCE.replace("rate_rps = 1.0", "rate_rps = 1e6")
        + "num_requests = 50\n", path="w.toml"
    )  # fmt: skip
    assert len(build_from_spec(capped).requests) == 50


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 0.0, -1.0])
def test_rate_scale_must_be_finite_and_positive(value: float) -> None:
    expected = f"--rate-scale must be > 0 and finite, got {value}"
    for call in (
        lambda: check_numbers({"rate_scale": value}),
        lambda: build_workload("azure-conv", rate_scale=value),
        lambda: build_from_spec(load_workload_spec("sharegpt-poisson"), rate_scale=value),
    ):
        with pytest.raises(UserError) as err:
            call()
        assert str(err.value) == expected
    with pytest.raises(UserError, match=r"^--rate-scale 1e\+07 is over the limit of 1e\+06$"):
        check_numbers({"rate_scale": 1e7})


# -- item 8: the smaller defects ------------------------------------------------------------


def test_policy_lists_and_numeric_flags_fail_in_one_line() -> None:
    assert policy_names(None) == () and policy_names(" fcfs , edf ") == ("fcfs", "edf")
    cases = [
        ({"policies": "fcfs,fcfs"}, "--policies names 'fcfs' twice"),
        ({"policies": ""}, "--policies '' names no policy (leave it out for the default)"),
        ({"policies": " , "}, "--policies ' , ' names no policy (leave it out for the default)"),
        ({"cpu_kv_ratio": -1.0}, "--cpu-kv-ratio must be >= 0 and finite, got -1.0"),
        ({"cpu_kv_ratio": math.inf}, "--cpu-kv-ratio must be >= 0 and finite, got inf"),
        ({"duration_s": math.nan}, "--duration-s must be > 0 and finite, got nan"),
        ({"start_s": -1.0}, "--start-s must be >= 0 and finite, got -1.0"),
        ({"length_scale": 1e9}, "--length-scale 1e+09 is over the limit of 1000"),
        ({"max_prompt_tokens": 10**8}, "--max-prompt-tokens 100000000 is over the limit of "
                                       "10,000,000"),
        ({"replicas": 0}, "--replicas must be >= 1, got 0"),
        ({"tp": 5000}, "--tp 5000 is over the limit of 1,024"),
    ]  # fmt: skip
    for opts, expected in cases:
        with pytest.raises(UserError) as err:
            bench_config({**PARAMS, **opts}, given=set(opts))
        assert str(err.value) == expected
    # unset (None) and defaults pass
    assert bench_config(PARAMS, given=set()).policies == ()


def test_spec_bench_errors_name_the_spec_file_line_and_key(tmp_path: Path) -> None:
    spec = tmp_path / "w.toml"
    for key, value, expected in [
        ("policies", '"fcfs,fifo"', "unknown policy 'fifo'; registered: "),
        ("engines", '"nope"', "unknown engine 'nope'; engine families: sim, hf"),
        ("router", '"random"', "unknown router 'random'; known: round_robin"),
        ("gpu", '"v100"', "unknown GPU 'v100'; known: a100-80gb"),
    ]:
        spec.write_text(SOURCE + f"[bench]\n{key} = {value}\n")
        params = {**PARAMS, "workload": str(spec)}
        with pytest.raises(SpecError) as err:
            bench_config(params, given={"workload"})
        assert str(err.value).startswith(f"{spec}:7: field 'bench.{key}': {expected}"), err.value
        assert "--" not in str(err.value).split(":", 3)[-1].split(";")[0]
        # the same key given on the command line wins and is not checked against the spec
        bench_config({**params, key: PARAMS[key]}, given={"workload", key})
    # an engine's own policy named in the spec is fine when the run has that engine
    spec.write_text(SOURCE + '[bench]\npolicies = "native,superinfer"\n')
    config = bench_config({**PARAMS, "workload": str(spec), "engines": "sglang"},
                          given={"workload", "engines"})  # fmt: skip
    assert config.policies == ("native", "superinfer")


def test_cli_policy_and_port_mistakes_are_one_line() -> None:
    for args, expected in [
        (["bench", "--policies", "fcfs,fcfs"], "error: --policies names 'fcfs' twice\n"),
        (["bench", "--policies", ""],
         "error: --policies '' names no policy (leave it out for the default)\n"),
        (["bench", "--cpu-kv-ratio", "-1"],
         "error: --cpu-kv-ratio must be >= 0 and finite, got -1.0\n"),
        (["bench", "--rate-scale", "inf"], "error: --rate-scale must be > 0 and finite, got inf\n"),
        (["bench", "--rate-scale", "nan"], "error: --rate-scale must be > 0 and finite, got nan\n"),
        (["serve", "--engine", "hf", "--port", "70000"],
         "error: port must be in [0, 65535] (TCP), got 70000\n"),
    ]:  # fmt: skip
        proc = _run(*args)
        assert (proc.returncode, proc.stderr) == (2, expected), proc.stderr


# -- item 9: max_itl_ms empty without a gap ------------------------------------------------


def test_max_itl_is_empty_for_one_token_and_unfinished_requests() -> None:
    def spec(rid: str) -> RequestSpec:
        return RequestSpec(rid, 0.0, 10, 2, 2, CHAT_SLO, source="s")

    def outcome(tokens: int, status: str, itl: float) -> RequestOutcome:
        finish = 1.0 if status == "finished" else None
        return RequestOutcome(tokens, 0.5 if tokens else None, finish, status, "", 0, 0, itl)

    frame = requests_frame(
        [
            (spec("two"), outcome(2, "finished", 7.5)),
            (spec("one"), outcome(1, "finished", 0.0)),
            (spec("rejected"), outcome(0, "rejected", 0.0)),
            (spec("failed"), outcome(3, "failed", 4.0)),
        ],
        engine="e",
        policy="p",
    )
    itl = frame.set_index("request_id").max_itl_ms
    assert itl["two"] == 7.5
    assert itl[["one", "rejected", "failed"]].isna().all()
    # a quantile over them (the rotation suite's chat_tbt_p99_ms) sees only the real gap
    assert float(itl.dropna().quantile(0.99)) == 7.5
    assert math.isnan(float(pd.Series([math.nan]).dropna().quantile(0.99)))


# -- loaders fuzzed up to the result file ----------------------------------------------------

_LENGTHS = st.one_of(
    st.integers(min_value=1, max_value=4096),
    st.integers(min_value=MAX_TOKENS - 2, max_value=MAX_TOKENS + 2),
    st.integers(min_value=MAX_TOKENS, max_value=10**30),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(_LENGTHS, _LENGTHS), min_size=1, max_size=6))
def test_loaded_lengths_reach_requests_parquet_unchanged(rows: list[tuple[int, int]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.csv"
        lines = [f"2023-11-16 18:15:{10 + i:02d}.5,{p},{o}" for i, (p, o) in enumerate(rows)]
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(lines) + "\n")
        over = [
            (i + 2, field, value)
            for i, pair in enumerate(rows)
            for field, value in zip(("ContextTokens", "GeneratedTokens"), pair, strict=True)
            if value > MAX_TOKENS
        ]
        if over:
            line, field, value = over[0]
            with pytest.raises(TraceFormatError) as err:
                build_workload(str(path))
            assert str(err.value) == (
                f"{path}:{line}: field {field!r}: {show_value(value)} is over the limit of "
                f"{MAX_TOKENS:,} tokens"
            )
            return
        wl = build_workload(str(path))
        outcomes = [
            (s, RequestOutcome(s.output_tokens, 0.1, 0.2, "finished", "", 0, 0, 1.0))
            for s in wl.requests
        ]
        frame = requests_frame(outcomes, engine="e", policy="p")
        frame.to_parquet(Path(folder) / "requests.parquet", index=False)
        back = pd.read_parquet(Path(folder) / "requests.parquet")
        assert back.prompt_tokens.tolist() == [p for p, _ in rows]
        assert back.output_tokens.tolist() == [o for _, o in rows]
        assert back.generated_tokens.tolist() == [o for _, o in rows]
