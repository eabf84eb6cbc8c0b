"""The adaptive placement policy (``policy_core.kv_placement.AdaptivePlacementPolicy``): its
shadow caches score the experts by content, it follows the leader's order, and it starts as LRU."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from superinfer.policy_core import kv_placement_adaptive
from superinfer.policy_core.kv_baselines import LruCache, S3FifoCache
from superinfer.policy_core.kv_placement import LRUPlacementPolicy, S3FifoPlacementPolicy
from superinfer.policy_core.kv_placement_adaptive import (
    AdaptivePlacementPolicy,
    AdaptiveRegretPlacementPolicy,
)
from superinfer.policy_core.kv_placement_hazard import HazardPlacementPolicy, HazardShadow
from superinfer.policy_core.types import SLO, KVLocation, Placement, PrefixNodeView, RequestView

HOT_TOKENS, COLD_TOKENS = 100, 10
CHAT = SLO("chat", ttft_ms=1000.0)


def stream(periods: int) -> list[str]:
    """A hot prefix ``H`` read once every five accesses between one-time prompts ``x0, x1, ...``:
    four one-time prompts between two reads of ``H``, so a 4-slot LRU never hits ``H``."""
    out, x = [], 0
    for _ in range(periods):
        out.append("H")
        out.extend(f"x{x + i}" for i in range(4))
        x += 4
    return out


def engine_views(accesses: list[str], t: int) -> tuple[PrefixNodeView, ...]:
    """What an engine holding the 4 most recently used prompts shows after access ``t``: each a
    root node with a fresh node id on every call (as SGLang's re-inserted nodes get), its
    content key and only chunk key the prompt's name, its last access the instant of its last
    read."""
    last: dict[str, int] = {}
    for i, key in enumerate(accesses[: t + 1]):
        last[key] = i
    shown = sorted(last, key=last.__getitem__)[-4:]
    return tuple(
        PrefixNodeView(
            node_id=f"{key}@{t}", parent_id=None,
            num_tokens=HOT_TOKENS if key == "H" else COLD_TOKENS, num_blocks=1,
            location=KVLocation.HBM, hit_count=0, last_access_s=float(last[key]), in_use=False,
            content_key=key, chunk_keys=(key,),
        )
        for key in shown
    )  # fmt: skip


def test_the_expert_that_keeps_the_hot_prefix_takes_the_lead_and_its_order_is_applied() -> None:
    accesses = stream(6)
    policy = AdaptivePlacementPolicy(experts=("lru", "s3fifo"), half_life_tokens=math.inf,
                                     switch_margin=0.0, min_lead_tokens=0.0,
                                     follow=False)  # fmt: skip
    # The oracles: the same accesses (the first call sees the first four at once) through the
    # exactly tested caches of kv_baselines, 4 slots each (the most nodes shown at once).
    lru, s3 = LruCache[str](4), S3FifoCache[str](4)
    hits = {"lru": 0, "s3fifo": 0}
    switch_at = None
    plugins = {"lru": LRUPlacementPolicy(), "s3fifo": S3FifoPlacementPolicy()}
    decisions_differ = 0
    for t in range(3, len(accesses)):
        for key in accesses[: t + 1] if t == 3 else [accesses[t]]:
            tokens = HOT_TOKENS if key == "H" else COLD_TOKENS
            hits["lru"] += tokens if key in lru else 0
            hits["s3fifo"] += tokens if key in s3 else 0
            lru.access(key)
            s3.access(key)
        if switch_at is None and hits["s3fifo"] > hits["lru"]:
            switch_at = t
        views = engine_views(accesses, t)
        decision = policy.decide(views, float(t), 0, 0, 1, 4)
        assert policy.scores == hits
        assert policy.leader == ("lru" if switch_at is None else "s3fifo")
        # the decisions are those of the leader's own plugin, fed the same views all along
        by_plugin = {name: plugin.decide(views, float(t), 0, 0, 1, 4)
                     for name, plugin in plugins.items()}  # fmt: skip
        assert decision == by_plugin[policy.leader]
        decisions_differ += switch_at is not None and by_plugin["lru"] != by_plugin["s3fifo"]
    assert hits["lru"] == 0  # H comes back after four other prompts: LRU has dropped it
    # H's first read goes to S3-FIFO's small queue and leaves as a ghost; its second, a ghost
    # hit, puts it in the main queue; its third to sixth reads hit there.
    assert hits["s3fifo"] == 4 * HOT_TOKENS
    assert switch_at == 10 and policy.switches == [(8, "lru", "s3fifo")]  # call 1 at t = 3
    assert decisions_differ > 0  # after the switch, following S3-FIFO is not following LRU
    assert policy.metrics()["leader"] == "s3fifo"


def test_a_cold_start_decides_as_lru() -> None:
    nodes = tuple(
        PrefixNodeView(f"n{i}", None, 16, 1, KVLocation.HBM, 0, float(t), False)
        for i, t in enumerate((50.0, 10.0, 30.0, 20.0))
    )
    for need in (1, 2, 3):
        adaptive = AdaptivePlacementPolicy().decide(nodes, 100.0, 0, 0, need, 8)
        assert adaptive == LRUPlacementPolicy().decide(nodes, 100.0, 0, 0, need, 8)
    assert set(AdaptivePlacementPolicy().decide(nodes, 100.0, 0, 0, 2, 8).actions) == {"n1", "n3"}


def test_a_switch_needs_the_margin_and_the_minimum_lead() -> None:
    accesses = stream(6)
    # S3-FIFO's lead after H's reads 3-6 (t = 10, 15, 20, 25), in hit tokens and as a share of
    # the tokens accessed by then: 100 of 380 (0.263), 200 of 520 (0.385), 300 of 660 (0.455),
    # 400 of 800 (0.5); the last four one-time prompts bring the share to 400 / 840.
    cases = ((0.0, 400.0, "lru", []), (0.5, 0.0, "lru", []), (0.4, 0.0, "s3fifo", [18]),
             (0.3, 0.0, "s3fifo", [13]), (0.0, 299.0, "s3fifo", [18]))  # fmt: skip
    for margin, min_lead, leader, calls in cases:
        policy = AdaptivePlacementPolicy(
            experts=("lru", "s3fifo"), half_life_tokens=math.inf,
            switch_margin=margin, min_lead_tokens=min_lead,
        )  # fmt: skip
        for t in range(3, len(accesses)):
            policy.decide(engine_views(accesses, t), float(t), 0, 0, 1, 4)
        assert (policy.scores["s3fifo"], policy.accessed) == (400.0, 840.0)
        assert policy.leader == leader, (margin, min_lead)
        assert [call for call, _, _ in policy.switches] == calls


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"experts": ("lru", "lfu")}, "experts must be distinct names among"),
        ({"experts": ("lru", "lru")}, "experts must be distinct names among"),
        ({"experts": ()}, "experts must be distinct names among"),
        ({"half_life_tokens": 0.0}, "half_life_tokens must be > 0"),
        ({"switch_margin": -0.1}, "switch_margin and min_lead_tokens must be >= 0"),
    ],
)
def test_bad_options_are_one_line_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdaptivePlacementPolicy(**kwargs)  # type: ignore[arg-type]


def chunked(node_id: str, chunks: tuple[str, ...], t: float, parent: str | None = None,
            depth: int = 0) -> PrefixNodeView:  # fmt: skip
    return PrefixNodeView(node_id, parent, 16 * len(chunks), len(chunks), KVLocation.HBM, 0, t,
                          False, depth, content_key=chunks[-1], chunk_keys=chunks)  # fmt: skip


def test_a_hit_on_part_of_a_split_node_counts_its_chunks() -> None:
    """The engine shows a 3-chunk node, then splits it (a new node for its first chunk, read by
    a request that diverged after it): the shadows hit that chunk's 16 tokens, though no node
    with that key was shown before."""
    policy = AdaptivePlacementPolicy(experts=("lru", "s3fifo"), half_life_tokens=math.inf)
    policy.decide((chunked("n1", ("c1", "c2", "c3"), 1.0),), 1.0, 0, 0, 0, 8)
    assert (policy.scores, policy.accessed) == ({"lru": 0.0, "s3fifo": 0.0}, 48.0)
    split = (chunked("n2", ("c1",), 2.0), chunked("n1", ("c2", "c3"), 1.0, "n2", 1),
             chunked("n3", ("d2",), 2.0, "n2", 1))  # fmt: skip
    decision = policy.decide(split, 2.0, 0, 0, 1, 8)
    assert (policy.scores, policy.accessed) == ({"lru": 16.0, "s3fifo": 16.0}, 80.0)
    # LRU leads (cold start): of the two leaves, n1's chunks were read before n3's
    assert decision.actions == {"n1": Placement.DROP}


def test_a_partial_chunk_at_a_nodes_end_is_neither_read_nor_held() -> None:
    """A node with a content key and no whole chunk ending in it (a prompt's 7-token tail) adds
    nothing to the tokens read, and the shadows hold as many slots as whole chunks are shown."""
    policy = AdaptivePlacementPolicy(experts=("lru", "s3fifo"), half_life_tokens=math.inf)
    tail = PrefixNodeView("n2", "n1", 7, 1, KVLocation.HBM, 0, 1.0, False, 1, content_key="t")
    policy.decide((chunked("n1", ("c1", "c2"), 1.0), tail), 1.0, 0, 0, 0, 8)
    assert (policy.scores, policy.accessed) == ({"lru": 0.0, "s3fifo": 0.0}, 32.0)
    assert {name: shadow.capacity for name, shadow in policy._shadows.items()} == {
        "lru": 2, "s3fifo": 2}  # fmt: skip
    # a node without a content key (the simulator's hashed block) is one chunk, its id
    block = PrefixNodeView("b9", None, 16, 1, KVLocation.HBM, 0, 2.0, False)
    policy.decide((chunked("n1", ("c1", "c2"), 1.0), tail, block), 2.0, 0, 0, 0, 8)
    assert policy.accessed == 48.0 and "b9" in policy._shadows["lru"]


def test_regret_counts_the_reads_of_what_each_expert_would_have_evicted() -> None:
    """Each call asks for one block: every expert names its victim (its plugin's DROP, fed the
    same views); a later read of a named prompt is that expert's regret. LRU names ``H`` (the
    oldest of the four shown) before each of its reads from the second on, S3-FIFO before three
    of them, so S3-FIFO takes the lead once its regret is lower."""
    accesses = stream(6)
    policy = AdaptiveRegretPlacementPolicy(experts=("lru", "s3fifo"), half_life_tokens=math.inf,
                                           switch_margin=0.0, min_lead_tokens=0.0)  # fmt: skip
    plugins = {"lru": LRUPlacementPolicy(), "s3fifo": S3FifoPlacementPolicy()}
    named: dict[str, set[str]] = {"lru": set(), "s3fifo": set()}
    regret = {"lru": 0.0, "s3fifo": 0.0}
    leaders = []
    for t in range(3, len(accesses)):
        views = engine_views(accesses, t)
        for key in accesses[: t + 1] if t == 3 else [accesses[t]]:
            for name in named:
                if key in named[name]:
                    named[name].discard(key)
                    regret[name] += HOT_TOKENS if key == "H" else COLD_TOKENS
        decision = policy.decide(views, float(t), 0, 0, 1, 4)
        assert policy.regrets == regret
        by_plugin = {name: p.decide(views, float(t), 0, 0, 1, 4) for name, p in plugins.items()}
        for name, d in by_plugin.items():
            named[name] |= {v.key for v in views if v.node_id in d.actions}
        assert decision == by_plugin[policy.leader]
        leaders.append(policy.leader)
    assert regret == {"lru": 5 * HOT_TOKENS, "s3fifo": 3 * HOT_TOKENS}
    assert policy.switches == [(8, "lru", "s3fifo")]  # H's third read, t = 10
    assert leaders == ["lru"] * 7 + ["s3fifo"] * (len(accesses) - 10)


def prompt(t: int, key: str) -> RequestView:
    """Request ``t`` of :func:`stream`, its prompt one chunk keyed ``key``."""
    tokens = HOT_TOKENS if key == "H" else COLD_TOKENS
    return RequestView(f"r{t}", float(t), tokens, 1, CHAT, prompt_chunk_keys=(key,))


def test_prompts_are_read_once_each_and_the_nodes_touches_no_more() -> None:
    """With prompt keys the shadows read each request once, at arrival (those before the first
    eviction wait for it): the scores are the oracle caches' hits on the arrivals, though every
    node the engine shows was touched again at every call (a node-based reading would count
    each touch as a hit in every shadow)."""
    accesses = stream(6)
    policy = AdaptivePlacementPolicy(experts=("lru", "s3fifo"), half_life_tokens=math.inf,
                                     switch_margin=0.0, min_lead_tokens=0.0)  # fmt: skip
    lru, s3 = LruCache[str](4), S3FifoCache[str](4)
    hits = {"lru": 0, "s3fifo": 0}
    for t, key in enumerate(accesses):
        policy.observe_request(prompt(t, key))
        tokens = HOT_TOKENS if key == "H" else COLD_TOKENS
        hits["lru"] += tokens if key in lru else 0
        hits["s3fifo"] += tokens if key in s3 else 0
        lru.access(key)
        s3.access(key)
        if t < 3:
            assert policy.scores == {"lru": 0.0, "s3fifo": 0.0} and policy.accessed == 0.0
            continue
        touched = tuple(replace(v, last_access_s=float(t)) for v in engine_views(accesses, t))
        policy.decide(touched, float(t), 0, 0, 1, 4)
        assert policy.scores == hits
    assert policy.from_prompts and hits == {"lru": 0, "s3fifo": 4 * HOT_TOKENS}
    assert policy.accessed == 6 * HOT_TOKENS + 24 * COLD_TOKENS
    # at H's third arrival (t = 10), after 7 calls: the lead changes as a request arrives
    assert policy.switches == [(7, "lru", "s3fifo")]
    # the regret variant reads a prompt at once (its ghost lists need no size)
    regret = AdaptiveRegretPlacementPolicy()
    regret.observe_request(prompt(0, "H"))
    assert (regret.accessed, regret.from_prompts) == (HOT_TOKENS, True)
    regret.observe_request(RequestView("r1", 1.0, 5, 1, CHAT))  # no keys: nothing read
    assert regret.accessed == HOT_TOKENS


def test_a_read_hits_a_shadow_in_its_prefix_only() -> None:
    """A prefix cache serves a prompt's chunks up to the first it lacks: a 3-slot LRU shadow
    holding ``a`` but not ``x`` serves none of prompt ``(x, a)``, and one chunk of ``(a, b)``."""
    policy = AdaptivePlacementPolicy(experts=("lru",), half_life_tokens=math.inf)
    for t, chunks in enumerate((("a", "b", "c"), ("d",), ("x", "a"), ("a", "b"))):
        policy.observe_request(RequestView(f"r{t}", float(t), 16 * len(chunks), 1, CHAT,
                                           prompt_chunk_keys=chunks))  # fmt: skip
        if t == 0:  # the first eviction sizes the shadow: 3 whole chunks shown
            policy.decide((chunked("n1", ("s1", "s2", "s3"), 0.0),), 0.0, 0, 0, 0, 8)
        # LRU after each read (deepest chunk first), least recent first: c b a; b a d (c out);
        # d a x (b out); x b a (d out)
        assert policy.scores["lru"] == (16.0 if t == 3 else 0.0)
    assert list(policy._shadows["lru"].order) == ["x", "b", "a"]
    assert policy.accessed == 16 * 8


def test_after_a_switch_the_nodes_the_leaders_shadow_lacks_leave_first() -> None:
    """``follow``: once S3-FIFO leads (after H's third arrival), a node whose chunk S3-FIFO's
    shadow does not hold (``x8``, touched again by the engine) leaves before the S3-FIFO
    order's own victim (the oldest one-time prompt shown, ``x9``)."""
    accesses = stream(3)
    twins = [AdaptivePlacementPolicy(experts=("lru", "s3fifo"), half_life_tokens=math.inf,
                                     switch_margin=0.0, min_lead_tokens=0.0, follow=follow)
             for follow in (True, False)]  # fmt: skip
    for policy in twins:
        for t, key in enumerate(accesses):
            policy.observe_request(prompt(t, key))
            if t >= 3:
                policy.decide(engine_views(accesses, t), float(t), 0, 0, 1, 4)
        assert policy.leader == "s3fifo"
    held = [k for k in ("H", *(f"x{i}" for i in range(12))) if k in twins[0]._shadows["s3fifo"]]
    assert held == ["H", "x9", "x10", "x11"]
    t = len(accesses)
    x8, *others = engine_views(accesses, t - 1)
    views = (*others, replace(x8, last_access_s=float(t)))
    followed, plain = (p.decide(views, float(t), 0, 0, 1, 4) for p in twins)
    assert followed.actions == {"x8@14": Placement.DROP}
    assert plain.actions == {"x9@14": Placement.DROP}


def test_the_hazard_expert_learns_from_the_prompts_and_its_shadow_holds_the_best_scored() -> None:
    """The default experts include ``hazard``: its order reads each prompt at arrival, and its
    shadow keeps, after each read, the chunks that order's model scores highest."""
    policy = AdaptivePlacementPolicy(half_life_tokens=math.inf)
    assert policy.experts == ("lru", "s3fifo", "arc", "hazard")
    hazard = policy._orders["hazard"]
    assert isinstance(hazard, HazardPlacementPolicy)
    hazard.min_intervals, hazard.refit_reads = 1, 1
    policy.decide((chunked("n1", ("s1", "s2"), 0.0),), 0.0, 0, 0, 0, 8)  # shadows of 2 chunks
    for t, chunks in enumerate((("a",), ("b",), ("a",), ("c",), ("a",), ("d",))):
        policy.observe_request(RequestView(f"r{t}", float(t + 1), 16, 1, CHAT,
                                           prompt_chunk_keys=chunks))  # fmt: skip
    assert hazard.num_closed == 2 and hazard.fitted  # a: 2 s after its 1st read, then its 2nd
    shadow = policy._shadows["hazard"]
    keys = ["a", "b", "c", "d"]
    best = [keys[i] for i in np.argsort(hazard.key_scores(keys, 6.0))[-2:]]
    assert sorted(shadow._held) == sorted(best) and len(shadow) == 2


def test_the_hazard_shadow_trims_once_per_read_oldest_first_before_the_model_has_learned() -> None:
    model = HazardPlacementPolicy()
    shadow = HazardShadow(2, model)
    for t, key in enumerate(("a", "b", "c")):
        model.read((key,), float(t))
        assert shadow.access(key) == []
    assert len(shadow) == 3 and shadow.settle() == ["a"] and "a" not in shadow
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        HazardShadow(0, model)


def prompts_before_the_first_eviction(
    keys: str,
) -> tuple[AdaptivePlacementPolicy, HazardPlacementPolicy]:
    """An LRU + hazard ``adaptive`` that has seen one 16-token prompt per key (one chunk each,
    at 1 s, 2 s, ...) and no eviction yet; with its hazard order."""
    policy = AdaptivePlacementPolicy(experts=("lru", "hazard"), half_life_tokens=math.inf)
    hazard = policy._orders["hazard"]
    assert isinstance(hazard, HazardPlacementPolicy)
    for t, key in enumerate(keys, start=1):
        policy.observe_request(RequestView(f"r{t}", float(t), 16, 1, CHAT,
                                           prompt_chunk_keys=(key,)))  # fmt: skip
    return policy, hazard


def test_the_prompts_before_the_first_eviction_are_judged_as_of_each_read() -> None:
    """The prompts ``a b c d a`` (one chunk each, 1 s apart) arrive before the first eviction
    and wait; the first call sizes the shadows at 2 chunks and reads them in order. The hazard
    order (LRU before it has learned) learns each prompt as its shadow reads it: after ``c`` its
    shadow drops ``a`` (then the oldest), so the second ``a`` misses, as in LRU's shadow. Had
    the order read every prompt at arrival, the shadow would have trimmed with ``a`` read last
    (at 5 s), kept it, and scored a hit that it only knew of from the future."""
    policy, hazard = prompts_before_the_first_eviction("abcda")
    assert (hazard.num_closed, policy.accessed) == (0, 0.0)  # waiting: nothing read yet
    policy.decide((chunked("n1", ("s1", "s2"), 0.0),), 5.0, 0, 0, 0, 8)
    assert hazard.num_closed == 1 and hazard.now_s == 5.0  # a's second read closed its gap
    assert policy.scores == {"lru": 0.0, "hazard": 0.0} and policy.accessed == 80.0
    assert sorted(policy._shadows["hazard"]._held) == ["a", "d"]


def test_a_prompt_pushed_out_of_the_waiting_reads_still_teaches_the_hazard_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With room for 2 waiting reads (4,096 in use), the prompts ``a b a`` arrive before the
    first eviction: the first ``a`` is pushed out by the third and goes unjudged, but the
    hazard order reads it then (at 1 s), so the first call's flush of ``b, a`` closes ``a``'s
    2 s gap; the shadows judge only the 2 reads still waiting (32 tokens)."""
    monkeypatch.setattr(kv_placement_adaptive, "_MAX_PENDING", 2)
    policy, hazard = prompts_before_the_first_eviction("aba")
    assert dict(hazard._keys) == {"a": (1.0, 1)} and hazard.num_closed == 0
    assert [r[0] for r in policy._pending] == [("b",), ("a",)]
    policy.decide((chunked("n1", ("s1", "s2"), 0.0),), 5.0, 0, 0, 0, 8)
    assert dict(hazard._keys) == {"a": (3.0, 2), "b": (2.0, 1)} and hazard.num_closed == 1
    assert policy.accessed == 32.0
