"""``superinfer``'s ``held_*`` counters (``stats()``): the decisions in which a queued request was
held back, and by which rule; exact counts on the hand-made states of the rules' own tests."""

from __future__ import annotations

from superinfer.policy_core.policies.superinfer import SuperInferPolicy
from tests.policy_core import test_superinfer_kv_reserve as kv
from tests.policy_core import test_superinfer_seat_reserve as seats
from tests.policy_core import test_superinfer_serial_prefills as serial
from tests.policy_core.test_superinfer import decide

HELD = ("held_seats", "held_kv", "held_seat_reserve", "held_kv_reserve", "held_serial_prefill")


def _held(p: SuperInferPolicy) -> dict[str, int]:
    return {k: v for k, v in p.stats().items() if k in HELD and v}


def test_the_seat_reserve_counts_once_per_decision() -> None:
    p = seats._policy()
    assert decide(p, seats._state(3)).admit == ("b",)
    assert _held(p) == {}  # admitted: nothing held
    p = seats._policy()
    decide(p, seats._state(2, waiting=("b", "b2")))  # both held, in one decision
    assert _held(p) == {"held_seat_reserve": 1}
    decide(p, seats._state(2, waiting=("b", "b2")))
    assert _held(p) == {"held_seat_reserve": 2}


def test_no_free_seat_is_held_seats() -> None:
    p = seats._policy(ttft_seat_reserve=0)
    assert decide(p, seats._state(0)).admit == ()
    assert _held(p) == {"held_seats": 1}


def test_the_kv_reserve_counts_where_the_prompt_fitted_without_it() -> None:
    # 49 free blocks: 39 left after the 10-block prompt, under the 40 reserved
    p = kv._policy()
    decide(p, kv._state(49))
    assert _held(p) == {"held_kv_reserve": 1}
    # 9 free: the prompt does not fit at all, reserve or not
    p = kv._policy()
    decide(p, kv._state(9))
    assert _held(p) == {"held_kv": 1}
    # without the reserve a first chunk is admitted into the 9 free blocks, nothing held
    p = kv._policy(ttft_kv_reserve_requests=0)
    assert decide(p, kv._state(9)).admit == ("b",)
    assert _held(p) == {}


def test_a_batch_prompt_in_prefill_is_held_serial_prefill() -> None:
    p = serial._policy()
    serial._admit_b1(p)
    decide(p, serial._state(running=(serial.CHAT, serial.B1_PREFILLING)))
    assert _held(p) == {"held_serial_prefill": 1}
