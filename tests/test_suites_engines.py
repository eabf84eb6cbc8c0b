"""``bench --suite engines`` (issue 24): options, loads, workload, summary columns and the
aggregate / check / fidelity arithmetic, on the simulator and on hand-made tables."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from click.testing import CliRunner

from superinfer.cli import cli
from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.errors import UserError
from superinfer.harness.suites_engines import (
    batched_sizes,
    batched_workload,
    lone_workload,
    mix_workload,
    run_engines,
)
from superinfer.harness.suites_engines_fidelity import fidelity, fidelity_bound
from superinfer.harness.suites_engines_knee import (
    find_knee,
    knee_loads,
    lone_step_fit,
    serial_capacity,
    sglang_step_fit,
)
from superinfer.harness.suites_engines_options import (
    DEFAULT_LOADS,
    REAL_ENGINES,
    SIM_SGLANG_LIMITS,
    SuiteOptions,
    engine_loads,
    sim_sglang_limits,
    suite_options,
)
from superinfer.harness.suites_engines_report import aggregate, policy_checks


def test_default_options() -> None:
    opts = suite_options({})
    assert opts == SuiteOptions()
    assert opts.repeats == 3
    assert dict(opts.loads) == dict(DEFAULT_LOADS)
    assert opts.auto == REAL_ENGINES  # every real engine's loads come from its knee pilot
    chat, batch = opts.slos()
    assert (chat.ttft_ms, chat.tpot_ms, chat.priority) == (1500.0, 500.0, 0)
    assert (batch.deadline_s, batch.priority) == (120.0, 1)


def test_options_parse_per_engine_loads_and_scalars() -> None:
    opts = suite_options(
        {
            "suite.loads.hf": "0.1, 0.2",
            "suite.repeats": "2",
            "suite.duration_s": "45",
            "suite.chat_ttft_ms": "1500",
            "suite.engines": "hf,sim:hf-cpu",
            "suite.lone_gap_s.sglang": "4",
            "suite.lone": "0",
            "suite.sglang_args": "--enable-mixed-chunk",
        }
    )
    assert (opts.sglang_args, SuiteOptions().sglang_args) == ("--enable-mixed-chunk", "")
    assert opts.loads["hf"] == (0.1, 0.2)
    assert opts.auto == ("sglang", "llamacpp")  # fixed loads turn hf's pilot off
    assert opts.loads["sglang"] == DEFAULT_LOADS["sglang"]
    assert (opts.repeats, opts.duration_s, opts.chat_ttft_ms, opts.lone) == (2, 45.0, 1500.0, 0)
    assert opts.engines == ("hf", "sim:hf-cpu")
    assert opts.lone_gap_s["sglang"] == 4.0
    assert engine_loads(opts, "hf") == (0.1, 0.2)
    assert engine_loads(opts, "sim:hf-cpu") == (0.1, 0.2)  # a sim row replays its engine's loads
    assert engine_loads(opts, "sim:sglang-cpu") == DEFAULT_LOADS["sglang"]
    found = {"sglang": (1.0, 2.0)}
    assert engine_loads(opts, "sim:sglang-cpu", found) == (1.0, 2.0)
    assert engine_loads(opts, "hf", found) == (0.1, 0.2)
    again = suite_options({"suite.loads.hf": "0.1", "suite.loads.llamacpp": "auto"})
    assert again.auto == ("sglang", "llamacpp")


def test_find_knee_steps_up_then_brackets() -> None:
    curve = {1.0: 0.95, 1.5: 0.3, 1.5**0.5: 0.9}
    seen = []

    def attainment(load: float) -> float:
        seen.append(load)
        return curve[min(curve, key=lambda k: abs(k - load))]

    knee, probes = find_knee(attainment, 1.0, max_probes=3)
    assert seen == [1.0, 1.5, pytest.approx(1.5**0.5)]
    assert knee == pytest.approx((1.5**0.5 * 1.5) ** 0.5)  # tightest bracket's geometric mean
    assert [a for _, a in probes] == [0.95, 0.3, 0.9]


def test_find_knee_stops_inside_the_band_and_steps_down() -> None:
    knee, probes = find_knee(lambda load: 0.1 if load > 1 else 0.7, 2.25)
    assert probes == [(2.25, 0.1), (1.5, 0.1), (1.0, 0.7)]
    assert knee == 1.0
    knee, probes = find_knee(lambda load: 1.0, 1.0, max_probes=2)
    # every probe too light: one step past the highest (this picked the lowest, 1.0, before)
    assert probes == [(1.0, 1.0), (1.5, 1.0)] and knee == 2.25
    knee, probes = find_knee(lambda load: 0.0, 1.5, max_probes=2)
    assert probes == [(1.5, 0.0), (1.0, 0.0)] and knee == 1.0 / 1.5


def test_knee_loads_and_serial_capacity() -> None:
    assert knee_loads(1.0) == (0.8, 1.0, 1.25)
    assert knee_loads(0.333333) == (0.267, 0.333, 0.417)
    lone = pd.DataFrame({"slo_class": ["chat", "chat", "batch"], "e2e_ms": [900.0, 1100.0, 4000.0]})
    # mean service 0.6 * 1.0 s + 0.4 * 4.0 s = 2.2 s
    assert serial_capacity(lone, 0.4) == pytest.approx(1 / 2.2)
    assert math.isnan(serial_capacity(lone[lone["slo_class"] == "chat"], 0.4))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"suite.bogus": "1"}, "unknown suite option 'suite.bogus'"),
        ({"num_blocks": "8"}, "takes only suite.* engine options"),
        ({"suite.loads.vllm": "1"}, "unknown engine 'vllm'"),
        ({"suite.loads.hf": "a,b"}, "expected numbers"),
        ({"suite.loads.hf": "0,1"}, "needs positive numbers"),
        ({"suite.repeats": "x"}, "not a number"),
        ({"suite.repeats": "0"}, "must be > 0"),
        ({"suite.batch_share": "1"}, "must be below 1"),
        ({"suite.engines": "hf,trt"}, "unknown engine 'trt'"),
        ({"suite.loads.hf": "auto,1"}, "expected numbers"),
    ],
)
def test_bad_options_are_one_line_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(UserError, match=message) as err:
        suite_options(options)
    assert "\n" not in str(err.value)


def test_bad_suite_option_on_the_command_line() -> None:
    res = CliRunner().invoke(
        cli, ["bench", "--suite", "engines", "--engine-option", "suite.repeats=zero"]
    )
    assert isinstance(res.exception, UserError)  # main() prints it as one line, exit 2
    assert str(res.exception) == "suite.repeats='zero': not a number"


def test_mix_workload_is_seeded_and_shares_one_slo_per_class() -> None:
    opts = suite_options({"suite.duration_s": "20"})
    a, b = mix_workload(opts, 1.0, 0), mix_workload(opts, 1.0, 0)
    assert a.requests == b.requests
    assert all(0 < s.arrival_s < 20 for s in a.requests)
    arrivals = [s.arrival_s for s in a.requests]
    assert arrivals == sorted(arrivals)
    chat = [s for s in a.requests if s.slo.name == "chat"]
    batch = [s for s in a.requests if s.slo.name == "batch"]
    assert chat and batch and len(chat) + len(batch) == len(a.requests)
    assert {s.slo for s in chat} == {opts.slos()[0]}
    assert all(32 <= s.prompt_tokens <= 160 and 16 <= s.output_tokens <= 48 for s in chat)
    assert all(600 <= s.prompt_tokens <= 900 and 32 <= s.output_tokens <= 96 for s in batch)
    assert all(s.prompt_tokens + s.output_tokens <= 1024 for s in a.requests)
    assert mix_workload(opts, 1.0, 1).requests != a.requests


def test_lone_workload() -> None:
    wl = lone_workload(suite_options({"suite.lone": "2"}), 5.0)
    assert [(s.request_id, s.arrival_s, s.prompt_tokens, s.output_tokens) for s in wl.requests] == [
        ("chat-0", 1.0, 160, 32),
        ("chat-1", 6.0, 160, 32),
        ("batch-0", 11.0, 900, 64),
        ("batch-1", 16.0, 900, 64),
    ]


def test_sglang_step_fit_exact() -> None:
    lone = pd.DataFrame(
        {
            "slo_class": ["chat", "batch"],
            "prompt_tokens": [160, 900],
            "ttft_ms": [50.0, 182.0],
            "tpot_ms": [10.0, 10.0],
        }
    )
    coef = sglang_step_fit(lone)["coefficients"]
    # 2 passes of 512: c_tok = (0.182 - 2 * 0.010) / (900 - 2) s per token; c0 = 0.010 - c_tok
    assert coef["num_tokens"] == pytest.approx(0.162 / 898)
    assert coef["intercept"] == pytest.approx(0.010 - 0.162 / 898)
    assert coef["kv_tokens"] == 0.0
    with pytest.raises(UserError, match="lone SGLang"):
        sglang_step_fit(lone[lone["slo_class"] == "chat"])


def test_lone_step_fit_in_hf_passes() -> None:
    lone = pd.DataFrame(
        {
            "slo_class": ["chat", "batch", "batch"],
            "prompt_tokens": [160, 900, 900],
            "ttft_ms": [300.0, 1550.0, 1550.0],
            "tpot_ms": [70.0, 74.0, 76.0],
        }
    )
    fit = lone_step_fit(lone, 256, "hf")
    coef = fit["coefficients"]
    # median TPOT 74 ms; 900 tokens in ceil(900 / 256) = 4 passes of 256
    assert coef["num_tokens"] == pytest.approx((1.550 - 4 * 0.074) / (900 - 4))
    assert coef["intercept"] == pytest.approx(0.074 - (1.550 - 4 * 0.074) / (900 - 4))
    assert fit["source"] == (
        "lone hf requests: decode step 74.0 ms, 900-token prompt TTFT 1550 ms in 4 passes of 256"
    )


def test_lone_step_fit_with_the_batched_pass() -> None:
    lone = pd.DataFrame(
        {
            "slo_class": ["chat", "batch"],
            "prompt_tokens": [160, 900],
            "ttft_ms": [300.0, 1550.0],
            "tpot_ms": [74.0, 74.0],
        }
    )
    # TPOT 74 ms alone, then 84 / 104 / 144 ms at 2 / 4 / 8 sequences: slope 10 ms per sequence
    batched = pd.DataFrame({"concurrency": [2, 2, 4, 8], "tpot_ms": [84.0, 84.0, 104.0, 144.0]})
    fit = lone_step_fit(lone, 256, "hf", batched)
    coef = fit["coefficients"]
    c_tok = (1.550 - 4 * 0.074) / (900 - 4)
    assert coef["num_tokens"] == pytest.approx(c_tok)
    assert coef["num_seqs"] == pytest.approx(0.010 - c_tok)
    assert coef["intercept"] == pytest.approx(0.074 - 0.010)
    assert fit["source"].endswith(
        "; batched, TPOT 74.0 ms at 1, 84.0 ms at 2, 104.0 ms at 4, 144.0 ms at 8 sequences"
    )
    # a flat batched pass (slope below the per-token cost) adds no per-sequence term
    flat = batched.assign(tpot_ms=74.0)
    coef = lone_step_fit(lone, 256, "hf", flat)["coefficients"]
    assert coef["num_seqs"] == 0.0
    assert coef["intercept"] == pytest.approx(0.074 - c_tok)


def test_batched_workload_groups_arrive_together() -> None:
    opts = suite_options({"suite.batched_max": "8"})
    assert batched_sizes(opts) == (2, 4, 8)
    assert batched_sizes(suite_options({"suite.batched_max": "0"})) == ()
    assert batched_sizes(suite_options({"suite.batched_max": "5"})) == (2, 4)
    wl = batched_workload(opts, 10.0)
    by_arrival: dict[float, list[str]] = {}
    for r in wl.requests:
        assert (r.prompt_tokens, r.output_tokens, r.slo.name) == (64, 32, "chat")
        by_arrival.setdefault(r.arrival_s, []).append(r.request_id)
    assert {t: len(ids) for t, ids in by_arrival.items()} == {1.0: 2, 11.0: 4, 21.0: 8}
    assert sorted(by_arrival[1.0]) == ["chat-b2-0", "chat-b2-1"]


def test_summary_columns_on_the_simulator() -> None:
    base = {
        "suite.engines": "sim:hf-cpu",
        "suite.loads.hf": "0.2",
        "suite.duration_s": "15",
        "suite.repeats": "2",
    }
    # the default fits sim:hf-cpu on the lone hf requests, so hf must run too
    with pytest.raises(UserError, match="sim:hf-cpu is fitted on the lone hf requests"):
        run_engines(BenchConfig(seed=0), suite_options(base), __import__("pathlib").Path("/tmp"))
    calibration = {"suite.hf_step_time_file": "results/hf/step_time_fit.json"}
    opts = suite_options({**base, **calibration})
    res = run_engines(BenchConfig(seed=0), opts, __import__("pathlib").Path("/tmp"))
    s = res.summary
    assert list(s.columns[:5]) == ["engine", "policy", "repeat", "load", "slo_class"]
    assert {"n_feasible", "slo_attainment_feasible", "slo_attainment", "output_tok_s"} <= set(
        s.columns
    )
    assert set(s["engine"]) == {"sim:hf-cpu"}
    assert set(s["policy"]) == {"fcfs", "priority", "superinfer"}
    assert set(s["load"]) == {0.2} and set(s["repeat"]) == {0, 1}
    every = s[s["slo_class"] == "all"]
    for rep in (0, 1):  # repeat r replays the arrivals of seed 0 + r under every policy
        n = len(mix_workload(opts, 0.2, rep).requests)
        assert (every[every["repeat"] == rep]["n_requests"] == n).all()
    assert len(mix_workload(opts, 0.2, 0).requests) != len(mix_workload(opts, 0.2, 1).requests)
    # every run's requests are kept, keyed like its summary rows, one row per request
    r = res.requests
    assert list(r.columns[:5]) == ["engine", "policy", "repeat", "load", "request_id"]
    counts = r.groupby(["policy", "repeat"]).size()
    for rep in (0, 1):
        n = len(mix_workload(opts, 0.2, rep).requests)
        assert [counts[(p, rep)] for p in ("fcfs", "priority", "superinfer")] == [n, n, n]
    done = r[r["status"] == "finished"].groupby(["policy", "repeat", "slo_class"]).size()
    fin = s[s["slo_class"] != "all"].set_index(["policy", "repeat", "slo_class"])["n_finished"]
    assert done.sort_index().tolist() == fin.sort_index().tolist()


def _summary() -> pd.DataFrame:
    rows = []
    for rep, (nat, sup) in enumerate([(0.6, 0.8), (0.8, 0.9), (0.7, 1.0)]):
        rows.append(("hf", "fcfs", rep, 1.0, "chat", nat, 100.0 + rep))
        rows.append(("hf", "superinfer", rep, 1.0, "chat", sup, 50.0))
        rows.append(("hf", "fcfs", rep, 2.0, "chat", 0.3, 400.0))
        rows.append(("hf", "superinfer", rep, 2.0, "chat", 0.25, 300.0))
    rows.append(("sim:hf-cpu", "fcfs", 0, 1.0, "chat", 0.75, 115.0))
    cols = ["engine", "policy", "repeat", "load", "slo_class", "slo_attainment", "ttft_p50_ms"]
    return pd.DataFrame(rows, columns=cols)


def test_aggregate_exact() -> None:
    agg = aggregate(_summary())
    row = agg[
        (agg["policy"] == "fcfs")
        & (agg["load"] == 1.0)
        & (agg["engine"] == "hf")
        & (agg["metric"] == "ttft_p50_ms")
    ].iloc[0]
    assert (row["n"], row["mean"], row["min"], row["max"]) == (3, 101.0, 100.0, 102.0)
    assert row["std"] == pytest.approx(1.0)
    att = agg[
        (agg["policy"] == "superinfer") & (agg["load"] == 1.0) & (agg["metric"] == "slo_attainment")
    ].iloc[0]
    assert att["mean"] == pytest.approx(0.9)
    assert att["std"] == pytest.approx(0.1)
    sim = agg[agg["engine"] == "sim:hf-cpu"]
    assert set(sim["n"]) == {1} and sim["std"].isna().all()


def test_policy_checks_exact() -> None:
    checks = policy_checks(aggregate(_summary()), {"hf": "fcfs"})
    knee = checks[checks["load"] == 1.0].iloc[0]
    assert knee["native_chat_attainment"] == pytest.approx(0.7)
    assert knee["points"] == pytest.approx(20.0)
    assert bool(knee["in_knee_band"]) and knee["required_points"] == 10.0 and bool(knee["met"])
    assert knee["gap_closed"] == pytest.approx(0.2 / 0.3)
    over = checks[checks["load"] == 2.0].iloc[0]
    assert over["points"] == pytest.approx(-5.0)
    assert not bool(over["in_knee_band"]) and over["required_points"] == 0.0
    assert not bool(over["met"])


def test_policy_checks_judge_issue_18_targets_in_its_band() -> None:
    """Issue 18's columns: ratios of the means over repeats, judged only where native's chat
    attainment is 0.6-0.8 (empty elsewhere)."""
    rows = []
    for rep in range(2):
        for load, nat, sup, p99s, toks in [
            (1.0, 0.7, 0.9, (1000.0, 500.0), (20.0, 19.2)),  # +20, 0.5x, 0.96x: met
            (1.5, 0.7, 0.9, (1000.0, 500.0), (20.0, 18.8)),  # tok/s 0.94x: missed
            (2.0, 0.5, 0.9, (1000.0, 500.0), (20.0, 19.2)),  # below the band: not judged
        ]:
            for policy, att, p99, tok in (("fcfs", nat, p99s[0], toks[0]),
                                          ("superinfer", sup, p99s[1] + rep, toks[1])):  # fmt: skip
                rows.append(("hf", policy, rep, load, "chat", att, p99, math.nan))
                # the all-class row differs in attainment and TTFT: only its tok/s is read
                rows.append(("hf", policy, rep, load, "all", att - 0.1, p99 + 1000.0, tok))
    cols = ["engine", "policy", "repeat", "load", "slo_class", "slo_attainment", "ttft_p99_ms",
            "output_tok_s"]  # fmt: skip
    checks = policy_checks(aggregate(pd.DataFrame(rows, columns=cols)), {"hf": "fcfs"})
    met, short, below = (checks[checks["load"] == x].iloc[0] for x in (1.0, 1.5, 2.0))
    assert met["chat_ttft_p99_ratio"] == pytest.approx(500.5 / 1000.0)
    assert met["output_tok_s_ratio"] == pytest.approx(0.96)
    assert bool(met["in_issue18_band"]) and met["issue18_met"] is True
    assert short["output_tok_s_ratio"] == pytest.approx(0.94) and short["issue18_met"] is False
    assert not bool(below["in_issue18_band"]) and below["issue18_met"] is None


def test_fidelity_exact() -> None:
    fid = fidelity(aggregate(_summary()))
    ttft = fid[fid["metric"] == "ttft_p50_ms"].iloc[0]
    assert (ttft["sim_engine"], ttft["engine"], ttft["policy"], ttft["load"]) == (
        "sim:hf-cpu",
        "hf",
        "fcfs",
        1.0,
    )
    assert ttft["real"] == 101.0 and ttft["sim"] == 115.0
    assert ttft["rel_err"] == pytest.approx(14 / 101)
    assert bool(ttft["within"]) and ttft["bound"] == "0.15 rel"
    att = fid[fid["metric"] == "slo_attainment"].iloc[0]
    assert att["abs_err"] == pytest.approx(0.05)
    assert not math.isnan(att["rel_err"])
    # attainment is judged in points: 5 points off is outside the 3-point bound
    assert att["bound"] == "3 points" and not att["within"]
    # only the metrics the real rows report are compared
    assert set(fid["metric"]) == {"ttft_p50_ms", "slo_attainment"}


def test_fidelity_bounds_per_metric() -> None:
    assert fidelity_bound("ttft_p50_ms") == ("rel", 0.15)
    assert fidelity_bound("e2e_p99_ms") == ("rel", 0.25)
    assert fidelity_bound("slo_attainment") == ("points", 3.0)
    kind, bound = fidelity_bound("preemptions")
    assert kind == "" and math.isnan(bound)


def test_plot_takes_equal_repeats(tmp_path) -> None:
    """Three equal attainments: mean - min is -1e-16 in floating point; the error bars are clipped
    at 0 (matplotlib refuses negative ones; a 40-minute run was lost to it once)."""
    from superinfer.harness.suites_engines_report import _plot

    rows = [("hf", "fcfs", r, 1.0, "chat", 0.7) for r in range(3)]
    cols = ["engine", "policy", "repeat", "load", "slo_class", "slo_attainment"]
    agg = aggregate(pd.DataFrame(rows, columns=cols))
    assert (agg["mean"] - agg["min"]).iloc[0] < 0
    _plot(agg, tmp_path / "a.png")
    assert (tmp_path / "a.png").stat().st_size > 0


def test_resimulate_replays_the_simulated_rows_of_a_run(tmp_path, monkeypatch) -> None:
    import dataclasses
    import json
    import shutil

    from superinfer.harness.suites_engines_replay import resimulate

    calibration = "results/hf/step_time_fit.json"
    opts = suite_options(
        {
            "suite.engines": "sim:hf-cpu",
            "suite.loads.hf": "0.2",
            "suite.duration_s": "15",
            "suite.repeats": "2",
            "suite.hf_step_time_file": calibration,
        }
    )
    share_08 = BenchConfig(seed=3, policy_options={"superinfer": {"tpot_plan_share": "0.8"}})
    first = run_engines(share_08, opts, tmp_path / "work")
    sim = first.summary
    # a run folder as the suite writes it: the real hf rows (hand-made here), the manifest's
    # options, seed and engine facts (the sim row's chat TTFT target), the hf fit
    real = sim.assign(engine="hf")
    real.to_csv(tmp_path / "summary.csv", index=False)
    manifest = {
        "seed": 3,
        "options": dataclasses.asdict(opts),
        "engines": first.info["engines"],
        # what run_engines records: the suite's options on hf under --policy-opt's
        "superinfer_options": {
            "hf": {
                "tpot_plan_share": "0.8",
                "prefill_floor_yields": "true",
                "min_prefill_budget_share": "0.5",
            }
        },
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    shutil.copy(calibration, tmp_path / "hf_step_time.json")
    got = resimulate(tmp_path, "sim:hf-cpu")
    replayed = got[got["engine"] == "sim:hf-cpu"].reset_index(drop=True)
    pd.testing.assert_frame_equal(replayed, sim.reset_index(drop=True), check_dtype=False)

    # a run from before the manifest recorded it ran superinfer on hf with tpot_plan_share 1.0
    # and without prefill_floor_yields, with the policy's min_prefill_budget_share (HF_UNRECORDED)
    def unrecorded(share: str) -> pd.DataFrame:
        given = {
            "tpot_plan_share": share,
            "prefill_floor_yields": "false",
            "min_prefill_budget_share": "0.125",
        }
        config = BenchConfig(seed=3, policy_options={"superinfer": given})
        return run_engines(config, opts, tmp_path / "work").summary.reset_index(drop=True)

    old = unrecorded("1.0")
    del manifest["superinfer_options"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    got_old = resimulate(tmp_path, "sim:hf-cpu")
    replayed_old = got_old[got_old["engine"] == "sim:hf-cpu"].reset_index(drop=True)
    pd.testing.assert_frame_equal(replayed_old, old, check_dtype=False)
    assert not old.equals(sim)  # the plan share changes these rows: the checks can fail
    # ... unless its config said otherwise
    manifest["config"] = {"policy_options": {"superinfer": {"tpot_plan_share": "0.8"}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    got_given = resimulate(tmp_path, "sim:hf-cpu")
    replayed_given = got_given[got_given["engine"] == "sim:hf-cpu"].reset_index(drop=True)
    pd.testing.assert_frame_equal(replayed_given, unrecorded("0.8"), check_dtype=False)
    # ... and one recorded before prefill_floor_yields ran without it
    manifest["superinfer_options"] = {"hf": {"tpot_plan_share": "0.8"}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    got_before = resimulate(tmp_path, "sim:hf-cpu")
    replayed_before = got_before[got_before["engine"] == "sim:hf-cpu"].reset_index(drop=True)
    pd.testing.assert_frame_equal(replayed_before, unrecorded("0.8"), check_dtype=False)
    # (at this load the option moves no row: what the replay runs superinfer with says it)
    seen = _spy_on_run_bench(monkeypatch)
    resimulate(tmp_path, "sim:hf-cpu")
    before = [c.policy_options["superinfer"] for c in seen]
    seen.clear()
    manifest["superinfer_options"] = {
        "hf": {"tpot_plan_share": "0.8", "prefill_floor_yields": "true"}
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    resimulate(tmp_path, "sim:hf-cpu")
    recorded = [c.policy_options["superinfer"] for c in seen]
    assert before and {o["prefill_floor_yields"] for o in before} == {"false"}
    assert recorded and {o["prefill_floor_yields"] for o in recorded} == {"true"}
    # both recorded before min_prefill_budget_share was: the policy's 0.125 (HF_UNRECORDED);
    # one that recorded it replays with it
    assert {o["min_prefill_budget_share"] for o in before + recorded} == {"0.125"}
    seen.clear()
    manifest["superinfer_options"]["hf"]["min_prefill_budget_share"] = "0.5"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    resimulate(tmp_path, "sim:hf-cpu")
    assert seen and {c.policy_options["superinfer"]["min_prefill_budget_share"] for c in seen} == {
        "0.5"
    }
    assert (got["engine"] == "hf").sum() == len(real)
    # other mechanics change the simulated rows, not the real ones
    other = resimulate(tmp_path, "sim:hf-cpu", {"mechanics": "sglang"})
    assert (other["engine"] == "hf").sum() == len(real)
    assert not other[other["engine"] == "sim:hf-cpu"]["ttft_p50_ms"].equals(sim["ttft_p50_ms"])
    # superinfer's options reach its rows only (a bad one is an error naming it)
    from superinfer.adapters.manager import UnknownPolicyError

    with pytest.raises(UnknownPolicyError, match="num_tiers must be >= 1, got 0"):
        resimulate(tmp_path, "sim:hf-cpu", superinfer_options={"num_tiers": "0"})
    one = resimulate(tmp_path, "sim:hf-cpu", superinfer_options={"num_tiers": "3"})
    one = one[one["engine"] == "sim:hf-cpu"].reset_index(drop=True)
    mine = one["policy"] == "superinfer"
    pd.testing.assert_frame_equal(one[~mine], sim.reset_index(drop=True)[~mine], check_dtype=False)
    with pytest.raises(UserError, match="not a simulated CPU engine"):
        resimulate(tmp_path, "hf")
    with pytest.raises(UserError, match="sglang_step_time.json: no such file"):
        resimulate(tmp_path, "sim:sglang-cpu")


@pytest.mark.parametrize(
    ("recorded", "replayed"),
    [
        # a run from before the seat reserve and the serial prefills: replayed without them
        (
            {"min_prefill_tokens": "32", "max_preemptions_per_step": "0"},
            {"ttft_seat_reserve": "0", "serial_whole_prefills": "false",
             "ttft_boost_unmixed": "false",
             "min_prefill_tokens": "32", "max_preemptions_per_step": "0"},
        ),
        # one from between them: its seat reserve kept, no serial prefills
        (
            {"ttft_seat_reserve": "2"},
            {"ttft_seat_reserve": "2", "serial_whole_prefills": "false",
             "ttft_boost_unmixed": "false"},
        ),
        # one that records both, from before the unmixed boost went on: without the boost
        (
            {"ttft_seat_reserve": "2", "serial_whole_prefills": "true"},
            {"ttft_seat_reserve": "2", "serial_whole_prefills": "true",
             "ttft_boost_unmixed": "false"},
        ),
        # one that records all three: as recorded
        (
            {"ttft_seat_reserve": "2", "serial_whole_prefills": "true",
             "ttft_boost_unmixed": "true"},
            {"ttft_seat_reserve": "2", "serial_whole_prefills": "true",
             "ttft_boost_unmixed": "true"},
        ),
        # one from before the manifest recorded any (the suite's base options fill the rest)
        (None, {"ttft_seat_reserve": "0", "serial_whole_prefills": "false",
                "ttft_boost_unmixed": "false"}),
    ],
)  # fmt: skip
def test_resimulate_replays_sglang_runs_with_the_options_they_ran(
    tmp_path, monkeypatch, recorded: dict[str, str] | None, replayed: dict[str, str]
) -> None:
    import json

    from superinfer.harness import suites_engines_replay

    pd.DataFrame({"engine": ["sglang"], "load": [0.5]}).to_csv(tmp_path / "summary.csv")
    manifest: dict[str, object] = {"seed": 0, "options": {}}
    if recorded is not None:
        manifest["superinfer_options"] = {"sglang": recorded}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "sglang_step_time.json").write_text("{}")
    seen: list[dict[str, str]] = []

    def fake_cells(*_a: object, superinfer_options: dict[str, str], **_k: object) -> list:
        seen.append(dict(superinfer_options))
        return []

    monkeypatch.setattr(suites_engines_replay, "sim_cells", fake_cells)
    suites_engines_replay.resimulate(
        tmp_path, "sim:sglang-cpu", superinfer_options={"num_tiers": "3"}
    )
    assert seen == [{**replayed, "num_tiers": "3"}]


def test_with_seq_cost_scales_the_donor_term_by_the_intercepts() -> None:
    from superinfer.harness.suites_engines_knee import with_seq_cost

    own = {"coefficients": {"intercept": 0.06, "num_tokens": 4e-4, "num_seqs": 0.0}, "source": "a"}
    donor = {"coefficients": {"intercept": 0.08, "num_tokens": 5e-4, "num_seqs": 0.004}}
    got = with_seq_cost(own, donor, "run-b")
    assert got["coefficients"] == {"intercept": 0.06, "num_tokens": 4e-4, "num_seqs": 0.003}
    assert got["source"] == (
        "a; per-sequence decode cost 4.00 ms from run-b (batched pass) x 0.750, the ratio of "
        "the two intercepts"
    )
    assert own["coefficients"]["num_seqs"] == 0.0  # not modified


def test_a_real_runs_step_log_is_kept_with_its_engine_and_policy(tmp_path, monkeypatch) -> None:
    from superinfer.harness import suites_engines
    from superinfer.harness.bench import BenchResult

    steps = pd.DataFrame({"step_index": [0, 1], "duration_ms": [70.5, 131.25], "num_seqs": [1, 2]})
    summary = pd.DataFrame({"engine": ["hf"], "policy": ["fcfs"], "slo_class": ["all"]})
    requests = pd.DataFrame({"slo_class": ["chat"], "status": ["finished"], "reason": [""]})
    seen: list[BenchConfig] = []

    def fake_run_bench(cfg: BenchConfig, workload: object) -> BenchResult:
        seen.append(cfg)
        return BenchResult(summary, requests, pd.DataFrame(), {}, steps if seen[1:] else steps[:0])

    monkeypatch.setattr(suites_engines, "run_bench", fake_run_bench)
    opts = SuiteOptions()
    wl = mix_workload(opts, 0.3, 0)
    first, second = tmp_path / "a" / "hf_fcfs.parquet", tmp_path / "b" / "hf_superinfer.parquet"
    suites_engines._run_cell(BenchConfig(), "hf", "fcfs", wl, {}, opts, steps_to=first)
    assert not first.exists()  # no step recorded: no file
    suites_engines._run_cell(BenchConfig(), "hf", "superinfer", wl, {}, opts, steps_to=second)
    got = pd.read_parquet(second)
    assert got["duration_ms"].tolist() == [70.5, 131.25] and got["num_seqs"].tolist() == [1, 2]
    assert set(got["engine"]) == {"hf"} and set(got["policy"]) == {"superinfer"}
    assert [c.engines for c in seen] == [("hf",), ("hf",)]
    hf = {
        "tpot_plan_share": "0.9",
        "prefill_floor_yields": "true",
        "min_prefill_budget_share": "0.5",
    }
    assert [c.policy_options for c in seen] == [{"superinfer": hf}] * 2


def test_an_sglang_runs_step_log_is_the_lines_its_server_wrote_during_the_run(
    tmp_path, monkeypatch
) -> None:
    from superinfer.harness import suites_engines
    from superinfer.harness.bench import BenchResult

    log = tmp_path / "sglang-fcfs.steps.csv"
    log.write_text("step_index,duration_ms,kind\n0,9.5,prefill\n1,6.25,decode\n")
    summary = pd.DataFrame({"engine": ["http"], "policy": ["fcfs"], "slo_class": ["all"]})
    requests = pd.DataFrame({"slo_class": ["chat"], "status": ["finished"], "reason": [""]})

    def fake_run_bench(cfg: BenchConfig, workload: object) -> BenchResult:
        with log.open("a") as f:  # the server steps while the run goes on
            f.write("2,11.0,prefill\n3,7.5,decode\n")
        return BenchResult(summary, requests, pd.DataFrame(), {}, pd.DataFrame())

    monkeypatch.setattr(suites_engines, "run_bench", fake_run_bench)
    monkeypatch.setattr(suites_engines, "_flush", lambda url: None)
    server = type("Server", (), {"step_log_path": log, "plugin": False})()
    handle = {"url": "http://127.0.0.1:1", "server": server}
    opts = SuiteOptions()
    wl = mix_workload(opts, 1.0, 0)
    out = tmp_path / "steps" / "sglang_native_1_0.parquet"
    suites_engines._run_cell(BenchConfig(), "sglang", "native", wl, handle, opts, steps_to=out)
    got = pd.read_parquet(out)
    assert got["step_index"].tolist() == [2, 3] and got["duration_ms"].tolist() == [11.0, 7.5]
    assert set(got["engine"]) == {"sglang"} and set(got["policy"]) == {"native"}


def test_the_suite_folder_gets_every_step_log_in_one_file(tmp_path) -> None:
    from superinfer.harness.suites_engines import collect_step_logs
    from superinfer.harness.suites_engines_report import write_engines

    assert collect_step_logs(tmp_path / "work").empty  # no run kept a log
    logs = tmp_path / "work" / "steps"
    logs.mkdir(parents=True)
    pd.DataFrame({"duration_ms": [80.0], "policy": ["superinfer"]}).to_parquet(
        logs / "hf_superinfer_0.3_0.parquet"
    )
    pd.DataFrame({"duration_ms": [70.0, 140.0], "policy": ["fcfs"] * 2}).to_parquet(
        logs / "hf_fcfs_0.3_0.parquet"
    )
    steps = collect_step_logs(tmp_path / "work")
    assert steps["run"].tolist() == ["hf_fcfs_0.3_0"] * 2 + ["hf_superinfer_0.3_0"]
    assert steps["duration_ms"].tolist() == [70.0, 140.0, 80.0]
    summary = run_engines(
        BenchConfig(),
        suite_options({"suite.engines": "sim:hf-cpu", "suite.loads.hf": "0.2",
                       "suite.duration_s": "10", "suite.repeats": "1",
                       "suite.hf_step_time_file": "results/hf/step_time_fit.json"}),
        tmp_path / "sim-work",
    ).summary  # fmt: skip
    out = tmp_path / "out"
    requests = pd.DataFrame({"engine": ["hf"], "policy": ["fcfs"], "request_id": ["r0"]})
    files = write_engines(
        out, summary, pd.DataFrame(), {}, {}, ["test"], steps=steps, requests=requests
    )
    assert {"steps.parquet", "requests.parquet"} <= set(files.split(", "))
    pd.testing.assert_frame_equal(pd.read_parquet(out / "steps.parquet"), steps)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "requests.parquet"), requests)
    assert "| `steps.parquet` | `test` |" in (out / "MANIFEST.md").read_text()
    assert "| `requests.parquet` | `test` |" in (out / "MANIFEST.md").read_text()


def test_the_simulations_are_fitted_on_the_runs_step_logs_when_they_hold_enough_steps(
    tmp_path,
) -> None:
    from superinfer.harness.suites_engines import collect_step_logs
    from superinfer.harness.suites_engines_knee import MIN_LOG_STEPS, step_log_fit
    from superinfer.sim.hf_cpu import HFCPUStepTime, shape_of_totals

    true = HFCPUStepTime((0.05, 0.001, 0.0015, 0.0015, 3e-5, 0.0, 0.0, 3.6e-4))
    rows = []
    for i in range(MIN_LOG_STEPS):
        seqs, prefill = 1 + i % 8, i % 5 == 0
        tokens = 64 + 7 * i % 448 if prefill else seqs
        kv = tokens + 37 * i % 900
        held = kv - tokens if prefill and i % 10 == 0 else 0
        ms = true.step_time_s(shape_of_totals(tokens, seqs, seqs, kv, held)) * 1e3
        rows.append(
            {
                "kind": "prefill" if prefill else "decode",
                "num_tokens": tokens,
                "num_seqs": seqs,
                "num_samples": seqs,
                "kv_tokens": kv,
                "prefix_tokens": held,
                "duration_ms": ms - 2.0,  # the scheduler's 2 ms before each batch
                "gap_ms": 2.0,
            }
        )
    steps = tmp_path / "steps"
    steps.mkdir()
    pd.DataFrame(rows).to_parquet(steps / "hf_fcfs_1_0.parquet")  # another engine's: not read
    half = MIN_LOG_STEPS // 2
    pd.DataFrame(rows[:half]).to_parquet(steps / "sglang_native_1_0.parquet")
    lone = {"coefficients": {"intercept": 0.1}, "source": "lone"}
    # too few steps: the lone fit stays
    assert step_log_fit(collect_step_logs(tmp_path), "sglang", lone, iterations=True) is None
    pd.DataFrame(rows[half:]).to_parquet(steps / "sglang_superinfer_1_0.parquet")
    fit = step_log_fit(collect_step_logs(tmp_path), "sglang", lone, iterations=True)
    assert fit is not None and fit["lone"] == lone
    assert fit["fit"]["num_samples"] == MIN_LOG_STEPS
    assert fit["source"].startswith(f"the sglang runs' own step logs: {MIN_LOG_STEPS} steps of 2")
    got = HFCPUStepTime.from_dict(fit["coefficients"]).coefficients
    assert got == pytest.approx(true.coefficients, rel=1e-6, abs=1e-12)
    # hf's steps are fitted as logged (no scheduler gap added): the intercept is 2 ms less
    hf = step_log_fit(collect_step_logs(tmp_path), "hf", lone, iterations=False)
    assert hf is not None and hf["fit"]["num_samples"] == MIN_LOG_STEPS
    assert hf["source"] == (
        f"the hf runs' own step logs: {MIN_LOG_STEPS} steps of 1 runs, each engine step as "
        "logged (calibrate --engine hf --steps)"
    )
    want = (true.coefficients[0] - 0.002, *true.coefficients[1:])
    got = HFCPUStepTime.from_dict(hf["coefficients"]).coefficients
    assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert hf["kv_spill"] == {} and set(hf["spread"]["ratio_measured_over_predicted"]) == {
        "decode",
        "prefill",
    }


def test_policy_opts_reach_superinfer_on_every_engine_of_the_suite(tmp_path, monkeypatch) -> None:
    from superinfer.harness import suites_engines

    seen: list[BenchConfig] = []

    def fake_run_engines(config: BenchConfig, opts, work, progress=None):  # noqa: ANN001
        seen.append(config)
        raise UserError("stop here")

    monkeypatch.setattr(suites_engines, "run_engines", fake_run_engines)
    cfg = BenchConfig(policy_opts=("superinfer.tpot_plan_share=0.9",))
    with pytest.raises(UserError, match="stop here"):
        suites_engines.run_engines_suite(cfg, tmp_path)
    assert seen[0].policy_opts == ()
    assert seen[0].policy_options == {"superinfer": {"tpot_plan_share": "0.9"}}
    with pytest.raises(UserError, match="has no option 'no_such'"):
        suites_engines.run_engines_suite(
            BenchConfig(policy_opts=("superinfer.no_such=1",)), tmp_path
        )
    # a bad value is refused before anything runs, as one line naming the option
    with pytest.raises(UserError, match="tpot_plan_share must be in"):
        suites_engines.run_engines_suite(
            BenchConfig(policy_opts=("superinfer.tpot_plan_share=1.5",)), tmp_path
        )
    assert len(seen) == 1
    # options the caller set already are kept under --policy-opt's
    both = BenchConfig(
        policy_opts=("superinfer.tpot_plan_share=0.8",),
        policy_options={"superinfer": {"num_tiers": "3"}, "fcfs": {}},
    )
    with pytest.raises(UserError, match="stop here"):
        suites_engines.run_engines_suite(both, tmp_path)
    assert seen[1].policy_options == {
        "superinfer": {"num_tiers": "3", "tpot_plan_share": "0.8"},
        "fcfs": {},
    }
    # SGLang's superinfer server: the plugin's own options, then --policy-opt over them
    assert suites_engines._plugin_opts("superinfer", {"min_prefill_tokens": "64"}) == {
        "min_prefill_tokens": "64",
        "max_preemptions_per_step": "0",
        "ttft_seat_reserve": "2",
        "serial_whole_prefills": "true",
        "ttft_boost_unmixed": "true",
    }
    assert suites_engines._plugin_opts("native", {"min_prefill_tokens": "64"}) == {}


def _spy_on_run_bench(monkeypatch) -> list[BenchConfig]:  # noqa: ANN001
    """The configs the suite's simulated rows run with (``run_bench`` still runs them)."""
    from superinfer.harness import suites_engines

    seen: list[BenchConfig] = []
    real_run_bench = suites_engines.run_bench

    def spy(cfg: BenchConfig, workload: object):  # noqa: ANN202
        seen.append(cfg)
        return real_run_bench(cfg, workload=workload)

    monkeypatch.setattr(suites_engines, "run_bench", spy)
    return seen


