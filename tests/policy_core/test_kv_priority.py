"""Priority-aware prefix-cache placement (``policy_core/kv_priority.py``) on hand-made caches."""

from __future__ import annotations

from superinfer.adapters.kv_placement import KV_POLICIES, PriorityPlacement
from superinfer.policy_core.kv_priority import PriorityPlacementPolicy
from superinfer.policy_core.types import KVLocation, Placement, PrefixNodeView
from superinfer.policy_core.validation import check_placement
from tests.factories import BATCH, CHAT, make_view


def node(
    nid: str, parent: str | None, last_access_s: float, classes: tuple[str, ...], depth: int = 0
) -> PrefixNodeView:
    return PrefixNodeView(
        node_id=nid,
        parent_id=parent,
        num_tokens=64,
        num_blocks=4,
        location=KVLocation.HBM,
        hit_count=0,
        last_access_s=last_access_s,
        in_use=False,
        depth=depth,
        slo_classes=classes,
    )


#: A chat prefix (c0 -> c1, used at 1 s) and two batch chains (b0 -> b1 at 5 s, x0 at 9 s): LRU
#: would evict the chat chain first.
NODES = (
    node("c0", None, 1.0, ("chat",)),
    node("c1", "c0", 1.0, ("chat",), depth=1),
    node("b0", None, 5.0, ("batch",)),
    node("b1", "b0", 5.0, ("batch",), depth=1),
    node("x0", None, 9.0, ("batch",)),
)


def decide(p: PriorityPlacementPolicy, needed: int, total: int = 100):  # noqa: ANN201
    d = p.decide(NODES, 10.0, 0, 0, needed, total)
    check_placement(NODES, d, has_cpu_tier=False)
    return d


def test_the_least_urgent_class_leaves_first_lru_within_it() -> None:
    p = PriorityPlacementPolicy()
    p.observe_request(make_view("a", slo=CHAT))
    p.observe_request(make_view("b", slo=BATCH))
    assert p.node_ranks(NODES).tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    # 8 blocks: the older batch chain (b1 leaf, then b0), not the older chat chain
    d = decide(p, needed=8)
    drops = {k for k, a in d.actions.items() if a is Placement.DROP}
    assert drops == {"b0", "b1"}
    # both chat nodes are pinned (8 of 20 pinnable blocks), since a batch request has arrived
    assert {k for k, a in d.actions.items() if a is Placement.PIN} == {"c0", "c1"}


def test_no_pins_until_a_less_urgent_class_arrives_and_within_the_cap() -> None:
    p = PriorityPlacementPolicy()
    p.observe_request(make_view("a", slo=CHAT))
    # only chat requests seen: the batch nodes' class is unknown, ranked last (evicted first),
    # but nothing is pinned: there is no less urgent class to protect chat from
    assert p.node_ranks(NODES).tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    d = decide(p, needed=4)
    assert d.actions == {"b1": Placement.DROP}
    p.observe_request(make_view("b", slo=BATCH))
    # a 20-block HBM pins at most 0.2 * 20 = 4 blocks: the chat root only (parents first on ties)
    d = decide(p, needed=4, total=20)
    assert d.actions == {"b1": Placement.DROP, "c0": Placement.PIN}


def test_a_class_keeps_its_most_urgent_priority_and_the_plugin_is_registered() -> None:
    p = PriorityPlacement()
    p.superinfer_request_arrived(make_view("a", slo=BATCH), 0.0)
    p.superinfer_request_arrived(make_view("b", slo=CHAT), 0.0)
    urgent_batch = make_view("c", slo=BATCH.__class__("batch", deadline_s=60.0, priority=-1))
    p.superinfer_request_arrived(urgent_batch, 0.0)
    p.superinfer_request_arrived(make_view("d", slo=BATCH), 0.0)
    assert p._rank == {"batch": -1, "chat": 0}
    assert KV_POLICIES["priority"] is PriorityPlacement
