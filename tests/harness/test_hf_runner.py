"""The hf / sim:hf-cpu harness pieces that need no model: options, workload shaping, prompts,
the simulator cell and the CLI around them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from superinfer.harness.bench import BenchConfig, run_bench
from superinfer.harness.engines.hf import HFOptions, hf_options
from superinfer.harness.engines.registry import HF_WORKLOAD
from superinfer.harness.engines.registry import shaping_defaults as workload_defaults
from superinfer.harness.errors import DataError, UserError
from superinfer.harness.workload.prompts import PromptBuilder, load_sharegpt_prompts
from superinfer.harness.workload.workload import CHAT_SLO, Workload, build_workload, scale_lengths
from superinfer.sim.request import RequestSpec


def test_engine_options_parse_and_reject_unknown_keys() -> None:
    opts = hf_options({"num_blocks": "64", "num_threads": "1", "drain_s": "30"})
    assert opts == HFOptions(num_blocks=64, num_threads=1, drain_s=30.0)
    with pytest.raises(UserError, match="unknown --engine-option 'blocks'; known: drain_s"):
        hf_options({"blocks": "3"})
    with pytest.raises(UserError, match="num_blocks='x': not a number"):
        hf_options({"num_blocks": "x"})
    with pytest.raises(UserError, match="max_num_seqs must be >= 1, got 0"):
        hf_options({"max_num_seqs": "0"})
    assert hf_options({"mechanics": "sglang"}).mechanics == "sglang"
    with pytest.raises(UserError, match="mechanics='vllm': one of hf, sglang"):
        hf_options({"mechanics": "vllm"})
    assert hf_options({"step_spread_seed": "3"}).step_spread_seed == 3
    with pytest.raises(UserError, match="step_spread='on': one of calibrated, none"):
        hf_options({"step_spread": "on"})
    assert hf_options({"mechanics": "sglang", "mixed_batches": "1"}).mixed_batches == 1
    assert hf_options({}).mixed_batches is None
    with pytest.raises(UserError, match="mixed_batches must be 0 or 1, got 2"):
        hf_options({"mechanics": "sglang", "mixed_batches": "2"})
    with pytest.raises(UserError, match="mixed_batches=0 needs mechanics=sglang"):
        hf_options({"mixed_batches": "0"})
    assert hf_options({"extend_decodes": "0"}).extend_decodes == 0
    with pytest.raises(UserError, match="extend_decodes must be 0 or 1, got 3"):
        hf_options({"extend_decodes": "3"})


def test_cpu_engines_get_the_small_workload_by_default() -> None:
    assert workload_defaults(("hf",)) == HF_WORKLOAD
    assert workload_defaults(("sim:vllm", "sim:hf-cpu")) == HF_WORKLOAD
    assert workload_defaults(("sim:vllm",))["rate_scale"] == 1.0


def test_the_default_hf_window_mixes_both_classes() -> None:
    wl = build_workload(
        "azure",
        rate_scale=HF_WORKLOAD["rate_scale"],
        duration_s=HF_WORKLOAD["duration_s"],
        start_s=HF_WORKLOAD["start_s"],
    )
    classes = pd.Series([r.slo.name for r in wl.requests]).value_counts().to_dict()
    assert classes == {"chat": 39, "batch": 16}
    assert 0.0 <= wl.requests[0].arrival_s and wl.requests[-1].arrival_s < 200.0


def test_scale_lengths_rounds_caps_and_keeps_the_declared_cap_above_the_output() -> None:
    reqs = (
        RequestSpec("a", 0.0, 1020, 129, 1000, CHAT_SLO),
        RequestSpec("b", 1.0, 5000, 3, 2048, CHAT_SLO),
        RequestSpec("c", 2.0, 3, 900, 1000, CHAT_SLO),
    )
    wl = scale_lengths(
        Workload("t", reqs, (), 1.0, None),
        length_scale=0.125,
        max_prompt_tokens=256,
        max_output_tokens=64,
    )
    got = [(r.prompt_tokens, r.output_tokens, r.max_output_tokens) for r in wl.requests]
    assert got == [(128, 16, 125), (256, 1, 256), (1, 64, 125)]
    assert (wl.length_scale, wl.max_prompt_tokens, wl.max_output_tokens) == (0.125, 256, 64)
    with pytest.raises(UserError, match="--length-scale must be > 0"):
        scale_lengths(wl, length_scale=0)
    with pytest.raises(UserError, match="--max-output-tokens must be >= 1, got 0"):
        scale_lengths(wl, max_output_tokens=0)


def test_start_s_skips_the_head_of_the_trace_and_recounts_time() -> None:
    whole = build_workload("azure", duration_s=110.0)
    tail = build_workload("azure", duration_s=10.0, start_s=100.0)
    expect = [r.request_id for r in whole.requests if r.arrival_s >= 100.0]
    assert [r.request_id for r in tail.requests] == expect
    assert tail.requests[0].arrival_s == pytest.approx(
        whole.requests[len(whole.requests) - len(expect)].arrival_s - 100.0
    )
    with pytest.raises(UserError, match="--start-s must be >= 0"):
        build_workload("azure", start_s=-1.0)


class FakeTokenizer:
    """Characters as tokens: ord(c)."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def test_prompt_builder_cuts_exact_lengths_from_the_texts_in_a_seeded_order() -> None:
    builder = PromptBuilder(FakeTokenizer(), ["abc", "defgh"], seed=0)
    text = "".join(map(chr, builder.build(0, 14)))
    assert text == "abc\n\ndefgh\n\nab"  # runs into the next text, then wraps around
    assert "".join(map(chr, builder.build(1, 3))) == "def"
    assert builder.build(0, 2) == builder.build(2, 2)  # request indices wrap around the texts


