"""The StepState change set (issue 21): the engine-side tracker equals the snapshot difference,
the sorted containers and ranked queues equal a full sort, and every built-in policy decides
exactly the same with and without a change set."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from superinfer.adapters.manager import available_policies, make_policy
from superinfer.policy_core.changes import (
    RankedQueue,
    SortedKeys,
    ViewTracker,
    decode_advance,
    diff_states,
)
from superinfer.policy_core.types import (
    SLO,
    Queue,
    QueueChanges,
    RequestView,
    StepChanges,
    StepState,
)
from tests.change_sets import assert_change_sets_exact
from tests.policy_core.engine_double import EngineDouble, Req

CHAT = SLO("chat", ttft_ms=1000.0, tpot_ms=100.0, priority=0)
BATCH = SLO("batch", deadline_s=600.0, priority=1)


def _view(
    rid: str, arrival: float, computed: int = 0, hit: int = 0, slo: SLO = CHAT
) -> RequestView:
    return RequestView(rid, arrival, 100, 50, slo, computed_tokens=computed, prefix_hit_tokens=hit)


def _state(waiting=(), running=(), swapped=(), now: float = 0.0) -> StepState:  # noqa: ANN001
    return StepState(now, 0, tuple(waiting), tuple(running), tuple(swapped), 1000, 1000, 0, 0,
                     16, 512, 8)  # fmt: skip


def test_the_tracker_names_arrivals_departures_moves_and_changed_views_exactly() -> None:
    tracker = ViewTracker()
    a, b, c = _view("a", 0.0), _view("b", 1.0), _view("c", 2.0)
    first = tracker.stamp(_state(waiting=[a, b], running=[c]))
    assert first.changes == StepChanges(
        tracker.series, 1, 0,
        waiting=QueueChanges(arrived=frozenset({"a", "b"})),
        running=QueueChanges(arrived=frozenset({"c"})),
    )  # fmt: skip
    assert first.views == {"a": a, "b": b, "c": c}
    assert first.queue_of == {"a": Queue.WAITING, "b": Queue.WAITING, "c": Queue.RUNNING}
    # b moves to running, c changes, a gets an equal but new view object (not a change), d comes
    c2, d = replace(c, computed_tokens=5), _view("d", 3.0)
    second = tracker.stamp(_state(waiting=[replace(a), d], running=[c2, b]))
    assert second.changes == StepChanges(
        tracker.series, 2, 1,
        waiting=QueueChanges(arrived=frozenset({"d"}), left=frozenset({"b"})),
        running=QueueChanges(arrived=frozenset({"b"}), changed=frozenset({"c"}),
                             irregular=frozenset({"c"})),  # a prefill's progress: irregular
    )  # fmt: skip
    third = tracker.stamp(_state(waiting=[replace(a, prefix_hit_tokens=16), d]))
    assert third.changes is not None
    assert third.changes.waiting == QueueChanges(changed=frozenset({"a"}),
                                                 irregular=frozenset({"a"}))  # fmt: skip
    assert third.changes.running == QueueChanges(left=frozenset({"b", "c"}))
    assert assert_change_sets_exact([first, second, third]) == 3
    assert ViewTracker().series != tracker.series


def _decoding(rid: str, generated: int, kv_blocks: int = 7) -> RequestView:
    """A decoding view: prompt 100, ``generated`` tokens, all but the last with KV."""
    return RequestView(rid, 0.0, 100, 50, CHAT, computed_tokens=99 + generated,
                       generated_tokens=generated, first_token_s=1.0,
                       kv_blocks=kv_blocks)  # fmt: skip


def test_decode_advance_is_the_tokens_a_decode_ran_and_nothing_else() -> None:
    a = _decoding("a", 3)
    assert decode_advance(a, a) == 0
    assert decode_advance(a, _decoding("a", 5)) == 2
    assert decode_advance(a, _decoding("a", 5, kv_blocks=8)) == 2  # a block more: still
    assert decode_advance(a, replace(_decoding("a", 5), kv_blocks=6)) == -1  # fewer blocks
    assert decode_advance(a, _decoding("a", 2)) == -1  # backwards
    assert decode_advance(a, replace(a, generated_tokens=4)) == -1  # no KV for a token
    assert decode_advance(a, replace(_decoding("a", 4), tier=1)) == -1  # another field
    assert decode_advance(a, replace(_decoding("a", 4), num_preemptions=1)) == -1
    prefill = _view("p", 0.0, computed=10)
    assert decode_advance(prefill, replace(prefill, computed_tokens=20)) == -1  # not decoding
    tracker = ViewTracker()
    b, c, p = _decoding("b", 1), _decoding("c", 1), _view("p", 0.0)
    tracker.stamp(_state(running=[b, c, p]))
    second = tracker.stamp(
        _state(running=[_decoding("b", 2), _decoding("c", 4), replace(p, computed_tokens=8)])
    )
    assert second.changes is not None
    assert second.changes.running == QueueChanges(
        changed=frozenset({"b", "c", "p"}), irregular=frozenset({"p"}), min_advance=1,
        max_advance=3)  # fmt: skip
    third = tracker.stamp(_state(running=[_decoding("b", 2), _decoding("c", 4, kv_blocks=9)]))
    assert third.changes is not None  # c: a block, no token (an advance of 0)
    assert third.changes.running == QueueChanges(left=frozenset({"p"}), changed=frozenset({"c"}))


def test_a_state_without_views_builds_its_map_on_demand() -> None:
    a, b = _view("a", 0.0), _view("b", 1.0)
    state = _state(waiting=[a], running=[b])
    assert state.views is None and state.changes is None
    assert state.view_map() == {"a": a, "b": b}


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 30))
def test_tracker_change_sets_equal_the_snapshot_difference_over_random_steps(
    seed: int, steps: int
) -> None:
    rng = random.Random(seed)
    tracker = ViewTracker()
    queues: list[dict[str, RequestView]] = [{}, {}, {}]
    states = []
    count = 0
    for _ in range(steps):
        for _ in range(rng.randint(0, 4)):  # arrivals
            count += 1
            queues[0][f"r{count}"] = _view(f"r{count}", float(count))
        for q in queues:
            for rid in list(q):
                roll = rng.random()
                if roll < 0.1:
                    del q[rid]  # finished or aborted
                elif roll < 0.25:
                    dest = queues[rng.randrange(3)]
                    dest[rid] = q.pop(rid)  # moved (possibly to the same queue's end)
                elif roll < 0.35:
                    q[rid] = replace(q[rid], computed_tokens=q[rid].computed_tokens + 1)
                elif roll < 0.45:  # decode steps (the first one makes it a decode), a block
                    v, d = q[rid], rng.choice([0, 1, 1, 2])
                    tokens = v.prompt_tokens + v.generated_tokens + d
                    q[rid] = replace(v, computed_tokens=tokens - 1,
                                     generated_tokens=v.generated_tokens + d,
                                     kv_blocks=v.kv_blocks + rng.randint(0, 1))  # fmt: skip
                elif roll < 0.55:
                    q[rid] = replace(q[rid])  # a new object with the same value
        state = tracker.stamp(_state(*(list(q.values()) for q in queues), now=float(count)))
        states.append(state)
        if rng.random() < 0.2:  # a probe state, not stamped: it must not disturb the series
            states.append(_state(waiting=list(queues[0].values())[:1]))
    assert assert_change_sets_exact(states) == steps
    assert diff_states(None, states[0])[0].arrived == frozenset(
        v.request_id for v in states[0].waiting
    )


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 300)), max_size=400),
       load=st.sampled_from([1, 2, 4, 512]))  # fmt: skip
def test_sorted_keys_stay_equal_to_a_sorted_list(ops: list[tuple[bool, int]], load: int) -> None:
    keys = SortedKeys([(5, "x"), (1, "y")], load=load)
    model = [(1, "y"), (5, "x")]
    for add, k in ops:
        key = (k, str(k))
        if add and key not in model:
            keys.add(key)
            model.append(key)
        elif not add and key in model:
            keys.remove(key)
            model.remove(key)
        assert list(keys) == sorted(model) and len(keys) == len(model)
    with pytest.raises(ValueError, match="not in SortedKeys"):
        keys.remove((999, "none"))


def _arrival_key(v: RequestView) -> tuple[float, str]:
    return (v.arrival_s, v.request_id)


def _hit_key(v: RequestView) -> tuple[int, float, str]:
    return (-v.prefix_hit_tokens, v.arrival_s, v.request_id)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_a_ranked_queue_equals_a_full_sort_with_or_without_change_sets(seed: int) -> None:
    rng = random.Random(seed)
    tracker = ViewTracker()
    ranked = {k: RankedQueue(Queue.WAITING, k) for k in (_arrival_key, _hit_key)}
    waiting: dict[str, RequestView] = {}
    for step in range(40):
        for _ in range(rng.randint(0, 3)):
            rid = f"r{step}.{len(waiting)}"
            waiting[rid] = _view(rid, rng.choice([0.0, 1.0, float(step)]), hit=rng.randint(0, 3))
        for rid in list(waiting):
            roll = rng.random()
            if roll < 0.15:
                del waiting[rid]
            elif roll < 0.3:
                waiting[rid] = replace(waiting[rid], prefix_hit_tokens=rng.randint(0, 3))
        state = tracker.stamp(_state(waiting=list(waiting.values())))
        if rng.random() < 0.15:  # an engine without change sets, or a state the policy missed
            state = rng.choice([replace(state, changes=None, views=None, queue_of=None), None])
        if state is None:
            continue
        for key, rq in ranked.items():
            rq.update(state)
            assert rq.ordered(state) == sorted(state.waiting, key=key)


WORKLOAD_SLOS = (CHAT, BATCH, SLO("bulk"))


def _workload(seed: int, n: int = 120) -> list[Req]:
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        reqs.append(Req(f"q{i}", round(rng.uniform(0.0, 6.0), 3), rng.randint(1, 900),
                        rng.randint(1, 80), rng.choice(WORKLOAD_SLOS)))  # fmt: skip
    return reqs


POLICIES = ["edf", "fcfs", "lpm", "mlfq", "priority", "superinfer", "oracle"]


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_policy_decides_the_same_with_and_without_change_sets(name: str, seed: int) -> None:
    """The same requests through the engine double, states stamped or not: identical decisions
    at every step (KV tight enough to preempt, a CPU tier for swaps)."""
    runs = []
    for stamp in (False, True):
        reqs = _workload(seed)
        cls = available_policies()[name].load()
        extra = {"output_tokens": {r.rid: r.output for r in reqs}} if name == "oracle" else {}
        options = {"max_waiting_per_tier": "40"} if name in ("superinfer", "oracle") else {}
        if name == "mlfq":
            options = {"starvation_s": "0.4"}
        if name == "lpm":
            options = {"max_sort_queue": "8"}
        policy = make_policy(cls, options, name, extra=extra)
        engine = EngineDouble(policy, reqs, total_hbm_blocks=300, total_cpu_blocks=200,
                              link_bytes_per_s=1e9, kv_block_bytes=1 << 16, max_num_seqs=24,
                              token_budget=512, prefill_token_s=1e-5)  # fmt: skip
        engine.stamp = stamp
        engine.run(max_steps=3000)
        runs.append(engine.decisions)
        if stamp:
            assert assert_change_sets_exact(s for s, _ in engine.decisions) == len(engine.decisions)
            for rq in policy.__dict__.get("_ranked_queues", {}).values():
                assert rq.rebuilds == 1  # built once, then kept from the change sets
            if name in ("superinfer", "oracle"):  # the running pass, kept from the change sets
                assert policy.__dict__["_run_rebuilds"] == 1
    plain, stamped = runs
    assert len(plain) == len(stamped) > 50
    for (s0, d0), (s1, d1) in zip(plain, stamped, strict=True):
        assert (s0.now_s, s0.waiting, s0.running, s0.swapped) == (
            s1.now_s, s1.waiting, s1.running, s1.swapped)  # fmt: skip
        assert d0 == d1
    assert any(d.preempt for _, d in plain) or name in ("lpm", "fcfs")


@pytest.mark.parametrize("name", ["superinfer", "oracle"])
@pytest.mark.parametrize("seed", [0, 1])
def test_one_token_pages_decide_the_same_with_and_without_change_sets(name: str, seed: int) -> None:
    """SGLang's one-token pages: with change sets the running pass keeps the decodes that take a
    page at every token out of the buckets (``_RunBooks.classes``) and decides as the full pass
    does at every step (the same KV in tokens as above, 16x the blocks)."""
    runs = []
    unit_seen = 0
    for stamp in (False, True):
        reqs = _workload(seed)
        cls = available_policies()[name].load()
        extra = {"output_tokens": {r.rid: r.output for r in reqs}} if name == "oracle" else {}
        # a small quantum, so decodes are demoted mid-stream (their demotion clock comes)
        options = {"max_waiting_per_tier": "40", "quantum_base_tokens": "64"}
        policy = make_policy(cls, options, name, extra=extra)
        engine = EngineDouble(policy, reqs, total_hbm_blocks=4800, total_cpu_blocks=3200,
                              link_bytes_per_s=1e9, kv_block_bytes=1 << 12, max_num_seqs=24,
                              token_budget=512, prefill_token_s=1e-5, block_size=1)  # fmt: skip
        engine.stamp = stamp
        if stamp:  # count the decodes kept out of the buckets, call by call
            scan = policy._scan_running

            def counting(rep, step, now, scan=scan):  # noqa: ANN001, ANN202
                nonlocal unit_seen
                out = scan(rep, step, now)
                unit_seen += len(rep.books.res)
                return out

            policy._scan_running = counting
        engine.run(max_steps=3000)
        runs.append(engine.decisions)
    plain, stamped = runs
    assert len(plain) == len(stamped) > 50
    for (s0, d0), (s1, d1) in zip(plain, stamped, strict=True):
        assert s0.running == s1.running
        assert d0 == d1
    assert any(d.preempt for _, d in plain)
    assert unit_seen > 100  # the path under test ran


def test_superinfer_resynchronizes_when_a_hook_forgets_a_request_still_running() -> None:
    """An abort the engine has not yet carried out (the request still runs in the next state):
    the running books rebuild and decide as without change sets (the request is adopted)."""
    decisions = []
    for stamp in (False, True):
        policy = make_policy(available_policies()["superinfer"].load(), {}, "superinfer")
        tracker = ViewTracker()
        first = [_decoding("a", 1), _decoding("b", 1)]
        for v in first:
            policy.on_request_arrived(v, 0.0)
        out = []
        for step, views in enumerate([first, [_decoding("a", 2), _decoding("b", 2)]]):
            state = _state(running=views, now=float(step))
            out.append(policy.schedule(tracker.stamp(state) if stamp else state))
            if step == 0:
                policy.on_request_aborted(first[0], 0.5, "client gone")
        decisions.append(out)
        if stamp:
            assert policy.__dict__["_run_rebuilds"] == 2
    assert decisions[0] == decisions[1]
    assert decisions[1][1].num_tokens == {"a": 1, "b": 1}
