"""``superinfer``'s one batch prompt in prefill at a time where an admitted prompt runs whole
(``serial_whole_prefills``, ``StepState.prefill_runs_whole``): hand-made states."""

from __future__ import annotations

from dataclasses import replace

import pytest

from superinfer.policy_core.policies.superinfer import SuperInferPolicy
from superinfer.policy_core.types import RequestView, StepState
from tests.factories import BATCH, make_state, make_view
from tests.policy_core.test_superinfer import arrive, decide, decoding, policy

PROMPT, FREE = 160, 10_000


def _batch(rid: str, **kw: object) -> RequestView:
    return make_view(rid, prompt=PROMPT, max_output=10, slo=BATCH, **kw)  # type: ignore[arg-type]


def _policy(*, chat_seen: bool = True, **options: object) -> SuperInferPolicy:
    p = policy(**{"max_preemptions_per_step": 0, "ttft_seat_reserve": 0, **options})
    if chat_seen:
        arrive(p, make_view("c0", prompt=100, max_output=60))
    arrive(p, *(_batch(rid) for rid in ("b1", "b2", "b3")))
    return p


def _state(
    *, running: tuple[RequestView, ...] = (), waiting: tuple[str, ...] = ("b2",), whole: bool = True
) -> StepState:
    state = make_state(running=running, waiting=[_batch(rid) for rid in waiting], free_blocks=FREE)
    return replace(state, prefill_runs_whole=whole)


def _admit_b1(p: SuperInferPolicy) -> None:
    """The policy admits ``b1`` on an idle replica (where it is then in prefill)."""
    assert decide(p, _state(waiting=("b1",))).admit == ("b1",)


CHAT = decoding("c0", 100, 5)
B1_PREFILLING = _batch("b1", computed=64)  # 64 of its 160 prompt tokens, no first token
B1_DECODING = decoding("b1", PROMPT, 2)


@pytest.mark.parametrize(
    ("running", "options", "whole", "admitted"),
    [
        ((CHAT, B1_PREFILLING), {}, True, False),  # b1 is still in its prefill: b2 waits
        ((CHAT, B1_DECODING), {}, True, True),  # b1 has its first token
        ((CHAT, B1_PREFILLING), {}, False, True),  # the engine lets the policy pace prompts
        ((CHAT, B1_PREFILLING), {"serial_whole_prefills": False}, True, True),  # option off
    ],
)
def test_a_batch_admission_waits_for_the_batch_prompt_in_prefill(
    running: tuple[RequestView, ...], options: dict[str, object], whole: bool, admitted: bool
) -> None:
    p = _policy(**options)
    _admit_b1(p)
    decision = decide(p, _state(running=running, whole=whole))
    assert ("b2" in decision.admit) is admitted


def test_a_chunked_request_out_of_every_queue_counts_as_in_prefill() -> None:
    # SGLang keeps its chunked request out of the running batch between chunks: b1, admitted
    # by the policy, is in no queue of the state
    p = _policy()
    _admit_b1(p)
    assert decide(p, _state(running=(CHAT,))).admit == ()


def test_an_admission_left_in_the_waiting_queue_does_not_count() -> None:
    # the engine did not take b1 (e.g. its banked allotments do not cover its prompt yet): b1
    # is waiting again, so it is not in prefill, and it comes first again
    p = _policy()
    _admit_b1(p)
    decision = decide(p, _state(running=(CHAT,), waiting=("b1", "b2")))
    assert decision.admit == ("b1",)


def test_one_batch_admission_per_step() -> None:
    decision = decide(_policy(), _state(running=(CHAT,), waiting=("b1", "b2", "b3")))
    assert decision.admit == ("b1",)


def test_before_any_ttft_class_request_the_rule_is_off() -> None:
    decision = decide(_policy(chat_seen=False), _state(waiting=("b1", "b2", "b3")))
    assert decision.admit == ("b1", "b2", "b3")


def test_a_chat_is_not_held_back_by_a_batch_prompt_in_prefill() -> None:
    p = _policy()
    _admit_b1(p)
    arrive(p, make_view("c1", prompt=100, max_output=60))
    state = replace(
        make_state(
            running=(CHAT, B1_PREFILLING),
            waiting=[make_view("c1", prompt=100, max_output=60)],
            free_blocks=FREE,
        ),
        prefill_runs_whole=True,
    )
    assert decide(p, state).admit == ("c1",)


def test_a_batch_prompt_of_another_replica_does_not_count() -> None:
    p = _policy()
    _admit_b1(p)  # on replica 0, where it is now in prefill (in no queue)
    arrive(p, _batch("r1", replica=1), make_view("c9", prompt=100, max_output=60, replica=1))
    state = replace(
        make_state(waiting=[_batch("r1", replica=1)], free_blocks=FREE, replica=1),
        prefill_runs_whole=True,
    )
    assert decide(p, state).admit == ("r1",)


def test_a_finished_batch_prompt_no_longer_counts() -> None:
    p = _policy()
    _admit_b1(p)
    p.on_request_finished(B1_DECODING, 11.0)
    assert decide(p, _state(running=(CHAT,))).admit == ("b2",)


def test_an_aged_batch_request_is_held_back_by_neither_rule() -> None:
    # aged at half its 600 s deadline budget: it outranks every tier and takes the next seat
    p = _policy(ttft_seat_reserve=2)
    _admit_b1(p)
    state = replace(
        make_state(
            running=(CHAT,),
            waiting=[_batch("b2")],
            free_blocks=FREE,
            max_num_seqs=3,  # 2 free seats: the reserve's
            now_s=400.0,
        ),
        prefill_runs_whole=True,
    )
    assert decide(p, state).admit == ("b2",)