def test_sharegpt_prompts_load_and_bad_files_name_the_problem(tmp_path: Path) -> None:
    prompts = load_sharegpt_prompts()
    assert len(prompts) == 500 and all(p.strip() for p in prompts)
    bad = tmp_path / "s.json"
    bad.write_text(json.dumps([{"conversations": []}]))
    with pytest.raises(DataError, match=f"{bad}: entry 0: no conversations"):
        load_sharegpt_prompts(bad)
    bad.write_text("{")
    with pytest.raises(DataError, match=f"{bad}: cannot read ShareGPT prompts"):
        load_sharegpt_prompts(bad)


def test_sim_hf_cpu_accounts_for_every_request_and_is_deterministic() -> None:
    config = BenchConfig(engines=("sim:hf-cpu",), policies=("fcfs", "priority"), **HF_WORKLOAD)
    one, two = run_bench(config), run_bench(config)
    pd.testing.assert_frame_equal(one.summary, two.summary)
    df = one.requests
    assert len(df) == 2 * 55
    assert (df["status"] == "finished").all()
    assert (df["generated_tokens"] == df["output_tokens"]).all()
    cell = one.info["cells"]["sim:hf-cpu/fcfs"]
    assert cell["kv_capacity_blocks"] == 256
    assert cell["kv_capacity_gb"] == pytest.approx(256 * 32 * 46080 / 1e9)


