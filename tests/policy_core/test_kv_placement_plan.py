"""PlacementPlanner: leaf-first eviction order, offload vs drop, the pin cap, in-use nodes,
prefetch."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from superinfer.policy_core.kv_placement_plan import PlacementPlan, PlacementPlanner
from superinfer.policy_core.types import KVLocation, Placement, PrefixNodeView
from superinfer.policy_core.validation import check_placement

#        0            a forest of 7 one-block nodes (index: parent)
#       / \
#      1   4          2 and 3 are leaves under 1; 5 is a leaf under 4; 6 is a second root
#     / \    \
#    2   3    5   6
PARENT = [-1, 0, 1, 1, 0, 4, -1]
DEPTH = [0, 1, 2, 2, 1, 2, 0]


def plan(
    score: Sequence[float],
    *,
    need: int,
    in_hbm: Sequence[bool] | None = None,
    in_use: Sequence[bool] | None = None,
    waiting: Sequence[int] | None = None,
    free_hbm: int = 0,
    free_cpu: int = 0,
    total_hbm: int = 7,
    cpu: bool = False,
    calibrated: bool = False,
    planner: PlacementPlanner | None = None,
    parent: Sequence[int] = PARENT,
    depth: Sequence[int] = DEPTH,
) -> PlacementPlan:
    n = len(parent)
    return (planner or PlacementPlanner()).plan_arrays(
        score=np.asarray(score, dtype=np.float64),
        parent=np.asarray(parent, dtype=np.int64),
        depth=np.asarray(depth, dtype=np.int64),
        num_blocks=np.ones(n, dtype=np.int64),
        in_hbm=np.asarray(in_hbm if in_hbm is not None else [True] * n),
        in_use=None if in_use is None else np.asarray(in_use),
        waiting_refs=None if waiting is None else np.asarray(waiting, dtype=np.int64),
        needed_hbm_blocks=need,
        free_hbm_blocks=free_hbm,
        free_cpu_blocks=free_cpu,
        total_hbm_blocks=total_hbm,
        has_cpu_tier=cpu,
        calibrated=calibrated,
    )


def test_a_lazy_score_function_gives_the_same_plan_and_scores_only_candidates() -> None:
    score = np.array([0.0, 5.0, 3.0, 1.0, 2.0, 4.0, 6.0])
    seen: list[int] = []

    def fn(idx: np.ndarray) -> np.ndarray:
        seen.extend(idx.tolist())
        return score[idx]

    def lazy(need: int) -> PlacementPlan:
        return PlacementPlanner().plan_arrays(
            score=fn,
            parent=np.asarray(PARENT),
            depth=np.asarray(DEPTH),
            num_blocks=np.ones(7, dtype=np.int64),
            in_hbm=np.ones(7, dtype=bool),
            needed_hbm_blocks=need,
            free_hbm_blocks=0,
            free_cpu_blocks=0,
            total_hbm_blocks=7,
            has_cpu_tier=False,
            calibrated=False,
        )

    assert lazy(1).drop.tolist() == [3]
    assert sorted(seen) == [2, 3, 5, 6]  # the leaves only: evicting 3 exposes nothing
    for need in range(8):
        assert lazy(need).drop.tolist() == plan(score, need=need).drop.tolist()


def test_eviction_order_is_exact() -> None:
    score = [0.0, 5.0, 3.0, 1.0, 2.0, 4.0, 6.0]
    # Greedy: 3 (1.0); leaves 2 (3.0), 5 (4.0), 6 (6.0) -> 2; 1 exposed (5.0) -> 5 (4.0);
    # 4 exposed (2.0) -> 4; then 1 (5.0); 0 exposed (0.0) -> 0; finally 6.
    for need, expected in [
        (1, [3]),
        (2, [2, 3]),
        (3, [2, 3, 5]),
        (4, [2, 3, 4, 5]),
        (5, [1, 2, 3, 4, 5]),
        (6, [0, 1, 2, 3, 4, 5]),
        (7, list(range(7))),
    ]:
        assert plan(score, need=need).drop.tolist() == expected, need


def test_ties_go_deeper_first_then_by_index() -> None:
    # All scores equal (an LRU tie: one request touched them all): deepest leaves first.
    assert plan([1.0] * 7, need=3).drop.tolist() == [2, 3, 5]
    assert plan([1.0] * 7, need=4).drop.tolist() == [1, 2, 3, 5]


def test_never_evicts_in_use_nodes_even_when_short() -> None:
    in_use = [True, True, True, False, False, False, False]
    res = plan([0.0] * 7, need=7, in_use=in_use)
    assert res.drop.tolist() == [3, 4, 5, 6]  # frees what it can: 3 blocks short


def test_waiting_nodes_go_last() -> None:
    res = plan([0.0, 5.0, 3.0, 1.0, 2.0, 4.0, 6.0], need=1, waiting=[1, 1, 0, 1, 0, 0, 0])
    assert res.drop.tolist() == [2]  # 3 scores lower but a queued request waits on it


def test_offloads_victims_and_drops_lowest_cpu_leaves_on_overflow() -> None:
    # Nodes 2 and 3 are in CPU; HBM must free 2 blocks; CPU has 1 free block.
    in_hbm = [True, True, False, False, True, True, True]
    score = [9.0, 8.0, 1.0, 7.0, 2.0, 3.0, 6.0]
    res = plan(score, need=2, in_hbm=in_hbm, cpu=True, free_cpu=1)
    # HBM leaves: 1 (its children are in CPU), 5, 6 -> victims 5 (3.0), 4 exposed (2.0) -> 4.
    # Two offloads, one free CPU block: the CPU drops its lowest leaf, 2 (1.0).
    assert res.offload.tolist() == [4, 5]
    assert res.drop.tolist() == [2]


def test_a_victim_below_every_cpu_leaf_is_dropped_not_offloaded() -> None:
    in_hbm = [True, True, False, False, True, True, True]
    score = [9.0, 8.0, 5.0, 7.0, 6.0, 0.5, 6.5]
    res = plan(score, need=1, in_hbm=in_hbm, cpu=True, free_cpu=0)
    assert res.offload.tolist() == [] and res.drop.tolist() == [5]


def test_offload_min_score_drops_hopeless_victims() -> None:
    planner = PlacementPlanner(offload_min_score=0.1)
    score = [0.9, 0.8, 0.05, 0.7, 0.6, 0.5, 0.95]
    res = plan(score, need=2, cpu=True, free_cpu=10, calibrated=True, planner=planner)
    assert res.drop.tolist() == [2] and res.offload.tolist() == [5]
    uncal = plan(score, need=2, cpu=True, free_cpu=10, calibrated=False, planner=planner)
    assert uncal.drop.tolist() == [] and uncal.offload.tolist() == [2, 5]


def test_pins_best_first_from_roots_within_the_cap() -> None:
    score = [0.9, 0.8, 0.95, 0.3, 0.6, 0.99, 0.7]
    planner = PlacementPlanner(max_pinned_frac=0.5, pin_min_score=0.5)  # cap = 3 of 7 blocks
    res = plan(score, need=0, calibrated=True, planner=planner)
    # Roots 0 (0.9), 6 (0.7): 0; then children 1 (0.8), 4 (0.6) join: 1; then 2 (0.95).
    assert res.pin.tolist() == [0, 1, 2]
    assert plan(score, need=0, calibrated=False, planner=planner).pin.tolist() == []


def test_prefetch_loads_waiting_cpu_nodes_parents_first_within_budget() -> None:
    in_hbm = [True, False, False, False, True, False, True]
    waiting = [2, 2, 1, 2, 0, 0, 0]
    planner = PlacementPlanner(prefetch_reserve_frac=0.0)
    res = plan(
        [0.5] * 7, need=0, in_hbm=in_hbm, waiting=waiting, cpu=True, free_hbm=2, planner=planner
    )
    assert res.prefetch.tolist() == [1, 3]  # 1 (2 waiting), then its child 3 (2) before 2 (1)
    res = plan(
        [0.5] * 7, need=0, in_hbm=in_hbm, waiting=waiting, cpu=True, free_hbm=5, planner=planner
    )
    assert res.prefetch.tolist() == [1, 3, 2]


@st.composite
def forests(draw: st.DrawFn) -> tuple[list[PrefixNodeView], int, int]:
    n = draw(st.integers(1, 24))
    nodes: list[PrefixNodeView] = []
    depth: list[int] = []
    for i in range(n):
        parent = draw(st.integers(-1, i - 1))
        depth.append(0 if parent < 0 else depth[parent] + 1)
        in_cpu = parent >= 0 and nodes[parent].location is KVLocation.CPU or draw(st.booleans())
        nodes.append(
            PrefixNodeView(
                node_id=f"n{i}",
                parent_id=None if parent < 0 else f"n{parent}",
                num_tokens=draw(st.integers(1, 64)),
                num_blocks=draw(st.integers(1, 4)),
                location=KVLocation.CPU if in_cpu else KVLocation.HBM,
                hit_count=draw(st.integers(0, 5)),
                last_access_s=float(draw(st.integers(0, 100))),
                in_use=False,
                depth=depth[-1],
                num_waiting_refs=draw(st.integers(0, 2)),
            )
        )
    # in_use marks whole prefixes in HBM (what running requests hold)
    used = draw(st.sets(st.integers(0, n - 1), max_size=3))
    marked = set()
    by_id = {nd.node_id: nd for nd in nodes}
    for i in used:
        node: PrefixNodeView | None = nodes[i]
        while node is not None and node.location is KVLocation.HBM:
            marked.add(node.node_id)
            node = by_id.get(node.parent_id) if node.parent_id else None
    nodes = [dataclasses.replace(nd, in_use=nd.node_id in marked) for nd in nodes]
    return nodes, draw(st.integers(0, 40)), draw(st.integers(0, 10))


@settings(max_examples=150, deadline=None)
@given(forests(), st.floats(0.0, 1.0), st.integers(1, 60), st.booleans())
def test_planner_invariants(
    case: tuple[list[PrefixNodeView], int, int], cap_frac: float, total: int, calibrated: bool
) -> None:
    nodes, need, free_cpu = case
    rng = np.random.default_rng(len(nodes) + need)
    scores = rng.random(len(nodes))
    planner = PlacementPlanner(max_pinned_frac=cap_frac, pin_min_score=0.2)
    decision = planner.plan(
        nodes,
        scores,
        needed_hbm_blocks=need,
        free_hbm_blocks=3,
        free_cpu_blocks=free_cpu,
        total_hbm_blocks=total,
        calibrated=calibrated,
    )
    has_cpu = free_cpu > 0 or any(nd.location is KVLocation.CPU for nd in nodes)
    check_placement(nodes, decision, has_cpu_tier=has_cpu)  # prefix-closed, applicable
    by_id = {nd.node_id: nd for nd in nodes}
    pinned = sum(by_id[i].num_blocks for i, a in decision.actions.items() if a is Placement.PIN)
    assert pinned <= int(cap_frac * total)
    for nid, action in decision.actions.items():
        if by_id[nid].in_use:
            assert action not in (Placement.DROP, Placement.OFFLOAD)
    # It frees what was needed unless every HBM node that is not in use is already a victim.
    freed = sum(
        by_id[i].num_blocks
        for i, a in decision.actions.items()
        if a in (Placement.DROP, Placement.OFFLOAD) and by_id[i].location is KVLocation.HBM
    )
    evictable = sum(
        nd.num_blocks for nd in nodes if nd.location is KVLocation.HBM and not nd.in_use
    )
    assert freed >= min(need, evictable)
    if not calibrated:
        assert Placement.PIN not in decision.actions.values()
    # CPU occupancy after the plan fits: offloads <= free CPU + CPU blocks dropped.
    offloaded = sum(
        by_id[i].num_blocks for i, a in decision.actions.items() if a is Placement.OFFLOAD
    )
    cpu_dropped = sum(
        by_id[i].num_blocks
        for i, a in decision.actions.items()
        if a is Placement.DROP and by_id[i].location is KVLocation.CPU
    )
    assert offloaded <= free_cpu + cpu_dropped


def test_planner_rejects_bad_fractions() -> None:
    with pytest.raises(ValueError, match="max_pinned_frac must be in"):
        PlacementPlanner(max_pinned_frac=1.5)
