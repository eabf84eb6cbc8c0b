"""The simulated engine: exact single-request timelines, repeat equivalence, invariants."""

from __future__ import annotations

from dataclasses import replace

import pytest

from superinfer.adapters.hookspecs import hookimpl
from superinfer.harness.workload.workload import build_workload
from superinfer.policy_core.types import ScheduleDecision, StepState
from superinfer.policy_core.validation import PolicyError
from superinfer.sim.config import SimConfig
from superinfer.sim.engine_costs import engine_step_time
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.profiles import SIM_VLLM
from superinfer.sim.request import RequestStatus, SimRequest
from superinfer.sim.step_time import BatchShape
from superinfer.sim.steps import emit
from tests.sim.helpers import simulate, spec

#: sim:vllm's own step time (issue 19: the calibrated kernels x its kernel scale + its CPU).
STEP = engine_step_time(SimConfig(SIM_VLLM, get_model("llama-3.1-8b"), get_gpu("a100-80gb")))


def test_one_request_timeline_is_exact() -> None:
    (req,) = simulate([spec("a", 1.0, prompt=100, output=3)])[0].requests
    prefill = STEP.step_time_s(BatchShape(100, 1, 100 * 101 / 2, 100, 0, 1, 100, 100 * 100, 1))
    a, b = STEP.decode_coefficients(1)
    assert req.status is RequestStatus.FINISHED
    assert req.first_token_s == pytest.approx(1.0 + prefill, rel=1e-12)
    # two more tokens: one repeated run of 2 decode steps reading 101 then 102 KV tokens
    assert req.finish_s == pytest.approx(1.0 + prefill + 2 * a + b * (101 + 102), rel=1e-12)
    assert req.generated_tokens == 3 and req.computed_tokens == 102


def test_chunked_prefill_takes_ceil_prompt_over_budget_steps() -> None:
    result, observer = simulate([spec("a", 0.0, prompt=5000, output=1)])
    (req,) = result.requests
    assert observer.steps == 3  # 2048 + 2048 + 904 tokens on A100 (budget 2048)
    assert req.generated_tokens == 1 and req.status is RequestStatus.FINISHED


def _trace_slice(seconds: float = 120.0) -> list:  # type: ignore[type-arg]
    return list(build_workload("azure", duration_s=seconds).requests)


def test_invariants_hold_on_the_real_trace_under_kv_pressure() -> None:
    specs = _trace_slice()
    result, observer = simulate(specs, num_gpu_blocks_override=2000)
    statuses = {r.status for r in result.requests}
    assert statuses == {RequestStatus.FINISHED}
    assert sum(r.num_preemptions for r in result.requests) > 0  # pressure was real
    assert all(r.generated_tokens == r.spec.output_tokens for r in result.requests)
    assert observer.steps == result.num_steps
    assert len(result.requests) == len(specs)


def test_repeated_decode_runs_equal_step_by_step_simulation() -> None:
    specs = _trace_slice(60.0)
    fast, _ = simulate(specs, num_gpu_blocks_override=3000)
    slow, _ = simulate(specs, options={"max_repeat_steps": "1"}, num_gpu_blocks_override=3000)
    assert fast.num_schedule_calls < slow.num_schedule_calls / 3
    assert fast.num_steps == slow.num_steps
    for f, s in zip(fast.requests, slow.requests, strict=True):
        assert (f.generated_tokens, f.num_preemptions) == (s.generated_tokens, s.num_preemptions)
        assert f.first_token_s == pytest.approx(s.first_token_s, rel=1e-9)
        assert f.finish_s == pytest.approx(s.finish_s, rel=1e-9)
        assert f.max_itl_s == pytest.approx(s.max_itl_s, rel=1e-9)


def test_same_input_same_result() -> None:
    specs = _trace_slice(30.0)
    one, _ = simulate(specs)
    two, _ = simulate(specs)
    assert [(r.first_token_s, r.finish_s) for r in one.requests] == [
        (r.first_token_s, r.finish_s) for r in two.requests
    ]


def test_requests_that_can_never_fit_are_rejected_with_a_reason() -> None:
    specs = [spec("small", 0.0, 10, 5), spec("huge", 0.0, 40_000, 10)]
    result, _ = simulate(specs, num_gpu_blocks_override=100)
    by_id = {r.request_id: r for r in result.requests}
    assert by_id["small"].status is RequestStatus.FINISHED
    assert (by_id["huge"].status, by_id["huge"].reason) == (
        RequestStatus.REJECTED,
        "exceeds_kv_capacity",
    )
    result, _ = simulate([spec("long", 0.0, 131_000, 200)])
    assert result.requests[0].reason == "exceeds_max_model_len"


class Idle:
    name = "idle"

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        return ScheduleDecision()