def test_sim_hf_cpu_draws_the_calibrations_spread_per_seed(tmp_path: Path) -> None:
    """With ``step_spread=calibrated`` a calibration's spread slows every step by its draw; the
    default (``none``) keeps the fitted times; no file, a file without a spread or a bad spread
    is a one-line error naming the file."""
    from superinfer.sim.hf_cpu import HFCPUStepTime

    fit = {"coefficients": HFCPUStepTime().to_dict()}
    plain, spread = tmp_path / "plain.json", tmp_path / "spread.json"
    plain.write_text(json.dumps(fit))
    table = {"ratio_measured_over_predicted": {"decode": [1.5, 2.5]}}
    spread.write_text(json.dumps({**fit, "spread": table}))

    def e2e(path: Path, **extra: str) -> pd.Series:
        opts = {"step_time_file": str(path), "step_spread": "calibrated", **extra}
        config = BenchConfig(
            engines=("sim:hf-cpu",), policies=("fcfs",), engine_options=opts, **HF_WORKLOAD
        )
        return run_bench(config).requests.set_index("request_id")["e2e_ms"]

    base = e2e(plain, step_spread="none")
    with pytest.raises(UserError, match=f"{plain}: no spread object"):
        e2e(plain)
    with pytest.raises(UserError, match="step_spread=calibrated needs step_time_file=PATH"):
        run_bench(
            BenchConfig(
                engines=("sim:hf-cpu",),
                policies=("fcfs",),
                engine_options={"step_spread": "calibrated"},
                **HF_WORKLOAD,
            )
        )
    pd.testing.assert_series_equal(e2e(spread, step_spread="none"), base)
    config = BenchConfig(
        engines=("sim:hf-cpu",),
        policies=("fcfs",),
        engine_options={"step_time_file": str(spread)},
        **HF_WORKLOAD,
    )
    default = run_bench(config).requests.set_index("request_id")["e2e_ms"]
    pd.testing.assert_series_equal(default, base)  # off unless asked for
    one = e2e(spread, step_spread_seed="1")
    pd.testing.assert_series_equal(e2e(spread, step_spread_seed="1"), one)
    assert (one > base).all()  # every step 1.5-2.5x its fitted time
    assert not one.equals(e2e(spread, step_spread_seed="2"))
    spread.write_text(json.dumps({**fit, "spread": {"decode": [1.5, 2.5]}}))
    with pytest.raises(UserError, match=f"{spread}: bad step-time spread"):
        e2e(spread)
    one_run = run_bench(
        BenchConfig(
            engines=("sim:hf-cpu",),
            policies=("fcfs",),
            engine_options={"step_time_file": str(plain)},
            **HF_WORKLOAD,
        )
    )
    cell = one_run.info["cells"]["sim:hf-cpu/fcfs"]
    assert cell["kv_spill"] == {} and cell["step_spread_seed"] is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "superinfer", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_bench_on_sim_hf_cpu_and_one_line_errors(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _cli("bench", "--engine", "sim:hf-cpu", "--policies", "fcfs", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "manifest.json").read_text())
    assert meta["workload"]["start_s"] == 100.0 and meta["workload"]["n_requests"] == 55
    assert "`sim:hf-cpu` (its simulator profile" in (out / "report.md").read_text()
    cases = [
        (
            ["bench", "--engine", "sim:hf-cpu", "--engine-option", "bogus=1"],
            "error: unknown --engine-option 'bogus'",
        ),
        (["calibrate", "--engine", "bogus"], "error: calibrate fits the simulated GPUs"),
        (
            ["calibrate", "--engine", "sglang"],
            "error: calibrate --engine sglang refits a server's step log: give --steps",
        ),
    ]
    for args, expected in cases:
        proc = _cli(*args, "--out", str(tmp_path / "x"))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith(expected), (
            proc.stderr
        )


def _true_steps() -> tuple[Any, list[dict[str, Any]]]:
    """A step-time model and twelve steps it times exactly (``steps.parquet`` columns)."""
    from superinfer.sim.hf_cpu import HFCPUStepTime, shape_of

    true = HFCPUStepTime((0.02, 0.004, 0.001, 0.0005, 0.00002, 1e-7, 0.03, 0.0))
    rows = []
    grid = [(1, 0, 64, True), (1, 0, 256, False), (2, 40, 100, False), (3, 10, 30, True)]
    for b, c, n, sampled in grid + [(b, c, 1, True) for b in (1, 3, 8, 16) for c in (30, 300)]:
        shape = shape_of([(c, n, sampled)] * b)
        rows.append(
            {
                "kind": "decode" if n == 1 else "prefill",
                "num_tokens": shape.num_tokens,
                "num_seqs": shape.num_seqs,
                "num_samples": shape.num_samples,
                "kv_tokens": shape.prefill_kv_tokens + shape.decode_kv_tokens,
                "duration_ms": true.step_time_s(shape) * 1e3,
            }
        )
    return true, rows


