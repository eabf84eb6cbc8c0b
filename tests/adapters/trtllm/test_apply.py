"""Decisions to engine terms: scheduler plans, retention configs, precision pools (exact)."""

from __future__ import annotations

from collections import namedtuple
from datetime import timedelta
from types import ModuleType, SimpleNamespace

import pytest

from superinfer.adapters.trtllm.apply import (
    RetentionMapping,
    RetentionRange,
    choose_pool,
    kv_precision_of_dtype,
    merge_output,
    plan_step,
    retention_config,
    retention_ranges,
)
from superinfer.policy_core.types import KVPrecision, Placement, PreemptMode, ScheduleDecision

Out = namedtuple(
    "Out",
    [
        "context_requests",
        "generation_requests",
        "paused_requests",
        "fitting_disagg_gen_init_requests",
        "num_fitting_requests",
    ],
)


def _req(rid: int) -> SimpleNamespace:
    return SimpleNamespace(py_request_id=rid)


def test_plan_orders_by_the_decision_and_withholds_unadmitted_waiting() -> None:
    r1, r2, r3, w4, w5, w6, dummy = (_req(i) for i in (1, 2, 3, 4, 5, 6, 99))
    running = {"1": r1, "2": r2, "3": r3}
    waiting = {"4": w4, "5": w5, "6": w6}
    decision = ScheduleDecision(
        num_tokens={"3": 1, "5": 16, "1": 1},
        admit=("5", "6"),
        preempt={"2": PreemptMode.RECOMPUTE},
        reject={"4": "slo_unreachable"},
    )
    plan = plan_step(decision, running, waiting, [dummy])
    # decision order, the admitted-without-tokens one, the unviewed, and last the preempted one
    assert plan.ordered == (r3, w5, r1, w6, dummy, r2)
    assert plan.preempted == (r2,)
    assert plan.rejected == ((w4, "slo_unreachable"),)
    assert plan.skip_decode == frozenset()


def test_running_requests_without_tokens_stay_visible_but_skip_their_decode() -> None:
    r1, r2 = _req(1), _req(2)
    plan = plan_step(ScheduleDecision(num_tokens={"2": 1}), {"1": r1, "2": r2}, {}, [])
    assert plan.ordered == (r2, r1), "never hidden from the inner capacity scheduler"
    assert plan.skip_decode == frozenset({1})
    out = merge_output(Out([], [r2, r1], [], [], 2), plan)
    assert out.generation_requests == [r2]
    assert out.num_fitting_requests == 2


def test_merge_moves_preempted_requests_to_paused_once() -> None:
    r1, r2, r3, r4 = _req(1), _req(2), _req(3), _req(4)
    plan = plan_step(
        ScheduleDecision(
            num_tokens={"1": 1}, preempt={"3": PreemptMode.RECOMPUTE, "4": PreemptMode.RECOMPUTE}
        ),
        {"1": r1, "2": r2, "3": r3, "4": r4},
        {},
        [],
    )
    assert plan.ordered == (r1, r2, r3, r4)
    # the inner paused 2 (its own choice) and 4 (one of ours), and scheduled 3's decode
    out = merge_output(Out([], [r1, r3], [r2, r4], [], 2), plan)
    assert out.generation_requests == [r1]
    assert out.paused_requests == [r2, r4, r3]


def test_retention_ranges_merge_equal_neighbours_and_skip_keep() -> None:
    m = RetentionMapping(pin_priority=90, pin_duration_ms=60_000.0)
    placements = [
        Placement.PIN,
        Placement.PIN,
        Placement.KEEP,
        Placement.OFFLOAD,
        Placement.DROP,
        Placement.DROP,
    ]
    assert retention_ranges(placements, 32, m) == (
        RetentionRange(0, 64, 90, 60_000.0),
        RetentionRange(96, 128, 35),
        RetentionRange(128, 192, 1),
    )
    assert retention_ranges([Placement.KEEP] * 3, 32, m) == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"drop_priority": 30}, "drop_priority must be < 30"),
        ({"offload_priority": 29}, "offload_priority must be >= 30"),
        ({"pin_priority": 101}, r"must be in \[0, 100\]"),
        ({"pin_priority": 40, "offload_priority": 50}, "pin_priority must be >= offload"),
        ({"pin_duration_ms": 0.0}, "pin_duration_ms must be > 0"),
    ],
)
def test_retention_mapping_refuses_settings_that_change_the_meaning(
    kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        RetentionMapping(**kwargs)  # type: ignore[arg-type]


def test_retention_config_builds_the_engine_class(trtllm12: ModuleType) -> None:
    from tensorrt_llm.llmapi import KvCacheRetentionConfig

    ranges = (RetentionRange(0, 64, 100, 1500.0), RetentionRange(64, 96, 1))
    cfg = retention_config(ranges, KvCacheRetentionConfig)
    rng = KvCacheRetentionConfig.TokenRangeRetentionConfig
    assert cfg.token_range_retention_configs == [
        rng(0, 64, 100, timedelta(milliseconds=1500)),
        rng(64, 96, 1, None),
    ]
    assert cfg.decode_retention_priority == 35
    assert retention_config((), KvCacheRetentionConfig) is None


@pytest.mark.parametrize(
    ("requested", "available", "chosen"),
    [
        (KVPrecision.FP8, {KVPrecision.FP8, KVPrecision.FP16}, KVPrecision.FP8),
        (KVPrecision.INT4, {KVPrecision.FP8, KVPrecision.FP16}, KVPrecision.FP8),
        (KVPrecision.INT8, {KVPrecision.FP8, KVPrecision.FP16}, KVPrecision.FP8),
        (KVPrecision.FP8, {KVPrecision.FP16}, KVPrecision.FP16),
        (KVPrecision.FP16, {KVPrecision.FP8}, KVPrecision.FP8),
    ],
)
def test_pool_choice_rounds_precision_up(
    requested: KVPrecision, available: set[KVPrecision], chosen: KVPrecision
) -> None:
    assert choose_pool(requested, available) is chosen


def test_kv_dtype_names() -> None:
    assert kv_precision_of_dtype("fp8") is KVPrecision.FP8
    assert kv_precision_of_dtype("auto") is KVPrecision.FP16
    assert kv_precision_of_dtype("BF16") is KVPrecision.FP16
    with pytest.raises(ValueError, match="KvCacheConfig.dtype='nvfp4': expected one of"):
        kv_precision_of_dtype("nvfp4")
    with pytest.raises(ValueError, match="no KV precision pool"):
        choose_pool(KVPrecision.FP8, set())
