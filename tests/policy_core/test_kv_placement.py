"""The pure placement policies (``policy_core.kv_placement``) decide without pluggy, and the
plugins in ``adapters.kv_placement`` are exactly those policies behind the hook."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from superinfer.adapters import kv_placement as plugins
from superinfer.policy_core.kv_placement import (
    PLACEMENT_POLICIES,
    LFUPlacementPolicy,
    LRUPlacementPolicy,
    ReusePlacementPolicy,
)
from superinfer.policy_core.kv_placement_adaptive import ADAPTIVE_POLICIES
from superinfer.policy_core.types import KVLocation, Placement, PlacementDecision, PrefixNodeView
from superinfer.policy_core.validation import check_placement

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def chain(prefix: str, n: int, *, t: float, hits: int = 0) -> list[PrefixNodeView]:
    """n one-block HBM nodes, each the child of the one before."""
    return [
        PrefixNodeView(
            node_id=f"{prefix}{d}",
            parent_id=f"{prefix}{d - 1}" if d else None,
            num_tokens=16,
            num_blocks=1,
            location=KVLocation.HBM,
            hit_count=hits,
            last_access_s=t,
            in_use=False,
            depth=d,
            slo_classes=("chat",),
        )
        for d in range(n)
    ]


def decide(policy: object, nodes: list[PrefixNodeView], need: int) -> PlacementDecision:
    return policy.decide(tuple(nodes), 100.0, 0, 0, need, 32)  # type: ignore[attr-defined, no-any-return]


def test_lru_policy_drops_the_oldest_leaves_first() -> None:
    nodes = chain("old", 3, t=10.0) + chain("new", 2, t=90.0)
    d = decide(LRUPlacementPolicy(), nodes, 4)
    check_placement(nodes, d, has_cpu_tier=False)
    assert d.actions == {
        "old2": Placement.DROP,
        "old1": Placement.DROP,
        "old0": Placement.DROP,
        "new1": Placement.DROP,
    }
    assert d.prefetch == ()


def test_lfu_policy_keeps_the_frequently_used_chain_although_it_is_older() -> None:
    nodes = chain("hot", 2, t=10.0, hits=9) + chain("cold", 2, t=90.0)
    policy = LFUPlacementPolicy()
    decide(policy, nodes, 0)  # first sight: the history records every node's hits
    d = decide(policy, nodes, 2)
    assert d.actions == {"cold1": Placement.DROP, "cold0": Placement.DROP}


def test_no_nodes_is_an_empty_decision_and_still_counts_the_call() -> None:
    policy = LRUPlacementPolicy()
    assert decide(policy, [], 3) == PlacementDecision()
    assert policy.metrics() == {"policy": "lru", "num_calls": 1, "history_keys": 0}
    reuse = ReusePlacementPolicy()
    decide(reuse, [], 3)
    m = reuse.metrics()
    assert (m["num_calls"], m["cpu_model"], m["hbm_model"]["mode"]) == (1, None, "fallback_lru")


@pytest.mark.parametrize(
    "name", ["lru", "lfu", "reuse", "arc", "s3fifo", "adaptive", "adaptive-regret"]
)
def test_each_plugin_is_its_pure_policy_plus_the_hook(name: str) -> None:
    plugin_cls = plugins.KV_POLICIES[name]
    policies = {**PLACEMENT_POLICIES, **ADAPTIVE_POLICIES}
    assert issubclass(plugin_cls, policies[name]) and plugin_cls.name == name
    nodes = chain("a", 4, t=20.0) + chain("b", 3, t=60.0)
    kwargs = {
        "nodes": tuple(nodes),
        "now_s": 100.0,
        "free_hbm_blocks": 0,
        "free_cpu_blocks": 0,
        "needed_hbm_blocks": 3,
        "total_hbm_blocks": 32,
    }
    via_hook = plugin_cls().superinfer_kv_placement(**kwargs)  # type: ignore[attr-defined]
    assert via_hook == policies[name]().decide(**kwargs)
    assert via_hook.actions == {  # type: ignore[attr-defined]
        "a3": Placement.DROP,
        "a2": Placement.DROP,
        "a1": Placement.DROP,
    }


def test_the_kv_policy_entry_points_name_the_plugins() -> None:
    groups = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"]
    targets = groups["superinfer.kv_policies"]
    assert targets == {
        "lru": "superinfer.adapters.kv_placement:LRUPlacement",
        "lfu": "superinfer.adapters.kv_placement:LFUPlacement",
        "reuse": "superinfer.adapters.kv_placement:ReusePlacement",
        "arc": "superinfer.adapters.kv_placement:ArcPlacement",
        "s3fifo": "superinfer.adapters.kv_placement:S3FifoPlacement",
        "adaptive": "superinfer.adapters.kv_placement:AdaptivePlacement",
        "adaptive-regret": "superinfer.adapters.kv_placement:AdaptiveRegretPlacement",
        "hazard": "superinfer.adapters.kv_placement:HazardPlacement",
        "priority": "superinfer.adapters.kv_placement:PriorityPlacement",
    }
    for name, target in targets.items():
        module, attr = target.split(":")
        assert getattr(plugins, attr) is plugins.KV_POLICIES[name]