def _calibrate_recovers(true: Any, engine: str, steps: Path, out: Path) -> dict[str, Any]:
    """Run ``calibrate --engine ENGINE --steps STEPS --out OUT``; assert it exits 0 and fits
    ``true``'s coefficients exactly; the written calibration."""
    from superinfer.sim.hf_cpu import HFCPUStepTime

    proc = _cli("calibrate", "--engine", engine, "--steps", str(steps), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(out.read_text())
    fitted = HFCPUStepTime.from_dict(doc["coefficients"])
    for got, want in zip(fitted.coefficients, true.coefficients, strict=True):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    return doc


def test_calibrate_refits_recorded_steps_without_the_engine(tmp_path: Path) -> None:
    true, rows = _true_steps()
    steps = tmp_path / "recorded.csv"
    pd.DataFrame(rows).to_csv(steps, index=False)
    out = tmp_path / "fit.json"
    doc = _calibrate_recovers(true, "hf", steps, out)
    assert doc["steps_from"] == str(steps) and doc["fit"]["num_samples"] == 12
    assert doc["kv_spill"] == {}  # exact data: no spill regime
    ratios = doc["spread"]["ratio_measured_over_predicted"]  # fitted exactly: every ratio 1
    assert sorted(ratios) == ["decode", "prefill"]
    assert all(v == pytest.approx(1.0) for q in ratios.values() for v in q)
    assert (tmp_path / "fit_steps.csv").is_file()


def test_calibrate_sglang_fits_whole_iterations_of_a_step_log(tmp_path: Path) -> None:
    true, rows = _true_steps()
    # run_batch took the step minus 2 ms of scheduling before it; the first batch has no gap and
    # the fifth waited 0.8 s for a request: both are charged the median busy gap (2 ms)
    gaps = [float("nan"), 2.0, 1.5, 2.5, 800.0, 2.0, 2.0, 1.0, 3.0, 2.0, 2.0, 2.0]
    for row, gap in zip(rows, gaps, strict=True):
        spent = gap if gap <= 20 else 2.0
        row["duration_ms"] -= 2.0 if gap != gap else spent
        row["gap_ms"] = gap
    steps = tmp_path / "sglang.steps.csv"
    pd.DataFrame(rows).to_csv(steps, index=False)
    out = tmp_path / "sglang_fit.json"
    doc = _calibrate_recovers(true, "sglang", steps, out)
    assert doc["engine"] == "sglang" and doc["fit"]["num_samples"] == 12
    written = pd.read_csv(tmp_path / "sglang_fit_steps.csv")
    got_ms = written["forward_ms"].tolist()  # written to 6 significant digits
    assert got_ms == pytest.approx([r["duration_ms"] for r in rows], rel=1e-5)
    bad = tmp_path / "hf_steps.csv"
    pd.DataFrame(rows).drop(columns="gap_ms").to_csv(bad, index=False)
    proc = _cli("calibrate", "--engine", "sglang", "--steps", str(bad), "--out", str(out))
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: not an SGLang step log: no column gap_ms"


def test_a_fitted_spill_reaches_the_calibration_file_and_back(tmp_path: Path) -> None:
    """Steps with a spill regime: ``calibrate --steps`` writes the fitted spill (``kv_spill``)
    and the model read back from the file times steps as the fit does; the summary names it."""
    from superinfer.harness.offline.calibrate_hf import fit_summary, write_hf_calibration
    from superinfer.sim.hf_cpu import HFCPUStepTime, shape_of

    true = HFCPUStepTime(
        (0.02, 0.004, 0.001, 0.0005, 0.00002, 1e-7, 0.03, 0.0),
        spill_tokens=3000.0,
        spill_s_per_token=5e-5,
    )
    rows = []
    grid = [(1, 0, 64), (1, 0, 256), (2, 40, 100), (3, 10, 30)]
    grid += [(b, c, 1) for b in range(1, 17) for c in range(20, 150, 10)]
    grid += [(10, c, 1) for c in range(599, 799, 5)]  # 40 steps of 6,000-7,950 key tokens
    for b, c, n in grid:
        shape = shape_of([(c, n, True)] * b)
        kv = shape.prefill_kv_tokens + shape.decode_kv_tokens
        rows.append(
            {
                "kind": "decode" if n == 1 else "prefill",
                "num_tokens": shape.num_tokens,
                "num_seqs": shape.num_seqs,
                "num_samples": shape.num_samples,
                "kv_tokens": kv,
                "duration_ms": true.step_time_s(shape) * 1e3,
            }
        )
    steps = tmp_path / "steps.csv"
    pd.DataFrame(rows).to_csv(steps, index=False)
    model, report, path, _ = write_hf_calibration(
        {}, steps_file=str(steps), out=str(tmp_path / "f.json")
    )
    assert report["kv_spill"]["s_per_token"] == pytest.approx(5e-5, rel=1e-6)
    assert report["kv_spill"]["threshold_tokens"] == 2304.0  # first multiple of 128 past 16 x 141
    back = HFCPUStepTime.from_file(path)
    assert back == model and not back.repeatable
    probe = shape_of([(700, 1, True)] * 10)
    assert back.step_time_s(probe) == pytest.approx(true.step_time_s(probe), rel=1e-6)
    assert fit_summary(model, report)[-1].startswith("  spill        5e-05 s per key token past")


def test_sim_hf_cpu_adds_the_request_path_to_what_the_client_sees(tmp_path: Path) -> None:
    """``request_latency_ms`` moves every first token and finish by exactly that much (TTFT and
    E2E; TPOT unchanged); unset, it is the step-time file's, else 0; bad values are one-line
    errors."""
    from superinfer.harness.engines.hf_sim import sim_profile
    from superinfer.sim.hf_cpu import HFCPUStepTime

    coefficients = HFCPUStepTime().to_dict()

    def _lat(opts: HFOptions) -> float:
        return sim_profile(opts).request_latency_s

    def run(options: dict[str, str]) -> tuple[pd.DataFrame, dict[str, Any]]:
        config = BenchConfig(
            engines=("sim:hf-cpu",), policies=("fcfs",), engine_options=options, **HF_WORKLOAD
        )
        result = run_bench(config)
        return result.requests.set_index("request_id"), result.info["cells"]["sim:hf-cpu/fcfs"]

    (base, base_info), (late, info) = run({}), run({"request_latency_ms": "12.5"})
    assert (base_info["request_latency_ms"], info["request_latency_ms"]) == (0.0, 12.5)
    assert (late["status"] == "finished").all() and len(late) == 55
    assert ((late["ttft_ms"] - base["ttft_ms"]).round(9) == 12.5).all()
    assert ((late["e2e_ms"] - base["e2e_ms"]).round(9) == 12.5).all()
    pd.testing.assert_series_equal(late["tpot_ms"], base["tpot_ms"])
    # the SLO is judged on what the client sees: 900 ms more puts every TTFT over the chats'
    # 1 s target, so only the requests without a TTFT target can still meet theirs
    slow, _ = run({"request_latency_ms": "900"})
    assert base["met_slo"].sum() == 17 and (base["ttft_ms"] <= 1000).sum() == 29
    assert not (slow["met_slo"] & slow["slo_ttft_ms"].notna()).any()
    assert slow["met_slo"].sum() == (base["met_slo"] & base["slo_ttft_ms"].isna()).sum()
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"coefficients": coefficients, "request_latency_ms": 7.5}))
    assert _lat(hf_options({"step_time_file": str(fit)})) == 0.0075
    both = {"step_time_file": str(fit), "request_latency_ms": "2"}
    assert _lat(hf_options(both)) == 0.002
    assert _lat(HFOptions()) == 0.0
    fit.write_text(json.dumps({"coefficients": coefficients, "request_latency_ms": -1}))
    with pytest.raises(UserError, match="request_latency_ms -1.0 is not >= 0"):
        _lat(hf_options({"step_time_file": str(fit)}))
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(UserError, match="request_latency_ms must be >= 0 and finite"):
            hf_options({"request_latency_ms": bad})


