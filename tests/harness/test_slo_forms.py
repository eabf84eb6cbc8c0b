"""SLO forms and feasibility: exact arithmetic on hand-made requests (issue 18)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd
import pytest

from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.engines.isolated import (
    IsolatedLatency,
    engine_isolated_latency,
    engine_slos,
    feasibility_info,
    mark_feasible,
)
from superinfer.harness.engines.sim import run_sim_cell
from superinfer.harness.errors import UserError
from superinfer.harness.report.metrics import summarize
from superinfer.harness.report.notes import feasibility_lines
from superinfer.harness.workload.workload import CHAT_SLO, Workload
from superinfer.policy_core.slo_forms import for_request, infeasible_reason
from superinfer.policy_core.types import SLO
from superinfer.sim.request import RequestSpec
from superinfer.sim.step_time import BatchShape


@dataclass(frozen=True)
class LinearStep:
    """1 ms per step plus 1 µs per token; a decode step 10 ms plus 1 µs per KV token read."""

    def step_time_s(self, shape: BatchShape) -> float:
        return 1e-3 + 1e-6 * shape.num_tokens

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        return 10e-3, 1e-6


LAT = IsolatedLatency(LinearStep(), token_budget=2048, source="test")


def test_prompt_scaled_ttft_adds_the_allowance_per_1k_prompt_tokens() -> None:
    slo = SLO("chat", ttft_ms=1000.0, tpot_ms=100.0, ttft_ms_per_1k_prompt=250.0)
    got = for_request(slo, 4000)
    assert (got.ttft_ms, got.tpot_ms, got.ttft_ms_per_1k_prompt) == (2000.0, 100.0, None)
    assert for_request(slo, 1).ttft_ms == 1000.25
    assert for_request(CHAT_SLO, 4000) is CHAT_SLO  # no form: the class itself


def test_engine_relative_targets_multiply_the_isolated_latency() -> None:
    slo = SLO("chat", ttft_x_isolated=3.0, tpot_x_isolated=2.0, priority=0)
    got = for_request(slo, 500, prefill_ms=400.0, decode_ms=33.5)
    assert (got.name, got.ttft_ms, got.tpot_ms, got.ttft_x_isolated) == ("chat", 1200.0, 67.0, None)
    with pytest.raises(ValueError, match="ttft_x_isolated needs the isolated prefill time"):
        for_request(slo, 500, decode_ms=33.5)


def test_slo_forms_are_validated() -> None:
    with pytest.raises(ValueError, match="ttft_x_isolated replaces ttft_ms"):
        SLO("chat", ttft_ms=1.0, ttft_x_isolated=2.0)
    with pytest.raises(ValueError, match="tpot_x_isolated replaces tpot_ms"):
        SLO("chat", tpot_ms=1.0, tpot_x_isolated=2.0)
    with pytest.raises(ValueError, match="needs ttft_ms"):
        SLO("chat", ttft_ms_per_1k_prompt=2.0)
    with pytest.raises(ValueError, match="ttft_x_isolated must be > 0"):
        SLO("chat", ttft_x_isolated=0.0)


def test_isolated_latency_of_a_hand_made_step_model() -> None:
    # 5000 tokens in chunks of 2048, 2048, 904: 3 steps x 1 ms + 5000 tokens x 1 µs
    assert LAT.prefill_ms(5000) == pytest.approx(8.0, abs=1e-12)
    assert LAT.prefill_ms(2048) == pytest.approx(1 + 2.048, abs=1e-12)
    assert LAT.decode_ms(100) == pytest.approx(10.101, abs=1e-12)  # reads 101 KV tokens
    # decode steps read 101 .. 120 KV tokens: mean 110.5
    assert LAT.tpot_ms(100, 21) == pytest.approx(10.1105, abs=1e-12)


def test_infeasible_reason_names_the_first_target_an_idle_replica_misses() -> None:
    chat = SLO("chat", ttft_ms=1000.0, tpot_ms=100.0)
    assert infeasible_reason(chat, 50, ttft_ms=1000.0, tpot_ms=100.0) == ""
    assert infeasible_reason(chat, 50, ttft_ms=1100.4, tpot_ms=120.0) == "ttft 1100 > 1000 ms"
    assert infeasible_reason(chat, 50, ttft_ms=900.0, tpot_ms=110.04) == "tpot 110.0 > 100.0 ms"
    assert infeasible_reason(chat, 1, ttft_ms=900.0, tpot_ms=500.0) == ""  # no TPOT for 1 token
    batch = SLO("batch", deadline_s=10.0)
    # 2 s + 99 x 81 ms = 10.019 s
    assert infeasible_reason(batch, 100, ttft_ms=2000.0, tpot_ms=81.0) == "deadline 10.0 > 10.0 s"
    assert infeasible_reason(batch, 100, ttft_ms=2000.0, tpot_ms=80.0) == ""


def _requests() -> tuple[RequestSpec, ...]:
    chat = SLO("chat", ttft_ms=5.0, ttft_ms_per_1k_prompt=1.0)
    rel = SLO("rel", ttft_x_isolated=2.0, tpot_x_isolated=1.0)
    return (
        RequestSpec("a", 0.0, 1000, 10, 10, chat),  # ttft 6 ms; idle 2 ms: feasible
        RequestSpec("b", 0.0, 5000, 10, 10, chat),  # ttft 10 ms; idle 8 ms: feasible
        RequestSpec("c", 0.0, 9000, 10, 10, SLO("chat", ttft_ms=5.0)),  # idle 14 ms: not
        RequestSpec("d", 0.0, 100, 21, 21, rel),  # tpot target 10.101 < idle mean 10.1105
        RequestSpec("e", 0.0, 100, 1, 1, rel),  # one token: no TPOT
    )


def test_engine_slos_resolve_every_form_and_mark_feasibility() -> None:
    wl = Workload("hand", _requests(), (), 1.0, None)
    out = engine_slos(wl, "sim:test", LAT)
    targets = [(r.slo.ttft_ms, r.slo.tpot_ms) for r in out.requests]
    assert targets[0] == (6.0, None) and targets[1] == (10.0, None) and targets[2] == (5.0, None)
    assert targets[3][0] == pytest.approx(2 * (1 + 0.1), abs=1e-12)
    assert targets[3][1] == pytest.approx(10.101, abs=1e-12)
    frame = pd.DataFrame({"request_id": [r.request_id for r in out.requests]})
    marked = mark_feasible(frame, out.requests, LAT)
    assert marked["feasible"].tolist() == [True, True, False, False, True]
    assert marked["infeasible_reason"].tolist() == [
        "",
        "",
        "ttft 14 > 5 ms",
        "tpot 10.1 > 10.1 ms",
        "",
    ]
    assert engine_slos(Workload("plain", (_requests()[2],), (), 1.0, None), "x", None).name == (
        "plain"
    )


def test_engine_relative_slo_on_an_engine_without_calibration_is_one_line() -> None:
    wl = Workload("hand", _requests(), (), 1.0, None)
    with pytest.raises(UserError) as info:
        engine_slos(wl, "http", None)
    assert str(info.value) == (
        "SLO class 'rel' is engine-relative (ttft_x_isolated / tpot_x_isolated) but engine "
        "'http' has no step-time calibration; use absolute targets there"
    )
    assert engine_isolated_latency(BenchConfig(), "http") is None
    assert engine_isolated_latency(BenchConfig(), "sglang") is None


def test_summary_counts_feasible_requests_and_their_attainment() -> None:
    rows = pd.DataFrame(
        {
            "slo_class": ["chat"] * 4,
            "status": ["finished", "finished", "finished", "rejected"],
            "met_slo": [True, False, False, False],
            "feasible": [True, True, False, False],
            "arrival_s": [0.0, 0.0, 0.0, 0.0],
            "finish_s": [1.0, 1.0, 1.0, float("nan")],
            "generated_tokens": [1, 1, 1, 0],
            "num_preemptions": [0, 0, 0, 0],
            **{c: [1.0] * 4 for c in ("ttft_ms", "tpot_ms", "e2e_ms", "prompt_tokens")},
        }
    )
    chat, everything = summarize(rows, engine="e", policy="p", kv_peak_bytes={})
    assert (chat["n_feasible"], chat["slo_attainment_feasible"]) == (2, 0.5)
    assert chat["slo_attainment"] == 0.25
    nothing = summarize(rows.drop(columns="feasible"), engine="e", policy="p", kv_peak_bytes={})
    assert pd.isna(nothing[0]["n_feasible"]) and pd.isna(nothing[0]["slo_attainment_feasible"])


@pytest.mark.parametrize("engine", ["sim:vllm", "sim:sglang", "sim:trtllm"])
def test_isolated_latency_is_what_the_simulator_gives_a_lone_request(engine: str) -> None:
    config = BenchConfig(engines=(engine,), replicas=1)
    lat = engine_isolated_latency(config, engine)
    assert lat is not None
    req = RequestSpec("r", 0.0, 5000, 20, 20, CHAT_SLO)
    cell = run_sim_cell(config, engine, "fcfs", Workload("one", (req,), (), 1.0, None))
    row = cell.requests.iloc[0]
    assert row["ttft_ms"] == pytest.approx(lat.prefill_ms(5000), rel=1e-9)
    assert row["tpot_ms"] == pytest.approx(lat.tpot_ms(5000, 20), rel=1e-9)


def test_the_report_says_how_many_requests_are_infeasible_and_why() -> None:
    out = engine_slos(Workload("hand", _requests(), (), 1.0, None), "sim:test", LAT)
    frame = pd.DataFrame(
        {
            "request_id": [r.request_id for r in out.requests],
            "slo_class": [r.slo.name for r in out.requests],
        }
    )
    info = feasibility_info(mark_feasible(frame, out.requests, LAT), LAT)
    assert info == {
        "source": "test",
        "classes": {
            "chat": {"n": 3, "infeasible": {"ttft": 1}},
            "rel": {"n": 2, "infeasible": {"tpot": 1}},
        },
    }
    lines = feasibility_lines(
        {"feasibility": {"sim:test": info, "http": feasibility_info(frame, None)}}
    )
    assert lines[2:4] == [
        "- Infeasible on an idle replica, `sim:test` (test): chat 1 of 3 (1 miss ttft); rel 1 of 2 "
        "(1 miss tpot).",
        "- Infeasible on an idle replica, `http`: unknown (no step model).",
    ]
    assert feasibility_lines({}) == []


def test_stack_full_turns_on_every_part_an_engine_supports_and_says_why_not() -> None:
    from superinfer.harness.bench import engine_stack
    from superinfer.harness.engines.registry import engine_family

    config = BenchConfig(stack="full", policy_options={"superinfer": {"aging_s": "60"}})
    sim, info = engine_stack(config, engine_family("sim:vllm"))
    assert (sim.kv_policy, sim.kv_quant) == ("reuse", True)
    assert sim.policy_options["superinfer"] == {"aging_s": "60", "rotation": "true"}
    assert info == {"applied": ["rotation", "reuse", "quant"], "not_applied": {}}
    hf, info = engine_stack(config, engine_family("hf"))
    assert (hf.kv_policy, hf.kv_quant, info["applied"]) == (None, False, [])
    assert info["not_applied"]["rotation"] == "needs a CPU KV tier to swap to"
    sglang, info = engine_stack(config, engine_family("sglang"))
    assert (sglang.kv_policy, sglang.kv_quant, info["applied"]) == ("reuse", False, ["reuse"])
    no_tier, info = engine_stack(replace(config, cpu_kv_ratio=0.0), engine_family("sim:vllm"))
    assert info["applied"] == ["reuse", "quant"] and "rotation" not in no_tier.policy_options.get(
        "superinfer", {}
    )
    assert engine_stack(BenchConfig(), engine_family("sim:vllm")) == (BenchConfig(), {})


def test_stack_parts_turn_on_only_the_parts_named() -> None:
    from superinfer.harness.bench import engine_stack
    from superinfer.harness.engines.registry import engine_family, parse_stack, stack_parts
    from superinfer.harness.errors import UserError

    assert parse_stack("quant, rotation") == "rotation,quant"
    assert parse_stack("reuse,quant,rotation") == "full"
    assert (parse_stack(" None "), stack_parts("none"), stack_parts("full")) == (
        "none", (), ("rotation", "reuse", "quant"),
    )  # fmt: skip
    for bad, why in (("rotation,swap", "unknown: swap"), (",", "expected none, full")):
        with pytest.raises(UserError, match=why):
            parse_stack(bad)
    sim, info = engine_stack(BenchConfig(stack="rotation,reuse"), engine_family("sim:vllm"))
    assert (sim.kv_policy, sim.kv_quant) == ("reuse", False)
    assert sim.policy_options["superinfer"] == {"rotation": "true"}
    assert info == {"applied": ["rotation", "reuse"],
                    "not_applied": {"quant": "not asked for (--stack)"}}  # fmt: skip
    sglang, info = engine_stack(BenchConfig(stack="quant"), engine_family("sglang"))
    assert (sglang.kv_policy, sglang.kv_quant, info["applied"]) == (None, False, [])
    assert info["not_applied"] == {
        "rotation": "not asked for (--stack)",
        "reuse": "not asked for (--stack)",
        "quant": "needs per-request KV precision in the engine",
    }


def test_isolated_latency_times_each_decode_step_of_a_spilling_model() -> None:
    """A model that is not linear in the KV (a spill past 1,000 key tokens) is timed step by step:
    a decode past the threshold pays the spill, and TPOT is the mean of the request's steps."""
    from dataclasses import replace

    from superinfer.sim.hf_cpu import HFCPUStepTime, shape_of

    linear = HFCPUStepTime((0.02, 0.004, 0.001, 0.0005, 0.00002, 1e-7, 0.03, 0.0))
    spilling = replace(linear, spill_tokens=1000.0, spill_s_per_token=1e-4)
    lat, lin = IsolatedLatency(spilling, 256, "test"), IsolatedLatency(linear, 256, "test")
    assert lat.decode_ms(998) == pytest.approx(lin.decode_ms(998))  # 999 key tokens: below
    want = (linear.step_time_s(shape_of([(1200, 1, True)])) + 1e-4 * 1201) * 1e3
    assert lat.decode_ms(1200) == pytest.approx(want)
    # prompt 990, 21 output tokens: 20 decode steps reading 991..1010 key tokens, 10 past 1,000
    steps = [lin.decode_ms(c) + (0.1 * (c + 1) if c + 1 > 1000 else 0.0) for c in range(990, 1010)]
    assert lat.tpot_ms(990, 21) == pytest.approx(sum(steps) / 20)
    assert lin.tpot_ms(990, 21) == pytest.approx(
        sum(lin.decode_ms(c) for c in range(990, 1010)) / 20
    )