def _sim_hf_only(repeats: int) -> SuiteOptions:
    """The suite with ``sim:hf-cpu`` alone at 0.2 req/s, 15 s windows, on the committed fit."""
    return suite_options(
        {
            "suite.engines": "sim:hf-cpu",
            "suite.loads.hf": "0.2",
            "suite.duration_s": "15",
            "suite.repeats": str(repeats),
            "suite.hf_step_time_file": "results/hf/step_time_fit.json",
        }
    )


def test_policy_options_reach_the_simulated_superinfer_rows(tmp_path, monkeypatch) -> None:
    seen = _spy_on_run_bench(monkeypatch)
    opts = _sim_hf_only(repeats=1)
    run_engines(BenchConfig(seed=0), opts, tmp_path)
    # superinfer's options on the real hf engine (HF_SUPERINFER_OPTS), then --policy-opt's
    hf = {"prefill_floor_yields": "true", "min_prefill_budget_share": "0.5"}
    config = BenchConfig(seed=0, policy_options={"superinfer": {"tpot_plan_share": "0.8"}})
    run_engines(config, opts, tmp_path)
    assert [c.policy_options for c in seen] == [
        {"superinfer": {**hf, "tpot_plan_share": share}} for share in ("0.9", "0.8")
    ]


def test_each_repeat_of_the_simulated_rows_draws_its_spread_with_seed_plus_repeat(
    tmp_path, monkeypatch
) -> None:
    seen = _spy_on_run_bench(monkeypatch)
    opts = _sim_hf_only(repeats=3)
    run_engines(BenchConfig(seed=5), opts, tmp_path)
    assert [c.engine_options["step_spread_seed"] for c in seen] == ["5", "6", "7"]
    assert {c.engine_options["step_time_file"] for c in seen} == {"results/hf/step_time_fit.json"}