def test_hashed_prompt_ids_share_exactly_the_blocks_their_hashes_share() -> None:
    from superinfer.harness.workload.prompts import HASHED_MIN_ID, hashed_prompt_ids

    a = hashed_prompt_ids([7, 8, 9], 4, 12, vocab_size=1000)
    b = hashed_prompt_ids([7, 8, 10], 4, 12, vocab_size=1000)
    c = hashed_prompt_ids([7], 4, 6, vocab_size=1000, index=1)  # 4 block ids, 2 of its own
    d = hashed_prompt_ids([7], 4, 6, vocab_size=1000, index=2)
    assert len(a) == len(b) == 12 and len(c) == len(d) == 6
    assert a[:8] == b[:8] and a[8:] != b[8:]  # blocks 7, 8 shared; 9 vs 10 not
    assert c[:4] == d[:4] == a[:4] and c[4:] != d[4:]  # fillers are the request's own
    assert hashed_prompt_ids([7, 8, 9], 4, 5, vocab_size=1000) == a[:5]  # shorter: a prefix
    assert a == hashed_prompt_ids([7, 8, 9], 4, 12, vocab_size=1000)  # deterministic
    assert a != hashed_prompt_ids([7, 8, 9], 4, 12, vocab_size=1000, seed=1)
    assert min(a + b + c + d) >= HASHED_MIN_ID and max(a + b + c + d) < 1000
    with pytest.raises(ValueError, match="block_tokens"):
        hashed_prompt_ids([7], 0, 4, vocab_size=1000)
    with pytest.raises(ValueError, match="vocab_size"):
        hashed_prompt_ids([7], 4, 4, vocab_size=HASHED_MIN_ID)
