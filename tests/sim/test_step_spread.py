"""Step-time spread (``sim/step_spread.py``): its quantiles, its draws, the simulator's use."""

from __future__ import annotations

import random

import pytest

from superinfer.adapters.manager import build_plugin_manager
from superinfer.policy_core.types import SLO
from superinfer.sim.config import SimConfig
from superinfer.sim.engine import Simulator
from superinfer.sim.hf_cpu import HOST_CPU, SIM_HF_CPU, SMOLLM2_135M, HFCPUStepTime, shape_of
from superinfer.sim.request import RequestSpec
from superinfer.sim.step_spread import SpreadStepTime, StepSpread, kind_of

MODEL = HFCPUStepTime((0.02, 0.004, 0.001, 0.0005, 0.00002, 1e-7, 0.03, 0.0003))
#: decode steps scatter 1-5x evenly; prefill steps 2x; no mixed quantiles (they fall back)
SPREAD = StepSpread({"decode": (1.0, 2.0, 3.0, 4.0, 5.0), "prefill": (2.0,) * 5})


def test_kind_of_a_step() -> None:
    assert kind_of(shape_of([(10, 1, True), (20, 1, True)])) == "decode"
    assert kind_of(shape_of([(0, 64, True)])) == "prefill"
    assert kind_of(shape_of([(0, 64, True), (20, 1, True)])) == "mixed"


def test_fit_keeps_each_kinds_quantiles_at_the_midpoints() -> None:
    kinds = ["decode"] * 5 + ["mixed"] * 3
    ratios = [5.0, 1.0, 3.0, 2.0, 4.0, 0.9, 1.1, 1.0]
    spread = StepSpread.fit(kinds, ratios, points=5)  # at 0.1, 0.3, 0.5, 0.7, 0.9
    assert spread.ratios["decode"] == pytest.approx((1.4, 2.2, 3.0, 3.8, 4.6))
    assert spread.ratios["mixed"] == pytest.approx((0.92, 0.96, 1.0, 1.04, 1.08))
    assert sorted(spread.ratios) == ["decode", "mixed"] and spread.points == 5
    assert spread.table("prefill") == spread.ratios["decode"]  # no prefill step: decode's
    with pytest.raises(ValueError, match="unknown step kind 'extend'"):
        StepSpread.fit(["extend"], [1.0])
    with pytest.raises(ValueError, match="must be > 0"):
        StepSpread.fit(["decode"], [0.0])
    with pytest.raises(ValueError, match="one kind per ratio"):
        StepSpread.fit(["decode"], [1.0, 2.0])


def test_a_draw_picks_one_equally_likely_quantile_and_mean_averages_them() -> None:
    assert SPREAD.ratio("decode", 0.0) == 1.0
    assert SPREAD.ratio("decode", 0.199) == 1.0
    assert SPREAD.ratio("decode", 0.2) == 2.0
    assert SPREAD.ratio("decode", 0.999) == 5.0
    assert SPREAD.ratio("mixed", 0.6) == 4.0  # decode's table
    assert SPREAD.ratio("prefill", 0.6) == 2.0
    assert SPREAD.mean("decode") == 3.0 and SPREAD.mean("prefill") == 2.0


def test_bad_tables_are_rejected_with_the_reason() -> None:
    with pytest.raises(ValueError, match="at least one step kind"):
        StepSpread({})
    with pytest.raises(ValueError, match="the same number"):
        StepSpread({"decode": (1.0, 1.0), "mixed": (1.0,)})
    with pytest.raises(ValueError, match="spread kind 'extend'"):
        StepSpread({"extend": (1.0, 1.0)})
    with pytest.raises(ValueError, match="non-decreasing"):
        StepSpread({"decode": (2.0, 1.0)})
    with pytest.raises(ValueError, match="must be finite"):
        StepSpread({"decode": (1.0, float("inf"))})
    with pytest.raises(ValueError, match="must map each step kind to a list of numbers"):
        StepSpread.from_dict({"ratio_measured_over_predicted": {"decode": [1.0, "x"]}})
    with pytest.raises(ValueError, match="must map each step kind to a list of numbers"):
        StepSpread.from_dict({"ratio_measured_over_predicted": [1.0]})
    with pytest.raises(ValueError, match="spread lacks 'ratio_measured_over_predicted'"):
        StepSpread.from_dict({"quantiles_at": "(i + 0.5) / n"})
    assert StepSpread.from_dict(SPREAD.to_dict()) == SPREAD


def test_each_step_is_scaled_by_a_seeded_draw_of_its_kind() -> None:
    decode, prefill = shape_of([(40, 1, True)]), shape_of([(0, 64, True)])
    timed = SpreadStepTime(MODEL, SPREAD, seed=7)
    draws = random.Random(7)
    for shape in (decode, prefill, decode, decode):
        u = draws.random()
        want = MODEL.step_time_s(shape) * SPREAD.ratio(kind_of(shape), u)
        assert timed.step_time_s(shape) == pytest.approx(want, rel=1e-12)
    assert timed.decode_coefficients(3) == MODEL.decode_coefficients(3)
    assert not timed.repeatable


def _finishes(step_time: object, repeat: int = 64) -> list[tuple[float | None, float | None]]:
    slo = SLO("chat")
    reqs = [RequestSpec(f"r{i}", 0.05 * i, 40 + 7 * i, 12, 12, slo) for i in range(4)]
    config = SimConfig(SIM_HF_CPU, SMOLLM2_135M, HOST_CPU, num_gpu_blocks_override=256)
    pm = build_plugin_manager("fcfs", {"max_repeat_steps": str(repeat)})
    result = Simulator(config, pm.hook, step_time=step_time).run(reqs)  # type: ignore[arg-type]
    return [(r.first_token_s, r.finish_s) for r in result.requests]


def test_the_simulator_draws_per_step_deterministically_per_seed() -> None:
    flat = StepSpread({"decode": (1.0, 1.0)})  # every ratio 1: the model's times
    for (f1, e1), (f2, e2) in zip(
        _finishes(SpreadStepTime(MODEL, flat)), _finishes(MODEL), strict=True
    ):
        assert f1 == pytest.approx(f2, rel=1e-9) and e1 == pytest.approx(e2, rel=1e-9)
    scattered = _finishes(SpreadStepTime(MODEL, SPREAD, seed=1))
    assert scattered == _finishes(SpreadStepTime(MODEL, SPREAD, seed=1), repeat=1)
    assert scattered != _finishes(SpreadStepTime(MODEL, SPREAD, seed=2))
    # every step at least as slow (ratios 1-5): every request finishes later
    for (_, slow), (_, fast) in zip(scattered, _finishes(MODEL), strict=True):
        assert slow is not None and fast is not None and slow > fast