def test_the_request_path_is_what_the_lone_ttfts_leave_outside_the_servers_prefills() -> None:
    from superinfer.harness.suites_engines_knee import request_path_ms

    def step(kind: str, tokens: int, prefix: int, ms: float, gap: float) -> dict[str, object]:
        return {"kind": kind, "num_prefill_tokens": tokens, "prefix_tokens": prefix,
                "duration_ms": ms, "gap_ms": gap}  # fmt: skip

    rows = [
        step("prefill", 6, 0, 50.0, float("nan")),  # the server's warm-up: no lone length
        step("decode", 0, 0, 40.0, 1.0),
        step("prefill", 160, 0, 80.0, 900.0),  # chat-0
        step("decode", 0, 0, 45.0, 1.0),
        step("prefill", 512, 0, 200.0, 500.0),  # batch-0: its two chunks, the second
        step("prefill", 388, 512, 190.0, 1.5),  # holding the first as its prefix
        step("decode", 0, 0, 50.0, 1.0),
        step("prefill", 64, 0, 30.0, 800.0),  # a request of no lone length: passed over
        step("prefill", 160, 0, 83.0, 2.0),  # chat-1: no prefix, so not a chunk of the 64
        step("decode", 0, 0, 45.0, 1.0),
        step("prefill", 160, 0, 81.0, 700.0),  # chat-2, which the client saw fail
    ]
    lone = pd.DataFrame(
        {
            "arrival_s": [1.0, 6.0, 11.0, 16.0],
            "prompt_tokens": [160, 900, 160, 160],
            "status": ["finished", "finished", "finished", "failed"],
            "ttft_ms": [92.0, 405.5, 94.0, float("nan")],
        }
    )
    # chat-0 92 - 80 = 12; batch-0 405.5 - (200 + 1.5 + 190) = 14; chat-1 94 - 83 = 11; chat-2
    # ran (its run pairs with it) but did not finish: not counted
    assert request_path_ms(lone, pd.DataFrame(rows)) == 12.0
    # a run missing (chat-1's prompt a prefix hit, say): pairing would shift, so no estimate
    assert request_path_ms(lone, pd.DataFrame(rows[:8] + rows[9:])) is None
    # a NaN inside a run (its gap) drops that request only: (12 + 11) / 2
    holed = [*rows[:5], step("prefill", 388, 512, 190.0, float("nan")), *rows[6:]]
    assert request_path_ms(lone, pd.DataFrame(holed)) == 11.5
    early = lone.assign(ttft_ms=[70.0, 300.0, 60.0, float("nan")])
    assert request_path_ms(early, pd.DataFrame(rows)) == 0.0  # steps took longer: floored


