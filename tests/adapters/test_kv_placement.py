"""The placement plugins through pluggy: registration, the hook call, decisions engines accept."""

from __future__ import annotations

import dataclasses

import pytest

from superinfer.adapters.kv_placement import ReusePlacement
from superinfer.adapters.manager import (
    UnknownPolicyError,
    available_kv_policies,
    build_plugin_manager,
)
from superinfer.policy_core.types import KVLocation, Placement, PrefixNodeView
from superinfer.policy_core.validation import check_placement


def chain(
    prefix: str,
    n: int,
    *,
    t: float,
    loc: KVLocation = KVLocation.HBM,
    in_use: bool = False,
    root: str | None = None,
) -> list[PrefixNodeView]:
    """n one-block nodes, each the child of the one before."""
    out = []
    for d in range(n):
        out.append(
            PrefixNodeView(
                node_id=f"{prefix}{d}",
                parent_id=(f"{prefix}{d - 1}" if d else root),
                num_tokens=16,
                num_blocks=1,
                location=loc,
                hit_count=0,
                last_access_s=t,
                in_use=in_use,
                depth=d + (1 if root else 0),
                slo_classes=("chat",),
            )
        )
    return out


def call(pm: object, nodes: list[PrefixNodeView], **kw: int | float) -> object:
    args = {
        "now_s": 100.0,
        "free_hbm_blocks": 0,
        "free_cpu_blocks": 0,
        "needed_hbm_blocks": 0,
        "total_hbm_blocks": 32,
    }
    args.update(kw)
    return pm.hook.superinfer_kv_placement(nodes=tuple(nodes), **args)  # type: ignore[attr-defined]


def test_kv_policies_are_registered_entry_points() -> None:
    assert {"lru", "lfu", "reuse"} <= set(available_kv_policies())
    pm = build_plugin_manager("fcfs", kv_policy="reuse", kv_options={"min_labels": "5"})
    plugin = pm.get_plugin("kv_policy:reuse")
    assert isinstance(plugin, ReusePlacement) and plugin.min_labels == 5


def test_without_a_kv_policy_the_engine_keeps_its_own_eviction() -> None:
    pm = build_plugin_manager("fcfs")
    assert call(pm, chain("a", 3, t=1.0), needed_hbm_blocks=2) is None


def test_unknown_kv_policy_is_a_clear_error() -> None:
    match = (
        r"unknown kv policy 'nosuch'; registered: adaptive, adaptive-regret, arc, hazard, lfu, "
        r"lru, priority, reuse, s3fifo$"
    )
    with pytest.raises(UnknownPolicyError, match=match):
        build_plugin_manager("fcfs", kv_policy="nosuch")
    with pytest.raises(UnknownPolicyError, match="has no option 'bogus'"):
        build_plugin_manager("fcfs", kv_policy="reuse", kv_options={"bogus": "1"})


def test_lru_plugin_frees_the_oldest_unused_leaves() -> None:
    pm = build_plugin_manager("fcfs", kv_policy="lru")
    old = chain("old", 3, t=10.0)
    busy = chain("busy", 2, t=5.0, in_use=True)  # oldest of all, but a running request holds it
    new = chain("new", 2, t=90.0)
    nodes = old + busy + new
    decision = call(pm, nodes, needed_hbm_blocks=4)
    check_placement(nodes, decision, has_cpu_tier=False)  # type: ignore[arg-type]
    assert decision.actions == {  # type: ignore[attr-defined]
        "old2": Placement.DROP,
        "old1": Placement.DROP,
        "old0": Placement.DROP,
        "new1": Placement.DROP,
    }


def test_reuse_plugin_offloads_to_cpu_and_prefetches_for_waiting_requests() -> None:
    pm = build_plugin_manager("fcfs", kv_policy="reuse")
    hbm = chain("h", 4, t=50.0)
    cpu = chain("c", 2, t=20.0, loc=KVLocation.CPU, root="h0")
    cpu = [dataclasses.replace(nd, num_waiting_refs=1) for nd in cpu]
    nodes = hbm + cpu
    decision = call(pm, nodes, needed_hbm_blocks=2, free_cpu_blocks=8, free_hbm_blocks=0)
    check_placement(nodes, decision, has_cpu_tier=True)  # type: ignore[arg-type]
    assert decision.actions == {"h3": Placement.OFFLOAD, "h2": Placement.OFFLOAD}  # type: ignore[attr-defined]
    assert decision.prefetch == ()  # type: ignore[attr-defined]  # no room left in HBM
    later = call(pm, nodes, needed_hbm_blocks=0, free_cpu_blocks=8, free_hbm_blocks=8)
    assert later.prefetch == ("c0", "c1")  # type: ignore[attr-defined]  # parents first


def test_reuse_plugin_learns_across_calls_and_reports_its_switch() -> None:
    plugin = ReusePlacement(
        min_labels=32, min_labels_per_class=1, samples_per_call=8, initial_horizon_s=5.0
    )
    pm = build_plugin_manager("fcfs", kv_policy=plugin)
    for step in range(40):
        now = 2.0 * step
        hot = chain("hot", 4, t=now)  # touched every call
        cold = chain("cold", 4, t=0.0)
        nodes = hot + cold
        decision = call(pm, nodes, now_s=now, needed_hbm_blocks=1)
        check_placement(nodes, decision, has_cpu_tier=False)  # type: ignore[arg-type]
    m = plugin.metrics()
    assert m["num_calls"] == 40 and m["hbm_model"]["mode"] == "model"
    assert m["hbm_model"]["switched_at_s"] is not None
    # Calibrated now: the cold chain goes first, deepest block first, and the hot chain (4
    # blocks, within the cap of 0.2 x 32 = 6) is pinned.
    assert decision.actions == {  # type: ignore[attr-defined]
        "cold3": Placement.DROP,
        **{f"hot{d}": Placement.PIN for d in range(4)},
    }


@pytest.mark.parametrize("name", ["arc", "s3fifo"])
def test_arc_and_s3fifo_plugins_keep_the_reused_chain_over_a_newer_one(name: str) -> None:
    # "a" is seen at t=1 and again at t=3 (ARC: T2; S3-FIFO: counter 1 in S), "b" once at t=4.
    # LRU would free the older "a"; ARC and S3-FIFO free "b", deepest block first.
    from superinfer.adapters.kv_placement import ArcPlacement, S3FifoPlacement

    plugin = {"arc": ArcPlacement, "s3fifo": S3FifoPlacement}[name]()
    pm = build_plugin_manager("fcfs", kv_policy=plugin)
    call(pm, chain("a", 2, t=1.0), now_s=1.0)
    nodes = chain("a", 2, t=3.0) + chain("b", 2, t=4.0)
    call(pm, nodes, now_s=4.0)
    decision = call(pm, nodes, now_s=5.0, needed_hbm_blocks=2)
    check_placement(nodes, decision, has_cpu_tier=False)  # type: ignore[arg-type]
    assert decision.actions == {"b1": Placement.DROP, "b0": Placement.DROP}  # type: ignore[attr-defined]
    lru = build_plugin_manager("fcfs", kv_policy="lru")
    call(lru, chain("a", 2, t=1.0), now_s=1.0)
    assert set(call(lru, nodes, now_s=5.0, needed_hbm_blocks=2).actions) == {"a0", "a1"}  # type: ignore[attr-defined]
