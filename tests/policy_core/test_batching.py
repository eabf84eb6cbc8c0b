"""KV charged for a step under SGLang's admission rule (``step_blocks``, ``fill_step``), with and
without the whole remaining prompt (``StepState.reserve_whole_prompt``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from superinfer.policy_core.batching import (
    FinishAwareAdder,
    fill_step,
    finish_aware_fits,
    step_blocks,
)
from superinfer.policy_core.types import AdmissionRule, ScheduleDecision
from superinfer.policy_core.validation import PolicyError, check_decision
from tests.factories import make_state, make_view


def _sglang(reserve_whole_prompt: bool, free: int = 100, budget: int = 512) -> object:
    return replace(
        make_state(free_blocks=free, token_budget=budget),
        admission=AdmissionRule.RESERVE_RATIO,
        reserve_whole_prompt=reserve_whole_prompt,
    )


def test_an_admission_is_charged_its_whole_remaining_prompt_only_when_the_engine_does() -> None:
    # a 900-token prompt admitted with a 512-token chunk, 100 output tokens, 16-token pages
    view = make_view("r", prompt=900, max_output=100)
    chunk_only = step_blocks(view, 512, _sglang(False), admit=True)
    whole = step_blocks(view, 512, _sglang(True), admit=True)
    assert chunk_only == 32 + 7  # the chunk (512 / 16) + the output cap (ceil(100 / 16))
    assert whole == 32 + 31  # the chunk + ceil((388 + 100) / 16): SGLang's add_one_req
    # a running request's next chunk is charged its own tokens either way
    running = make_view("r", prompt=900, computed=512, max_output=100)
    assert step_blocks(running, 388, _sglang(True), admit=False) == 57 - 32


def test_fill_step_keeps_a_long_prompt_waiting_until_all_of_it_fits() -> None:
    waiting = [make_view("long", prompt=900, max_output=100)]
    assert fill_step(_sglang(False, free=50), [], waiting).admit == ("long",)  # 39 <= 50
    held = fill_step(_sglang(True, free=50), [], waiting)  # 63 > 50: it waits
    assert held.admit == () and held.num_tokens == {}
    assert fill_step(_sglang(True, free=63), [], waiting).admit == ("long",)


def test_sglang_03_ignore_eos_check_runs_every_request_to_its_output_cap() -> None:
    # running: 20-token prompt, 4 of 10 generated -> (6, 24); candidate: 10-token prompt, 5
    # tokens left -> (5, 10). i=0: total - 6 * 2 > 0, frees 10; i=1: total + 10 - 6 > 0
    cand = make_view("c", prompt=10, max_output=5, block_size=1)
    run = make_view("r", prompt=20, computed=24, generated=4, max_output=10, block_size=1)
    assert finish_aware_fits(cand, [run], 13)  # 13 - 12 = 1 > 0, then 13 + 10 - 6 = 17 > 0
    assert not finish_aware_fits(cand, [run], 12)  # 12 - 12 = 0: not > 0
    # a request with nothing left to generate is dropped from the states
    done = make_view("d", prompt=50, computed=60, generated=10, max_output=10, block_size=1)
    assert finish_aware_fits(cand, [run, done], 13)
    # alone, the candidate needs its own 5 tokens: total - 5 > 0 (its prompt is not charged)
    assert finish_aware_fits(cand, [], 6) and not finish_aware_fits(cand, [], 5)


def test_fill_step_under_sglang_03_admission_ignores_the_ratio_reserve_but_not_its_budget() -> None:
    state = replace(
        make_state(free_blocks=40, token_budget=512, block_size=1),
        admission=AdmissionRule.RESERVE_RATIO,
        reserved_hbm_blocks=30,
        finish_aware_admission=True,
    )
    a = make_view("a", prompt=10, max_output=5, block_size=1)
    b = make_view("b", prompt=10, max_output=5, block_size=1)
    # the 0.5 rule would need 10 + 5 <= 40 - 30 for "a"; SGLang 0.3's ignore_eos path: the
    # budget 40 - 30 = 10 > 0, then 40 - 5 > 0: a is admitted and spends the budget
    # (10 - (10 + 5) = -5 <= 0), so b is not offered
    assert fill_step(state, [], [a, b]).admit == ("a",)
    roomy = replace(state, reserved_hbm_blocks=0)  # budget 40 - 15 = 25 > 0: b is checked
    # b: states (5, 10), (5, 10) against the 40 free at the start: 40 - 5 * 2 > 0, 40 + 10 - 5
    assert fill_step(roomy, [], [a, b]).admit == ("a", "b")
    tight = replace(roomy, free_hbm_blocks=10)  # a takes the last 10 blocks: budget -5
    assert fill_step(tight, [], [a, b]).admit == ("a",)


def test_the_engine_check_accepts_what_sglang_03_admits_past_the_ratio_reserve() -> None:
    a = make_view("a", prompt=10, max_output=5, block_size=1)
    state = replace(
        make_state(waiting=[a], free_blocks=40, token_budget=512, block_size=1),
        admission=AdmissionRule.RESERVE_RATIO,
        reserved_hbm_blocks=30,
        finish_aware_admission=True,
    )
    decision = fill_step(state, [], [a])
    check_decision(state, decision)  # the chunk's 10 blocks of 40 free; the reserve not charged
    with pytest.raises(PolicyError, match="admissions need 15 KV blocks, 40 are free and 30"):
        check_decision(replace(state, finish_aware_admission=False), decision)


def _sglang03(free: int, reserved: int, budget: int = 512) -> object:
    return replace(
        make_state(free_blocks=free, token_budget=budget, block_size=1),
        admission=AdmissionRule.RESERVE_RATIO,
        reserved_hbm_blocks=reserved,
        finish_aware_admission=True,
    )


def test_sglang_03_budget_is_checked_before_each_request_and_a_chunk_pays_no_output_cap() -> None:
    a = make_view("a", prompt=30, max_output=5, block_size=1)
    # the budget is already spent (free 40 - reserved 45 < 0): tp_worker's no_remaining_tokens
    # stops the loop before the first request
    assert not FinishAwareAdder(_sglang03(40, 45), [], 40).add(a, 30)
    # a chunk that does not end the prompt is charged its tokens only, not the output cap
    chunk = FinishAwareAdder(_sglang03(40, 19), [], 40)
    assert chunk.add(a, 20) and (chunk.free, chunk.total) == (20, 1)
    whole = FinishAwareAdder(_sglang03(40, 19), [], 40)
    assert whole.add(a, 30) and (whole.free, whole.total) == (10, -14)
    assert not whole.add(make_view("b", prompt=2, max_output=1, block_size=1), 2)


def test_a_refused_sglang_03_admission_stops_repeated_decode_steps() -> None:
    running = [make_view("r", prompt=20, computed=20, generated=1, max_output=30, block_size=1)]
    a = make_view("a", prompt=10, max_output=5, block_size=1)
    # r decodes 1 token (40 -> 39 free); states (5, 10) for a, (29, 21) for r; a: 39 - 29 * 2
    # <= 0: refused, so the step may not repeat (each decoded token changes the check)
    decision = fill_step(_sglang03(40, 0), running, [a], max_repeat_steps=1024)
    assert decision.admit == () and decision.max_repeat_steps == 1
    # with 79 free: 79 - 29 * 2 = 21 > 0, then 79 + 10 - 29 = 60 > 0: admitted
    assert fill_step(_sglang03(80, 0), running, [a]).admit == ("a",)


def test_the_engine_check_refuses_what_sglang_03_would_not_admit() -> None:
    a = make_view("a", prompt=10, max_output=5, block_size=1)
    b = make_view("b", prompt=10, max_output=5, block_size=1)
    state = replace(_sglang03(24, 10), waiting=(a, b))
    both = ScheduleDecision(num_tokens={"a": 10, "b": 10}, admit=("a", "b"))
    # the budget 24 - 10 = 14 is spent by a (14 - 15 < 0), so b would not be offered
    with pytest.raises(PolicyError, match="admitting 'b': SGLang 0.3.1's ignore_eos admission"):
        check_decision(state, both)
    check_decision(replace(state, reserved_hbm_blocks=0), both)  # budget 24 - 15 = 9 > 0