def test_sim_sglang_cpu_follows_the_servers_mixed_chunk_flag_only() -> None:
    assert sim_sglang_limits("") == SIM_SGLANG_LIMITS
    assert sim_sglang_limits("--enable-mixed-chunk --log-level info") == {
        **SIM_SGLANG_LIMITS, "mixed_batches": "1",
    }  # fmt: skip
    assert sim_sglang_limits("--enable-mixed-chunk-size 2") == SIM_SGLANG_LIMITS
    assert sim_sglang_limits("", extend_rows=1) == {**SIM_SGLANG_LIMITS, "extend_decodes": "0"}
    assert suite_options({"suite.sglang_extend_rows": "1"}).sglang_extend_rows == 1
    assert suite_options({"suite.sglang_extend_rows": "0"}).sglang_extend_rows == 0
    with pytest.raises(UserError, match="suite.sglang_extend_rows='2': must be 0 or 1"):
        suite_options({"suite.sglang_extend_rows": "2"})


def test_the_manifest_keeps_the_sglang_servers_cpu_recipe_line() -> None:
    from types import SimpleNamespace

    from superinfer.harness import suites_engines

    line = "superinfer: no CUDA GPU here: SGLang CPU recipe (... --dtype float32)"
    handles = {
        "native": {"url": "u", "server": SimpleNamespace(recipe_line=line)},
        "superinfer": {"url": "v", "server": SimpleNamespace(recipe_line="other")},
    }
    assert suites_engines._recipe_line(handles) == line
    assert suites_engines._recipe_line({"native": {"url": "u"}}) is None  # hf, llama.cpp
    gpu = {"native": {"url": "u", "server": SimpleNamespace(recipe_line=None)}}
    assert suites_engines._recipe_line(gpu) is None
