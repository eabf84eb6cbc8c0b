"""KV charged for a step under SGLang's admission rule (``step_blocks``, ``fill_step``), with and
without the whole remaining prompt (``StepState.reserve_whole_prompt``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from superinfer.policy_core.batching import fill_step, finish_aware_fits, step_blocks
from superinfer.policy_core.types import AdmissionRule
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
    # candidate: 10-token prompt, 5 tokens left -> (5, 10); running: 20-token prompt, 4 of 10
    # generated -> (6, 24). rem = free - 10; i=0: rem - 6 * 2 > 0, frees 10; i=1: rem + 10 - 6 > 0
    cand = make_view("c", prompt=10, max_output=5, block_size=1)
    run = make_view("r", prompt=20, computed=24, generated=4, max_output=10, block_size=1)
    assert finish_aware_fits(cand, [run], 23)  # 13 - 12 = 1 > 0, then 13 + 10 - 6 = 17 > 0
    assert not finish_aware_fits(cand, [run], 22)  # 12 - 12 = 0: not > 0
    # a request with nothing left to generate is dropped from the states
    done = make_view("d", prompt=50, computed=60, generated=10, max_output=10, block_size=1)
    assert finish_aware_fits(cand, [run, done], 23)
    # alone, the candidate needs its prompt plus its own 5 tokens: free - 10 - 5 > 0
    assert finish_aware_fits(cand, [], 16) and not finish_aware_fits(cand, [], 15)


def test_fill_step_under_sglang_03_admission_ignores_the_ratio_reserve_but_not_its_budget() -> None:
    state = replace(
        make_state(free_blocks=40, token_budget=512, block_size=1),
        admission=AdmissionRule.RESERVE_RATIO,
        reserved_hbm_blocks=30,
        finish_aware_admission=True,
    )
    a = make_view("a", prompt=10, max_output=5, block_size=1)
    b = make_view("b", prompt=10, max_output=5, block_size=1)
    # the 0.5 rule would need 10 + 5 <= 40 - 30 for "a"; SGLang 0.3's ignore_eos path checks
    # a: 40 - 10 - 5 > 0, admits it and spends the budget 40 - 30 - (10 + 5) = -5 <= 0: stop
    assert fill_step(state, [], [a, b]).admit == ("a",)
    roomy = replace(state, reserved_hbm_blocks=0)  # budget 40 - 15 = 25 > 0: b is checked
    # b: states (5, 10), (5, 10) against 30 - 10 = 20: 20 - 5 * 2 > 0, 20 + 10 - 5 > 0
    assert fill_step(roomy, [], [a, b]).admit == ("a", "b")
    tight = replace(roomy, free_hbm_blocks=24)  # b: 14 - 10 - 10 = -6: it waits
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