class Greedy:
    name = "greedy"

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        return ScheduleDecision(
            num_tokens={r.request_id: 1 for r in state.waiting},
            admit=tuple(r.request_id for r in state.waiting),
        )


def test_a_policy_that_never_schedules_fails_requests_instead_of_losing_them() -> None:
    result, _ = simulate([spec("a", 0.0, 10, 5), spec("b", 1.0, 10, 5)], policy=Idle())
    assert [(r.status, r.reason) for r in result.requests] == [
        (RequestStatus.FAILED, "stalled"),
        (RequestStatus.FAILED, "stalled"),
    ]


def test_an_invalid_decision_raises() -> None:
    specs = [spec(f"r{i}", 0.0, 16, 5) for i in range(3)]
    with pytest.raises(PolicyError, match="admissions need 3 KV blocks, 2 are free"):
        simulate(specs, policy=Greedy(), num_gpu_blocks_override=2)


def test_horizon_fails_what_is_still_live() -> None:
    result, _ = simulate([spec("a", 0.0, 100, 500), spec("late", 50.0, 10, 5)], horizon_s=2.0)
    assert [(r.status, r.reason) for r in result.requests] == [
        (RequestStatus.FAILED, "simulation_horizon"),
        (RequestStatus.FAILED, "simulation_horizon"),
    ]


def test_token_gaps_add_up_to_each_requests_decode_time() -> None:
    """``record_token_gaps``: one entry per emitting run after the first token; the gaps of a
    request sum to its finish minus its first token, their steps to its tokens after the
    first, and recording changes nothing else."""
    specs = [spec(f"r{i}", 0.05 * i, 300 + 40 * i, 20 + 3 * i) for i in range(12)]
    plain, _ = simulate(specs, options={"max_repeat_steps": "8"})
    kept, _ = simulate(specs, options={"max_repeat_steps": "8"}, record_token_gaps=True)
    assert all(r.token_gaps is None for r in plain.requests)
    for a, b in zip(plain.requests, kept.requests, strict=True):
        assert (a.first_token_s, a.finish_s, a.max_itl_s) == (b.first_token_s, b.finish_s,
                                                              b.max_itl_s)  # fmt: skip
        gaps = b.token_gaps
        assert gaps is not None and sum(k for _, k, _ in gaps) == b.generated_tokens - 1
        total = sum(first + rest for first, _, rest in gaps)
        assert total == pytest.approx(b.finish_s - b.first_token_s, rel=1e-12)
        assert max(first for first, _, _ in gaps) <= b.max_itl_s
    assert any(k > 1 for r in kept.requests for _, k, _ in r.token_gaps or ())


def test_emit_records_the_gap_before_a_run_and_the_runs_other_steps() -> None:
    req = SimRequest(spec("a", 0.0, 10, 6))
    req.token_gaps = []
    emit(req, 10, 1, 0.5, 0.0, 0.5)  # prefill: the first token, no gap
    emit(req, 1, 1, 0.7, 0.0, 0.7)  # one decode step 0.2 s later
    emit(req, 1, 3, 1.0, 0.25, 1.5)  # a run of 3: first step ends at 1.0, the run at 1.5
    assert req.token_gaps == [(0.7 - 0.5, 1, 0.0), (1.0 - 0.7, 3, 0.5)]
    assert req.generated_tokens == 5


def test_a_run_past_a_finish_drops_the_surplus_and_ends_with_its_steps() -> None:
    """``repeat_past_finish`` (vLLM 0.6 multi-step): a run keeps its 8 steps when a sequence
    finishes inside it; that sequence gets exactly its output tokens, at the run's end."""
    specs = [spec("short", 0.0, 64, 3), spec("long", 0.0, 64, 40)]
    opts = {"max_repeat_steps": "8"}
    stop, _ = simulate(specs, options=opts, record_token_gaps=True)
    past, _ = simulate(specs, options=opts, record_token_gaps=True,
                       profile=replace(SIM_VLLM, repeat_past_finish=True))  # fmt: skip
    s_stop, l_stop = stop.requests
    s_past, l_past = past.requests
    assert (s_stop.generated_tokens, s_past.generated_tokens) == (3, 3)
    assert (l_stop.generated_tokens, l_past.generated_tokens) == (40, 40)
    assert [k for _, k, _ in s_stop.token_gaps or ()] == [2]  # a run of 2: ends at the finish
    assert [k for _, k, _ in s_past.token_gaps or ()] == [2]  # 2 of the run's 8 tokens kept
    assert [k for _, k, _ in l_past.token_gaps or ()][0] == 8  # the long one ran all 8
    assert s_past.finish_s == pytest.approx(l_past.first_token_s + sum(
        first + rest for first, _, rest in (l_past.token_gaps or [])[:1]), rel=1e-12)  # fmt: skip
    assert s_past.finish_s > s_stop.finish_s
