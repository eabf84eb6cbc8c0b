"""``check_placement`` rejects every inapplicable placement decision, naming the problem."""

from __future__ import annotations

import pytest

from superinfer.policy_core.types import KVLocation, Placement, PlacementDecision, PrefixNodeView
from superinfer.policy_core.validation import PolicyError, check_placement

HBM, CPU = KVLocation.HBM, KVLocation.CPU


def node(
    nid: str, parent: str | None, loc: KVLocation = HBM, in_use: bool = False
) -> PrefixNodeView:
    return PrefixNodeView(nid, parent, 16, 1, loc, 0, 0.0, in_use)


# a -> b -> c (HBM, b in use, so a too) ; a -> d (HBM) -> e (CPU) -> f (CPU)
NODES = (
    node("a", None, in_use=True),
    node("b", "a", in_use=True),
    node("c", "b"),
    node("d", "a"),
    node("e", "d", CPU),
    node("f", "e", CPU),
)
D, OFF, P = Placement.DROP, Placement.OFFLOAD, Placement.PIN


@pytest.mark.parametrize(
    ("actions", "prefetch", "message"),
    [
        ({"zz": D}, (), "placement names 'zz', which is not a cached node"),
        ({"b": D}, (), "drop of 'b', which a running request uses"),
        ({"b": OFF}, (), "offload of 'b', which a running request uses"),
        ({"e": OFF}, (), "offload of 'e', which is not in HBM"),
        ({"f": P}, (), "pin of 'f', which is not in HBM"),
        ({}, ("c",), "prefetch names 'c', which is not a node in CPU memory"),
        ({}, ("f",), "prefetch of 'f' before its parent 'e'"),
        ({"f": D}, ("f",), "prefetch names 'f' twice or also drops it"),
        ({"e": D}, (), "drops 'e' but keeps its child 'f'"),
        ({"d": OFF}, ("e",), "moves 'd' to CPU but keeps its child 'e' in HBM"),
    ],
)
def test_rejects(actions: dict[str, Placement], prefetch: tuple[str, ...], message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("(", r"\(")):
        check_placement(NODES, PlacementDecision(actions, prefetch), has_cpu_tier=True)


def test_needs_a_cpu_tier_to_offload_or_prefetch() -> None:
    with pytest.raises(PolicyError, match="no CPU KV tier"):
        check_placement(NODES, PlacementDecision({"c": OFF}), has_cpu_tier=False)
    with pytest.raises(PolicyError, match="prefetch needs a CPU KV tier"):
        check_placement(NODES, PlacementDecision({}, ("e",)), has_cpu_tier=False)


@pytest.mark.parametrize(
    ("actions", "prefetch"),
    [
        ({}, ()),
        ({"c": D, "f": D}, ()),
        ({"c": OFF, "a": P, "b": P}, ()),
        ({"f": D, "e": D, "d": D}, ()),
        ({}, ("e", "f")),
        ({"c": D}, ("e",)),
    ],
)
def test_accepts(actions: dict[str, Placement], prefetch: tuple[str, ...]) -> None:
    check_placement(NODES, PlacementDecision(actions, prefetch), has_cpu_tier=True)
