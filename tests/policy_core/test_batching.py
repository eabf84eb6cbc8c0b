"""KV charged for a step under SGLang's admission rule (``step_blocks``, ``fill_step``), with and
without the whole remaining prompt (``StepState.reserve_whole_prompt``)."""

from __future__ import annotations

from dataclasses import replace

from superinfer.policy_core.batching import fill_step, step_blocks
from superinfer.policy_core.types import AdmissionRule
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
