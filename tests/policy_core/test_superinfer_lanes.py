"""The running prefills' lanes of ``superinfer`` (issue 21): kept sorted across calls from the
change set, they equal the stable sort by key of the prefilling requests of each tier that the
prefill rotation used to build every call; the decodes' ids, kept in ``state.running`` order."""

from __future__ import annotations

import pytest

from superinfer.adapters.manager import available_policies, make_policy
from superinfer.policy_core.policies.superinfer.records import (
    _awaits_first_token,
    _Entry,
    _Lane,
)
from superinfer.policy_core.types import SLO, RequestView
from tests.policy_core.engine_double import EngineDouble
from tests.policy_core.test_changes import _workload

CHAT = SLO("chat", ttft_ms=1000.0, tpot_ms=100.0)


def _entry(rid: str) -> _Entry:
    return _Entry(RequestView(rid, 0.0, 100, 50, CHAT))


def test_a_lane_reads_its_items_in_order_skips_the_given_ids_and_puts_pushed_entries_first() -> (
    None
):
    entries = {rid: _entry(rid) for rid in "abcd"}
    items = [(1.0, 0, "a"), (1.0, 3, "b"), (2.0, 1, "c"), (5.0, 2, "d")]
    lane = _Lane(items, entries, frozenset({"b"}))
    assert lane.head() is entries["a"]
    lane.pop()
    assert lane.head() is entries["c"]  # b is skipped
    late = _entry("z")
    lane.push(late)
    assert lane.head() is late
    lane.pop()
    assert lane.head() is entries["c"]
    lane.pop()
    lane.pop()
    assert lane.head() is None
    assert items == [(1.0, 0, "a"), (1.0, 3, "b"), (2.0, 1, "c"), (5.0, 2, "d")]  # not mutated


@pytest.mark.parametrize("name", ["superinfer", "oracle"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_lanes_equal_a_stable_sort_of_each_tiers_prefills_after_every_call(
    name: str, seed: int
) -> None:
    """Through the engine double (KV tight enough to preempt, a CPU tier), after every call:
    each tier's lane is its prefilling requests in (key, state.running position) order, with
    the keys they have (a request preempted in that call is requeued with a new key and leaves
    the books at the next state), and its TTFT lane the ones of them awaiting a first token."""
    reqs = _workload(seed)
    cls = available_policies()[name].load()
    extra = {"output_tokens": {r.rid: r.output for r in reqs}} if name == "oracle" else {}
    policy = make_policy(cls, {"max_waiting_per_tier": "40"}, name, extra=extra)
    checked = [0, 0, 0]
    schedule = policy.schedule

    def checking_schedule(state):  # noqa: ANN001, ANN202
        decision = schedule(state)
        books = policy._replica(state.replica).books
        entries = policy._entries
        # the decodes' ids, kept in running order across calls (the decision's num_tokens order)
        # (the num_tokens map, kept across calls; rebuilt inside a call if need be)
        decodes = [rid for rid in books.order if rid not in books.prefilling]
        assert books.dec_map is not None
        assert list(books.dec_map.items()) == [(rid, 1) for rid in decodes]
        checked[2] += len(decodes)
        for t, (lane, ttft_lane) in enumerate(zip(books.lanes, books.ttft_lanes, strict=True)):
            mine = [
                rid for rid, tier in books.tier.items() if tier == t and rid in books.prefilling
            ]
            assert lane == sorted(books.prefilling[rid] for rid in mine)
            for key, pos, rid in lane:
                assert pos == books.order[rid]
                if rid not in decision.preempt:
                    assert (key, entries[rid].tier) == (entries[rid].key, t)
            assert ttft_lane == [i for i in lane if _awaits_first_token(entries[i[2]])]
            checked[0] += len(lane)
            checked[1] += len(ttft_lane)
        return decision

    policy.schedule = checking_schedule  # type: ignore[method-assign]
    engine = EngineDouble(policy, reqs, total_hbm_blocks=300, total_cpu_blocks=200,
                          link_bytes_per_s=1e9, kv_block_bytes=1 << 16, max_num_seqs=24,
                          token_budget=512, prefill_token_s=1e-5)  # fmt: skip
    engine.stamp = True
    engine.run(max_steps=3000)
    assert checked[0] > 100 and checked[1] > 10  # lanes were exercised, TTFT ones too
    assert checked[2] > 100
    assert any(d.preempt for _, d in engine.decisions)


@pytest.mark.parametrize("name", ["superinfer", "oracle"])
@pytest.mark.parametrize("budget", [512, 4096])
@pytest.mark.parametrize("hbm", [120, 300])
def test_turns_placed_at_once_decide_as_the_turns_one_by_one(
    name: str, budget: int, hbm: int
) -> None:
    """``_Rotation._place_turns`` (a tier alone in the stride loop gets its head's turns in one
    placement) against the loop handing them out unit by unit (``_place_turns`` answering 0):
    the same decisions at every step and the same stride passes, with KV tight enough to
    preempt and make room, a CPU tier, and a budget of many 128-token turns."""
    runs = []
    for merged in (True, False):
        reqs = _workload(0)
        cls = available_policies()[name].load()
        extra = {"output_tokens": {r.rid: r.output for r in reqs}} if name == "oracle" else {}
        policy = make_policy(cls, {"max_waiting_per_tier": "40"}, name, extra=extra)
        placed = [0]
        if merged:
            turns = policy._place_turns

            def counting(*args, _turns=turns, _placed=placed):  # noqa: ANN002, ANN202
                given = _turns(*args)
                _placed[0] += given > 0
                return given

            policy._place_turns = counting  # type: ignore[method-assign]
        else:
            policy._place_turns = lambda *args: 0  # type: ignore[method-assign]
        passes = []
        schedule = policy.schedule

        def recording(state, _schedule=schedule, _policy=policy, _passes=passes):  # noqa: ANN001, ANN202
            decision = _schedule(state)
            _passes.append(list(_policy._replica(state.replica).passes))
            return decision

        policy.schedule = recording  # type: ignore[method-assign]
        engine = EngineDouble(policy, reqs, total_hbm_blocks=hbm, total_cpu_blocks=200,
                              link_bytes_per_s=1e9, kv_block_bytes=1 << 16, max_num_seqs=24,
                              token_budget=budget, prefill_token_s=1e-5)  # fmt: skip
        engine.stamp = True
        engine.run(max_steps=3000)
        runs.append((engine.decisions, passes, placed[0]))
    (merged_d, merged_p, placed), (plain_d, plain_p, _) = runs
    assert placed > 20  # the merged turns happened
    assert len(merged_d) == len(plain_d) > 50
    assert [d for _, d in merged_d] == [d for _, d in plain_d]
    assert merged_p == plain_p
    assert any(d.preempt for _, d in plain_d)
