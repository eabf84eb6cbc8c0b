"""Exact decisions of ``superinfer``'s fcfs guard (``fcfs_guard``, issue 18): a request without
a TTFT target is aged once the prompt tokens its replica prefilled, found cached or dropped
reach the prompt tokens that arrived before it."""

from __future__ import annotations

import dataclasses

from superinfer.policy_core.policies.superinfer import SuperInferPolicy
from tests.factories import BATCH, make_state, make_view
from tests.policy_core.test_superinfer import arrive, decide, policy


def test_off_by_default() -> None:
    assert SuperInferPolicy().fcfs_guard is False


def _ahead_then_batch() -> SuperInferPolicy:
    """A 300-token chat prompt, then a 100-token batch prompt, on a one-seat replica: the chat
    is prefilled 100 + 199 tokens in two calls (299 of the 300 ahead of the batch)."""
    p = policy(fcfs_guard=True)
    first = make_view("first", prompt=300, arrival_s=0.0)
    batch = make_view("batch", prompt=100, slo=BATCH, arrival_s=0.1)
    arrive(p, first, batch)
    d = decide(p, make_state(now_s=1.0, waiting=[first, batch], token_budget=100, max_num_seqs=1))
    assert d.admit == ("first",) and d.num_tokens == {"first": 100}
    running = make_view("first", prompt=300, computed=100, arrival_s=0.0)
    state = make_state(
        now_s=1.1, waiting=[batch], running=[running], token_budget=199, max_num_seqs=1
    )
    assert decide(p, state).num_tokens == {"first": 199}
    return p


def test_a_batch_request_is_aged_when_the_prompts_ahead_of_it_are_prefilled() -> None:
    p = _ahead_then_batch()
    rep = p._replicas[0]
    assert (rep.fcfs_arrived, rep.fcfs_left) == (400, 299)
    batch = make_view("batch", prompt=100, slo=BATCH, arrival_s=0.1)
    running = make_view("first", prompt=300, computed=299, arrival_s=0.0)
    state = make_state(now_s=1.2, waiting=[batch], running=[running], token_budget=1)
    decide(p, state)  # 299 < 300 at the call's start: not yet; the call prefills the last one
    assert not p._entries["batch"].aged and rep.fcfs_left == 300
    done = make_view(
        "first", prompt=300, computed=300, generated=1, arrival_s=0.0, first_token_s=1.3
    )
    decide(p, make_state(now_s=1.3, waiting=[batch], running=[done], max_num_seqs=1))
    assert p._entries["batch"].aged and p.stats()["fcfs_aged"] == 1


def _late_chat_and_batch() -> tuple[str, ...]:
    """What a freed seat admits: the batch request (aged) or a chat that arrived after it."""
    p = _ahead_then_batch()
    first = make_view("first", prompt=300, computed=299, arrival_s=0.0)
    p.on_request_aborted(first, 1.2, "client")  # its last token counts as gone
    batch = make_view("batch", prompt=100, slo=BATCH, arrival_s=0.1)
    late = make_view("late", prompt=100, arrival_s=1.15)
    arrive(p, late)
    state = make_state(now_s=1.2, waiting=[batch, late], token_budget=100, max_num_seqs=1)
    return decide(p, state).admit


def test_the_aged_request_takes_the_seat_before_a_later_chat() -> None:
    assert _late_chat_and_batch() == ("batch",)


def test_ttft_requests_are_counted_but_never_guard_aged() -> None:
    p = policy(fcfs_guard=True)
    chat = make_view("chat", prompt=50, arrival_s=0.0)
    arrive(p, chat)
    rep = p._replicas[0]
    assert (rep.fcfs_arrived, rep.fcfs_due) == (50, [])


def test_cached_prompt_tokens_count_as_gone_when_the_view_shows_them() -> None:
    p = policy(fcfs_guard=True)
    batch = make_view("batch", prompt=100, slo=BATCH, arrival_s=0.0)
    arrive(p, batch)
    d = decide(p, make_state(now_s=1.0, waiting=[batch], token_budget=10))
    assert d.num_tokens == {"batch": 10} and p._replicas[0].fcfs_left == 10
    # the engine found 64 prompt tokens cached at admission: its running view shows 26 left
    running = make_view("batch", prompt=100, computed=74, slo=BATCH, arrival_s=0.0)
    running = dataclasses.replace(running, cached_tokens=64)
    d = decide(p, make_state(now_s=1.1, running=[running], token_budget=10))
    assert d.num_tokens == {"batch": 10}
    # 10 + 64 found cached + 10 prefilled, 16 of the 100 still to go
    assert (p._replicas[0].fcfs_left, p._entries["batch"].fcfs_tokens) == (84, 16)
