"""QuantPlanner: exact precisions from pressure, floors and hysteresis; the pluggy plugin."""

from __future__ import annotations

from dataclasses import replace

import pytest

from superinfer.adapters.kv_precision import register_quant_planner
from superinfer.adapters.manager import build_plugin_manager
from superinfer.policy_core.quant_planner import QuantPlanner, parse_floors
from superinfer.policy_core.types import SLO, KVPrecision
from tests.factories import BATCH, CHAT, make_state, make_view

FP16, INT8, INT4 = KVPrecision.FP16, KVPrecision.INT8, KVPrecision.INT4
BULK = SLO("bulk", deadline_s=3600.0, priority=2)


def _state(used: int, total: int = 100, **kwargs):  # noqa: ANN202
    return make_state(free_blocks=total - used, total_blocks=total, **kwargs)


def _plan(planner: QuantPlanner, used: int, slo: SLO = BATCH) -> KVPrecision:
    return planner.plan(make_view("r", slo=slo), _state(used))


def test_precision_steps_down_the_ladder_with_pressure_but_not_below_the_floor() -> None:
    planner = QuantPlanner()
    assert [_plan(planner, 50), _plan(planner, 50, CHAT)] == [FP16, FP16]
    assert [_plan(planner, 70), _plan(planner, 70, CHAT)] == [INT8, INT8]
    assert [_plan(planner, 85), _plan(planner, 85, CHAT)] == [INT4, INT8]
    assert _plan(planner, 99, BULK) == INT4  # classes not named get default_floor (int4)


def test_hysteresis_leaves_a_level_only_well_below_its_threshold() -> None:
    planner = QuantPlanner(int8_pressure=0.7, int4_pressure=0.85, hysteresis=0.1)
    seen = [_plan(planner, used) for used in (90, 80, 76, 75, 74, 61, 60, 59, 65, 70)]
    # 90: straight to int4; stays int4 down to 0.75 (0.85 - 0.1); int8 down to 0.60; fp16 below;
    # back to int8 only at 0.70.
    assert seen == [INT4, INT4, INT4, INT4, INT8, INT8, INT8, FP16, FP16, INT8]


def test_pressure_counts_waiting_prompts_and_swapped_kv() -> None:
    waiting = [make_view("w1", prompt=160), make_view("w2", prompt=40)]  # 10 + 3 blocks of 16
    swapped = [make_view("s", computed=64, blocks=4)]
    state = replace(
        make_state(free_blocks=50, total_blocks=100, waiting=waiting), swapped=tuple(swapped)
    )
    assert QuantPlanner().pressure(state) == pytest.approx((50 + 13 + 4) / 100)
    assert QuantPlanner(count_waiting=False).pressure(state) == 0.5


def test_floors_from_a_string_and_bad_configs() -> None:
    assert parse_floors("chat=int8, batch = fp16") == {"chat": INT8, "batch": FP16}
    planner = QuantPlanner(floors="batch=fp16")
    assert _plan(planner, 99) == FP16
    assert _plan(planner, 99, CHAT) == INT4  # chat is not named: default floor
    with pytest.raises(ValueError, match="unknown precision 'int2'"):
        parse_floors("chat=int2")
    with pytest.raises(ValueError, match="not class=precision"):
        parse_floors("chat")
    with pytest.raises(ValueError, match="int8_pressure < int4_pressure"):
        QuantPlanner(int8_pressure=0.9, int4_pressure=0.8)
    with pytest.raises(ValueError, match="hysteresis"):
        QuantPlanner(hysteresis=0.8)
    with pytest.raises(ValueError, match="must be fp16, int8 or int4"):
        QuantPlanner(floors={"chat": KVPrecision.FP8})


def test_plugin_answers_the_kv_precision_hook() -> None:
    pm = build_plugin_manager("fcfs")
    plugin = register_quant_planner(pm)
    state = _state(90)
    assert pm.hook.superinfer_kv_precision(request=make_view("a", slo=CHAT), state=state) == INT8
    assert pm.hook.superinfer_kv_precision(request=make_view("b", slo=BATCH), state=state) == INT4
    assert plugin.planner.level == 2
