"""``superinfer``'s seat reserve for TTFT-class arrivals where it may not preempt
(``ttft_seat_reserve``): exact seat arithmetic on hand-made states."""

from __future__ import annotations

import pytest

from superinfer.policy_core.policies.superinfer import SuperInferPolicy
from superinfer.policy_core.types import StepState
from tests.factories import BATCH, make_state, make_view
from tests.policy_core.test_superinfer import arrive, decide, decoding, policy

# plenty of KV (the KV reserve never binds here): only seats decide
CHAT_PROMPT, CHAT_CAP, BATCH_PROMPT, FREE = 100, 60, 160, 10_000


def _policy(*, chat_seen: bool = True, **options: object) -> SuperInferPolicy:
    p = policy(**{"max_preemptions_per_step": 0, **options})
    if chat_seen:
        arrive(p, make_view("c0", prompt=CHAT_PROMPT, max_output=CHAT_CAP))
    for rid in ("b", "b2"):
        arrive(p, make_view(rid, prompt=BATCH_PROMPT, max_output=10, slo=BATCH))
    return p


def _state(seats: int, *, running: bool = True, waiting: tuple[str, ...] = ("b",)) -> StepState:
    chat = [decoding("c0", CHAT_PROMPT, 5)] if running else []
    queue = [make_view(rid, prompt=BATCH_PROMPT, max_output=10, slo=BATCH) for rid in waiting]
    return make_state(running=chat, waiting=queue, free_blocks=FREE, max_num_seqs=len(chat) + seats)


@pytest.mark.parametrize(
    ("seats", "options", "running", "chat_seen", "admitted"),
    [
        (3, {}, True, True, True),  # 3 free: the batch takes one, 2 are left for chats
        (2, {}, True, True, False),  # 2 free: both are the chats' (the default reserve of 2)
        (2, {"ttft_seat_reserve": 1}, True, True, True),
        (1, {"ttft_seat_reserve": 1}, True, True, False),
        (2, {"ttft_seat_reserve": 0}, True, True, True),  # reserve off
        (2, {"max_preemptions_per_step": 8}, True, True, True),  # a chat could preempt
        (1, {}, False, True, True),  # nothing runs: an idle replica admits (no starvation)
        (1, {}, True, False, True),  # no TTFT-class request seen: nothing to keep seats for
    ],
)
def test_a_batch_admission_leaves_the_reserved_seats_free(
    seats: int,
    options: dict[str, object],
    running: bool,
    chat_seen: bool,
    admitted: bool,
) -> None:
    p = _policy(chat_seen=chat_seen, **options)
    decision = decide(p, _state(seats, running=running))
    assert ("b" in decision.num_tokens) is admitted
    assert ("b" in decision.admit) is admitted


def test_admissions_of_one_step_count_against_the_reserve() -> None:
    # 3 free seats and two batch requests waiting: the first takes one, the second would leave
    # only 1 of the 2 reserved
    decision = decide(_policy(), _state(3, waiting=("b", "b2")))
    assert decision.admit == ("b",)


def test_a_ttft_class_admission_may_take_the_reserved_seats() -> None:
    p = _policy()
    arrive(p, make_view("c1", prompt=CHAT_PROMPT, max_output=CHAT_CAP))
    waiting = [make_view("c1", prompt=CHAT_PROMPT, max_output=CHAT_CAP)]
    state = make_state(
        running=[decoding("c0", CHAT_PROMPT, 5)], waiting=waiting, free_blocks=FREE, max_num_seqs=2
    )
    assert decide(p, state).num_tokens["c1"] == CHAT_PROMPT  # the last free seat


def test_bad_seat_reserve_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="ttft_seat_reserve must be >= 0, got -1"):
        SuperInferPolicy(ttft_seat_reserve=-1)


@pytest.mark.parametrize(
    ("last_chat_s", "options", "admitted"),
    [
        (200.0, {}, False),  # a chat 200 s ago: the seats stay the chats'
        (99.0, {}, True),  # none for 301 s (over the default 300): the batch takes a seat
        (100.0, {}, False),  # exactly 300 s: still held
        (100.0, {"ttft_reserve_idle_s": 400.0}, False),
        (0.0, {"ttft_reserve_idle_s": float("inf")}, False),  # for good
    ],
)
def test_the_reserve_lapses_once_chats_stop_arriving(
    last_chat_s: float, options: dict[str, object], admitted: bool
) -> None:
    p = policy(max_preemptions_per_step=0, **options)
    arrive(p, make_view("c0", arrival_s=last_chat_s, prompt=CHAT_PROMPT, max_output=CHAT_CAP))
    # the batch request arrived 10 s ago (not aged: aging would admit it anyway)
    arrive(p, make_view("b", arrival_s=390.0, prompt=BATCH_PROMPT, max_output=10, slo=BATCH))
    chat = [decoding("c0", CHAT_PROMPT, 5)]
    queue = [make_view("b", arrival_s=390.0, prompt=BATCH_PROMPT, max_output=10, slo=BATCH)]
    state = make_state(running=chat, waiting=queue, free_blocks=FREE, max_num_seqs=3, now_s=400.0)
    assert ("b" in decide(p, state).admit) is admitted


def test_without_any_chat_an_endless_window_holds_nothing_back() -> None:
    p = _policy(chat_seen=False, ttft_reserve_idle_s=float("inf"))
    assert "b" in decide(p, _state(1)).admit


def test_a_bad_idle_window_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="ttft_reserve_idle_s must be > 0, got 0"):
        SuperInferPolicy(ttft_reserve_idle_s=0.0)
