"""The prefill bank: a policy's per-pass prefill allotments, carried out by SGLang, which runs a
whole prompt once admitted (``adapters/sglang/prefill_bank.py``). Pure: no sglang import."""

from __future__ import annotations

from superinfer.adapters.sglang.prefill_bank import PrefillBank, prefill_need
from superinfer.policy_core.types import ScheduleDecision
from tests.factories import BATCH, make_state, make_view


def test_the_need_is_the_uncached_prompt_capped_at_the_pass_budget() -> None:
    assert prefill_need(900, 0, 16384) == 900
    assert prefill_need(900, 256, 16384) == 644
    assert prefill_need(40000, 0, 16384) == 16384
    assert prefill_need(64, 64, 16384) == 1  # a full hit still runs its last token


def test_allotments_accumulate_until_they_cover_the_prefill() -> None:
    bank = PrefillBank()
    long = make_view("b", prompt=100, slo=BATCH)
    short = make_view("c", prompt=20)
    state = make_state(waiting=[short, long])
    decision = ScheduleDecision(num_tokens={"c": 20, "b": 32}, admit=("c", "b"))
    passes = []
    for _ in range(4):
        bank.update(decision, state, 16384)
        passes.append((sorted(bank.ready), dict(bank.tokens)))
    assert passes == [
        (["c"], {"c": 20, "b": 32}),
        (["c"], {"c": 40, "b": 64}),
        (["c"], {"c": 60, "b": 96}),
        (["b", "c"], {"c": 80, "b": 128}),  # ceil(100 / 32) = 4 passes
    ]


def test_only_admissions_of_waiting_requests_are_banked_and_left_requests_are_forgotten() -> None:
    bank = PrefillBank()
    b = make_view("b", prompt=100, slo=BATCH)
    bank.update(
        ScheduleDecision(num_tokens={"b": 50}, admit=("b",)), make_state(waiting=[b]), 16384
    )
    assert (bank.tokens, bank.ready) == ({"b": 50}, frozenset())
    bank.update(ScheduleDecision(num_tokens={"b": 50}), make_state(waiting=[b]), 16384)
    assert (bank.tokens, bank.ready) == ({"b": 50}, frozenset())  # not admitted: nothing added
    bank.update(ScheduleDecision(admit=("ghost",)), make_state(waiting=[]), 16384)
    assert (bank.tokens, bank.ready) == ({}, frozenset())  # b left the queue (SGLang ran it)


def test_a_whole_allotment_is_ready_at_once_and_a_prefix_hit_lowers_the_need() -> None:
    bank = PrefillBank()
    hit = make_view("h", prompt=600, prefix_hit=512, slo=BATCH)
    whole = make_view("w", prompt=900, slo=BATCH)
    decision = ScheduleDecision(num_tokens={"h": 88, "w": 900}, admit=("h", "w"))
    bank.update(decision, make_state(waiting=[hit, whole]), 16384)
    assert bank.ready == frozenset({"h", "w"})
    huge = make_view("x", prompt=40000, slo=BATCH)
    bank.update(
        ScheduleDecision(num_tokens={"x": 2048}, admit=("x",)), make_state(waiting=[huge]), 2048
    )
    assert bank.ready == frozenset({"x"})  # the whole pass budget is all a policy can give


def test_ready_admissions_go_before_deferred_ones_in_sglangs_queue() -> None:
    class Req:
        def __init__(self, rid: str) -> None:
            self.rid = rid

    bank = PrefillBank()
    views = [make_view("b", prompt=900, slo=BATCH), make_view("c", prompt=40), make_view("d")]
    queue = [Req("b"), Req("c"), Req("d")]  # the policy's order: b was admitted first
    decision = ScheduleDecision(num_tokens={"b": 128, "c": 40}, admit=("b", "c"))
    bank.update(decision, make_state(waiting=views), 16384, queue=queue)
    assert [r.rid for r in queue] == ["c", "b", "d"]
