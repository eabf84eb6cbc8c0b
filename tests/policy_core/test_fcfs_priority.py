"""Exact decisions of the ``fcfs`` and ``priority`` policies on small hand-made states."""

from __future__ import annotations

from superinfer.policy_core.policies.fcfs import DEFAULT_MAX_REPEAT_STEPS, FCFSPolicy
from superinfer.policy_core.policies.priority import PriorityPolicy
from superinfer.policy_core.types import SLO, PreemptMode, RequestView, ScheduleDecision
from superinfer.policy_core.validation import check_decision
from tests.factories import BATCH, CHAT, make_state, make_view

RECOMPUTE = PreemptMode.RECOMPUTE


def decide(policy: FCFSPolicy | PriorityPolicy, **state_kwargs: object) -> ScheduleDecision:
    state = make_state(**state_kwargs)  # type: ignore[arg-type]
    decision = policy.schedule(state)
    check_decision(state, decision)  # every decision here must also be applicable
    return decision


def decoding(rid: str, prompt: int, *, slo: SLO = CHAT, arrival_s: float = 0.0) -> RequestView:
    """A request in decode whose next token needs a new block (prompt fills its blocks)."""
    return make_view(rid, prompt=prompt, computed=prompt, generated=1, slo=slo, arrival_s=arrival_s)


class TestFCFS:
    def test_admits_in_arrival_order_with_whole_prompts(self) -> None:
        b = make_view("b", arrival_s=2.0, prompt=40)
        a = make_view("a", arrival_s=1.0, prompt=20)
        d = decide(FCFSPolicy(), waiting=[b, a])
        assert dict(d.num_tokens) == {"a": 20, "b": 40}
        assert d.admit == ("a", "b")
        assert dict(d.preempt) == {}
        assert d.max_repeat_steps == 1  # prefills are never repeated

    def test_chunks_the_prefill_that_overflows_the_budget(self) -> None:
        a = make_view("a", arrival_s=1.0, prompt=20)
        b = make_view("b", arrival_s=2.0, prompt=40)
        d = decide(FCFSPolicy(), waiting=[a, b], token_budget=50)
        assert dict(d.num_tokens) == {"a": 20, "b": 30}
        assert d.admit == ("a", "b")

    def test_admission_stops_at_the_first_request_that_does_not_fit(self) -> None:
        a = make_view("a", arrival_s=1.0, prompt=40)  # 3 blocks
        b = make_view("b", arrival_s=2.0, prompt=10)  # 1 block, but must not overtake a
        d = decide(FCFSPolicy(), waiting=[a, b], free_blocks=2)
        assert dict(d.num_tokens) == {} and d.admit == ()

    def test_respects_max_num_seqs(self) -> None:
        views = [make_view(r, arrival_s=i, prompt=8) for i, r in enumerate("xyz")]
        d = decide(FCFSPolicy(), waiting=views, max_num_seqs=2)
        assert d.admit == ("x", "y")

    def test_preempts_the_last_admitted_running_request(self) -> None:
        r1, r2, r3 = decoding("r1", 32), decoding("r2", 32), decoding("r3", 32)
        d = decide(FCFSPolicy(), running=[r1, r2, r3], free_blocks=1)
        assert dict(d.num_tokens) == {"r1": 1, "r2": 1}
        assert dict(d.preempt) == {"r3": RECOMPUTE}

    def test_preempts_itself_when_no_victim_is_left(self) -> None:
        r1, r2 = decoding("r1", 32), decoding("r2", 16)
        w = make_view("w", arrival_s=5.0, prompt=8)
        d = decide(FCFSPolicy(), running=[r1, r2], waiting=[w], free_blocks=1)
        assert dict(d.num_tokens) == {"r1": 1}
        assert dict(d.preempt) == {"r2": RECOMPUTE}
        assert d.admit == ()  # no admission in a step that preempts (vLLM v1)

    def test_decode_only_step_may_be_repeated(self) -> None:
        r1 = make_view("r1", prompt=20, computed=20, generated=1)
        r2 = make_view("r2", prompt=20, computed=22, generated=3)
        d = decide(FCFSPolicy(), running=[r1, r2])
        assert dict(d.num_tokens) == {"r1": 1, "r2": 1}
        assert d.max_repeat_steps == DEFAULT_MAX_REPEAT_STEPS
        assert decide(FCFSPolicy(max_repeat_steps=7), running=[r1, r2]).max_repeat_steps == 7


class TestPriority:
    def test_ranks_running_by_class_priority_for_blocks(self) -> None:
        batch = decoding("batch", 32, slo=BATCH, arrival_s=0.0)
        chat = decoding("chat", 32, slo=CHAT, arrival_s=5.0)
        d = decide(PriorityPolicy(), running=[batch, chat], free_blocks=1)
        assert dict(d.num_tokens) == {"chat": 1}
        assert dict(d.preempt) == {"batch": RECOMPUTE}
        # fcfs on the same state keeps the older batch request and preempts the chat one
        d = decide(FCFSPolicy(), running=[batch, chat], free_blocks=1)
        assert dict(d.num_tokens) == {"batch": 1}
        assert dict(d.preempt) == {"chat": RECOMPUTE}

    def test_admits_the_more_urgent_class_first(self) -> None:
        batch = make_view("batch", prompt=40, slo=BATCH, arrival_s=0.0)
        chat = make_view("chat", prompt=40, slo=CHAT, arrival_s=5.0)
        assert decide(PriorityPolicy(), waiting=[batch, chat], free_blocks=3).admit == ("chat",)
        assert decide(FCFSPolicy(), waiting=[batch, chat], free_blocks=3).admit == ("batch",)

    def test_same_class_falls_back_to_arrival(self) -> None:
        late = make_view("late", prompt=8, arrival_s=3.0)
        early = make_view("early", prompt=8, arrival_s=1.0)
        assert decide(PriorityPolicy(), waiting=[late, early]).admit == ("early", "late")
