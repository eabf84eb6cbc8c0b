"""Exact decisions of the baselines: ``edf``, ``mlfq``, ``lpm`` and the clairvoyant ``oracle``."""

from __future__ import annotations

import pytest

from superinfer.policy_core.policies.edf import EDFPolicy, ttft_deadline_s
from superinfer.policy_core.policies.lpm import LPMPolicy
from superinfer.policy_core.policies.mlfq import MLFQPolicy
from superinfer.policy_core.policies.oracle import OraclePolicy
from superinfer.policy_core.types import SLO, PreemptMode
from superinfer.policy_core.validation import check_decision
from tests.factories import BATCH, CHAT, make_state, make_view


class TestEDF:
    def test_deadlines_by_class(self) -> None:
        assert ttft_deadline_s(make_view("c", arrival_s=2.0)) == 3.0
        assert ttft_deadline_s(make_view("b", arrival_s=2.0, slo=BATCH)) == 602.0
        assert ttft_deadline_s(make_view("o", slo=SLO("other"))) == float("inf")

    def test_admits_the_earliest_first_token_deadline_first(self) -> None:
        batch = make_view("batch", prompt=40, slo=BATCH, arrival_s=0.0)  # due at 600
        late_chat = make_view("late", prompt=40, arrival_s=5.0)  # due at 6
        early_chat = make_view("early", prompt=40, arrival_s=4.0)  # due at 5
        state = make_state(waiting=[batch, late_chat, early_chat], free_blocks=6)
        d = EDFPolicy().schedule(state)
        check_decision(state, d)
        assert d.admit == ("early", "late")  # batch does not fit behind them

    def test_preempts_the_latest_deadline_under_kv_shortage(self) -> None:
        chat = make_view("chat", prompt=32, computed=32, generated=1, arrival_s=5.0)
        batch = make_view("batch", prompt=32, computed=32, generated=1, slo=BATCH)
        d = EDFPolicy().schedule(make_state(running=[batch, chat], free_blocks=1))
        assert dict(d.preempt) == {"batch": PreemptMode.RECOMPUTE}


class TestMLFQ:
    def test_skip_join_and_demotion_levels(self) -> None:
        p = MLFQPolicy(num_queues=4, quantum_base_tokens=100)  # quanta 100, 200, 400, 800
        assert p.level(make_view("a", prompt=100), 0.0) == 0
        assert p.level(make_view("b", prompt=101), 0.0) == 1  # skips queue 0
        assert p.level(make_view("c", prompt=500), 0.0) == 3
        # 100 tokens of service use up queue 0's quantum; 300 more use up queue 1's
        assert p.level(make_view("d", prompt=50, computed=99, generated=50), 0.0) == 0
        assert p.level(make_view("d", prompt=50, computed=100, generated=51), 0.0) == 1
        assert p.level(make_view("d", prompt=50, computed=300, generated=251), 0.0) == 2

    def test_short_jobs_first_and_starvation_prevention(self) -> None:
        p = MLFQPolicy(num_queues=4, quantum_base_tokens=100, starvation_s=30.0)
        long_old = make_view("long", prompt=500, arrival_s=0.0)
        short_new = make_view("short", prompt=50, arrival_s=9.0)
        state = make_state(waiting=[long_old, short_new], free_blocks=33, now_s=10.0)
        assert p.schedule(state).admit == ("short",)  # the long prompt does not fit behind it
        state = make_state(waiting=[long_old, short_new], free_blocks=33, now_s=30.0)
        assert p.schedule(state).admit == ("long",)  # waited 30 s: served from queue 0


class TestLPM:
    def test_longest_cached_prefix_first(self) -> None:
        a = make_view("a", prompt=64, prefix_hit=0, arrival_s=0.0)
        b = make_view("b", prompt=64, prefix_hit=48, arrival_s=1.0)
        c = make_view("c", prompt=64, prefix_hit=16, arrival_s=2.0)
        assert LPMPolicy().schedule(make_state(waiting=[a, b, c])).admit == ("b", "c", "a")

    def test_falls_back_to_arrival_order_on_long_queues(self) -> None:
        a = make_view("a", prompt=64, prefix_hit=0, arrival_s=0.0)
        b = make_view("b", prompt=64, prefix_hit=48, arrival_s=1.0)
        d = LPMPolicy(max_sort_queue=1).schedule(make_state(waiting=[b, a]))
        assert d.admit == ("a", "b")


class TestOracle:
    def test_needs_the_true_lengths(self) -> None:
        with pytest.raises(ValueError, match="true output length of every request"):
            OraclePolicy()

    def test_uses_the_true_remaining_output(self) -> None:
        oracle = OraclePolicy(output_tokens={"r": 120})
        view = make_view("r", prompt=10, computed=29, generated=20)
        assert oracle.remaining_output_tokens(view) == 100.0
        assert oracle.credit_tokens(view) == 100.0
        with pytest.raises(KeyError, match="no true output length for request 'x'"):
            oracle.remaining_output_tokens(make_view("x"))

    def test_rejects_what_cannot_meet_its_slo(self) -> None:
        oracle = OraclePolicy(output_tokens={"late": 10, "fine": 10})
        late = make_view("late", prompt=100, arrival_s=8.0)  # TTFT deadline 9 < now 10
        fine = make_view("fine", prompt=100, arrival_s=9.9)
        for v in (late, fine):
            oracle.on_request_arrived(v, v.arrival_s)
        state = make_state(waiting=[late, fine])
        d = oracle.schedule(state)
        check_decision(state, d)
        assert dict(d.reject) == {"late": "slo_unattainable"} and d.admit == ("fine",)


def test_chat_is_the_factories_chat() -> None:
    assert CHAT.ttft_ms == 1000.0 and CHAT.tpot_ms == 100.0
