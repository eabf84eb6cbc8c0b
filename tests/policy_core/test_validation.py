"""``check_decision`` rejects every inapplicable decision with a message naming the problem."""

from __future__ import annotations

import dataclasses

import pytest

from superinfer.policy_core.types import PreemptMode, ScheduleDecision, StepState
from superinfer.policy_core.validation import PolicyError, check_decision
from tests.factories import make_state, make_view

RUN = make_view("run", prompt=16, computed=16, generated=1)  # holds 1 block, next token needs 1
WAIT = make_view("wait", prompt=40)  # needs 3 blocks


def state(**kwargs: object) -> StepState:
    return make_state(running=[RUN], waiting=[WAIT], **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("decision", "message"),
    [
        (ScheduleDecision(num_tokens={"ghost": 1}), "not running after the decision"),
        (ScheduleDecision(num_tokens={"wait": 40}), "not running after the decision"),
        (ScheduleDecision(admit=("run",)), "admit names 'run'"),
        (ScheduleDecision(preempt={"wait": PreemptMode.RECOMPUTE}), "preempt names 'wait'"),
        (ScheduleDecision(reject={"run": "x"}), "reject names 'run'"),
        (ScheduleDecision(admit=("wait",), reject={"wait": "x"}), "more than one action"),
        (ScheduleDecision(preempt={"run": PreemptMode.SWAP}), "no CPU KV tier"),
        (ScheduleDecision(num_tokens={"run": 2}), "exceed its 1 pending"),
        (ScheduleDecision(num_tokens={"run": 0}), r"num_tokens\['run'\] must be > 0, got 0"),
        (ScheduleDecision(num_tokens={"run": -1}), r"num_tokens\['run'\] must be > 0, got -1"),
        (ScheduleDecision(num_tokens={"wait": 40, "run": 1}, admit=("wait",)), "token budget"),
    ],
)
def test_rejects(decision: ScheduleDecision, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        check_decision(state(token_budget=40), decision)


def test_blocks_must_fit_after_preemptions_free_theirs() -> None:
    admit = ScheduleDecision(num_tokens={"wait": 40}, admit=("wait",))
    with pytest.raises(PolicyError, match="admissions need 3 KV blocks, 2 are free"):
        check_decision(state(free_blocks=2), admit)
    freeing = ScheduleDecision(
        num_tokens={"wait": 40}, admit=("wait",), preempt={"run": PreemptMode.RECOMPUTE}
    )
    check_decision(state(free_blocks=2), freeing)  # 2 free + 1 freed = 3


def test_reserved_headroom_bounds_admissions_only() -> None:
    """Running requests may grow into the headroom reserved for them (SGLang's new_token_ratio);
    only admissions must leave it free."""
    reserved = dataclasses.replace(state(free_blocks=2), reserved_hbm_blocks=5)
    check_decision(reserved, ScheduleDecision(num_tokens={"run": 1}))
    admit = ScheduleDecision(num_tokens={"run": 1, "wait": 40}, admit=("wait",))
    with pytest.raises(PolicyError, match="admissions need 3 KV blocks, 1 are free and 5 are"):
        check_decision(reserved, admit)


def test_max_num_seqs_counts_the_running_set_after_the_decision() -> None:
    with pytest.raises(PolicyError, match="exceed max_num_seqs=1"):
        check_decision(state(max_num_seqs=1), ScheduleDecision(admit=("wait",)))


def test_decision_itself_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_repeat_steps"):
        ScheduleDecision(max_repeat_steps=0)
