"""The engines suite's engine-relative chat TTFT (``suite.chat_ttft_x``, issue 18): each real
engine's target is a multiple of its own lone chat TTFT; its simulated row takes the same."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from superinfer.harness.bench import BenchConfig
from superinfer.harness.errors import UserError
from superinfer.harness.suites_engines_options import (
    SuiteOptions,
    for_engine,
    relative_chat_ttft,
    scaled_chat_ttft,
    suite_options,
)

FIT = "results/hf/step_time_fit.json"
SIM_ONLY = {
    "suite.engines": "sim:hf-cpu",
    "suite.loads.hf": "0.2",
    "suite.duration_s": "10",
    "suite.repeats": "1",
    "suite.hf_step_time_file": FIT,
}


def _lone() -> pd.DataFrame:
    """Lone-pass rows: two lone chats (500 and 560 ms), a failed one, a batch, a batched chat."""
    return pd.DataFrame(
        {
            "slo_class": ["chat", "chat", "chat", "batch", "chat"],
            "status": ["finished", "finished", "failed", "finished", "finished"],
            "ttft_ms": [500.0, 560.0, float("nan"), 2600.0, 90.0],
            "concurrency": [1, 1, 1, 1, 2],
        }
    )


def test_the_relative_target_is_the_default_and_an_absolute_one_replaces_it() -> None:
    assert SuiteOptions().chat_ttft_x == 7.0 and suite_options({}).chat_ttft_x == 7.0
    given = suite_options({"suite.chat_ttft_ms": "3750"})
    assert (given.chat_ttft_ms, given.chat_ttft_x) == (3750.0, 0.0)
    assert suite_options({"suite.chat_ttft_x": "5"}).chat_ttft_x == 5.0
    assert suite_options({"suite.chat_ttft_x": "0"}).chat_ttft_x == 0.0
    # a simulated row alone needs no lone pass (its fit gives the lone TTFT)
    assert suite_options({**SIM_ONLY, "suite.lone": "0"}).lone == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"suite.chat_ttft_ms": "3750", "suite.chat_ttft_x": "7"}, "give one"),
        ({"suite.lone": "0"}, "suite.chat_ttft_x needs the lone pass"),
        ({"suite.chat_ttft_x": "-1"}, r"suite.chat_ttft_x='-1': must be > 0"),
        ({"suite.chat_ttft_x": "x"}, r"suite.chat_ttft_x='x': not a number"),
    ],
)
def test_bad_relative_targets_are_one_line_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        suite_options(options)


def test_relative_target_from_the_lone_chats_exact() -> None:
    got = relative_chat_ttft(_lone(), SuiteOptions(), "sglang")
    # median of the lone chats that finished, 530 ms; 7 x 530 = 3,710 ms
    assert got == {
        "chat_ttft_ms": 3710.0,
        "chat_ttft_source": "7 x 530 ms, the lone chat TTFT p50 of 2 requests of 160 prompt tokens",
    }
    assert scaled_chat_ttft(SuiteOptions(chat_ttft_x=2.5), 101.0, "w")["chat_ttft_ms"] == 250.0
    assert scaled_chat_ttft(SuiteOptions(), 0.4, "w")["chat_ttft_ms"] == 10.0  # at least 10 ms
    with pytest.raises(UserError, match="hf: no lone chat request finished"):
        relative_chat_ttft(_lone().iloc[2:4], SuiteOptions(), "hf")


def test_for_engine_gives_a_sim_row_its_real_engines_target() -> None:
    engines = {"sglang": {"chat_ttft_ms": 3710.0}}
    opts = SuiteOptions()
    assert for_engine(opts, engines, "sglang").chat_ttft_ms == 3710.0
    assert for_engine(opts, engines, "sim:sglang-cpu").slos()[0].ttft_ms == 3710.0
    absolute = SuiteOptions(chat_ttft_x=0.0, chat_ttft_ms=1500.0)
    assert for_engine(absolute, engines, "sglang") is absolute
    with pytest.raises(UserError, match="sim:hf-cpu: no chat TTFT target of hf's lone pass"):
        for_engine(opts, engines, "sim:hf-cpu")


def test_a_real_engine_runs_at_its_own_target_after_its_lone_pass(tmp_path, monkeypatch) -> None:
    from superinfer.harness import suites_engines

    seen: list[tuple[str, float | None]] = []

    def fake_run_cell(config, engine, policy, wl, handle, opts, steps_to=None):  # noqa: ANN001, ANN202
        seen.append((wl.name, wl.requests[0].slo.ttft_ms))
        summary = pd.DataFrame({"engine": [engine], "policy": [policy], "slo_class": ["chat"]})
        return summary, _lone().iloc[:4].assign(engine=engine, policy=policy), {}

    monkeypatch.setattr(suites_engines, "_run_cell", fake_run_cell)
    opts = suite_options(
        {"suite.engines": "hf", "suite.loads.hf": "0.3", "suite.repeats": "1",
         "suite.duration_s": "20"}
    )  # fmt: skip
    info: dict = {"engines": {}, "runs": {}}
    frames: list[pd.DataFrame] = []
    suites_engines._real_engine(
        BenchConfig(), "hf", opts, tmp_path, [], {}, {}, info, lambda _m: None, frames, []
    )
    # the lone pass without a TTFT target (it makes it), then every run at 7 x its 530 ms
    assert seen == [("engines-lone", None)] + [("engines-mix", 3710.0)] * 3
    assert info["engines"]["hf"]["chat_ttft_ms"] == 3710.0
    assert len(frames) == 3


def test_a_sim_row_alone_takes_its_fits_lone_prefill_and_a_replay_keeps_it(tmp_path) -> None:
    from superinfer.harness.engines.isolated import engine_isolated_latency
    from superinfer.harness.suites_engines import run_engines
    from superinfer.harness.suites_engines_replay import resimulate

    opts = suite_options(SIM_ONLY)
    res = run_engines(BenchConfig(seed=2), opts, tmp_path / "work")
    cfg = BenchConfig(engine_options={"step_time_file": FIT})
    lone = engine_isolated_latency(cfg, "sim:hf-cpu").prefill_ms(160)  # type: ignore[union-attr]
    facts = res.info["engines"]["sim:hf-cpu"]
    assert facts["chat_ttft_ms"] == round(7 * lone / 10) * 10
    assert facts["chat_ttft_source"].endswith(
        "the sim:hf-cpu step-time fit's lone prefill of 160 tokens"
    )
    chats = res.requests[res.requests["slo_class"] == "chat"]
    assert set(chats["slo_ttft_ms"]) == {facts["chat_ttft_ms"]}
    # the run folder replays with the same target; a manifest from before the option (no
    # chat_ttft_x) replays its absolute chat_ttft_ms
    res.summary.assign(engine="hf").to_csv(tmp_path / "summary.csv", index=False)
    (tmp_path / "hf_step_time.json").write_text(Path(FIT).read_text())
    # superinfer's options on hf, as recorded
    ran = {
        "hf": {
            "tpot_plan_share": "0.9",
            "prefill_floor_yields": "true",
            "min_prefill_budget_share": "0.5",
        }
    }
    manifest = {
        "seed": 2,
        "options": dataclasses.asdict(opts),
        "engines": res.info["engines"],
        "superinfer_options": ran,
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    got = resimulate(tmp_path, "sim:hf-cpu")
    pd.testing.assert_frame_equal(
        got[got["engine"] == "sim:hf-cpu"].reset_index(drop=True), res.summary, check_dtype=False
    )
    old = {k: v for k, v in dataclasses.asdict(opts).items() if k != "chat_ttft_x"}
    (tmp_path / "manifest.json").write_text(
        json.dumps({"seed": 2, "options": old, "superinfer_options": ran})
    )
    absolute = run_engines(
        BenchConfig(seed=2), suite_options({**SIM_ONLY, "suite.chat_ttft_ms": "1500"}), tmp_path
    ).summary
    got = resimulate(tmp_path, "sim:hf-cpu")
    pd.testing.assert_frame_equal(
        got[got["engine"] == "sim:hf-cpu"].reset_index(drop=True), absolute, check_dtype=False
    )


def test_the_report_states_each_engines_target() -> None:
    from superinfer.harness.suites_engines_report import _chat_ttft

    absolute = {"options": {"chat_ttft_x": 0.0, "chat_ttft_ms": 3750.0}}
    assert _chat_ttft(absolute) == "3750 ms on every engine"
    assert _chat_ttft({"options": {"chat_ttft_ms": 1500.0}}) == "1500 ms on every engine"
    own = {
        "options": {"chat_ttft_x": 7.0, "chat_ttft_ms": 1500.0},
        "engines": {"sglang": {"chat_ttft_ms": 3710.0, "chat_ttft_source": "7 x 530 ms, s"},
                    "sim:sglang-cpu": {"coefficients": {}}},
    }  # fmt: skip
    assert _chat_ttft(own) == (
        "7x each engine's own lone chat TTFT (`sglang` 3,710 ms = 7 x 530 ms, s; a sim row: "
        "its real engine's)"
    )


def test_the_lone_chats_have_no_ttft_target_when_they_make_it() -> None:
    from superinfer.harness.suites_engines_workload import lone_workload

    def targets(options: dict[str, str]) -> set[tuple[str, float | None, float | None]]:
        wl = lone_workload(suite_options(options), 5.0)
        return {(s.slo.name, s.slo.ttft_ms, s.slo.tpot_ms) for s in wl.requests}

    assert targets({}) == {("chat", None, 500.0), ("batch", None, None)}
    absolute = {"suite.chat_ttft_ms": "3750"}
    assert targets(absolute) == {("chat", 3750.0, 500.0), ("batch", None, None)}


def test_a_real_engine_that_failed_before_its_lone_pass_leaves_its_sim_row_the_fits_target(
    tmp_path, monkeypatch
) -> None:
    from superinfer.harness import suites_engines

    def failing(config, engine, opts, work_dir, lones, batched, found, info, *rest):  # noqa: ANN001, ANN202
        info["engines"][engine] = {"startup_s": 1.0}  # started, then failed
        raise UserError(f"{engine}: server died")

    monkeypatch.setattr(suites_engines, "_real_engine", failing)
    opts = suite_options({**SIM_ONLY, "suite.engines": "hf,sim:hf-cpu"})
    res = suites_engines.run_engines(BenchConfig(seed=2), opts, tmp_path)
    assert res.info["failed"] == {"hf": "hf: server died"}
    alone = suites_engines.run_engines(BenchConfig(seed=2), suite_options(SIM_ONLY), tmp_path)
    facts = alone.info["engines"]["sim:hf-cpu"]
    assert res.info["engines"]["sim:hf-cpu"] == facts  # the fit's target, as a sim row alone
    pd.testing.assert_frame_equal(res.summary, alone.summary)
