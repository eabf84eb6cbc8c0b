"""The reuse-hazard placement policy (``policy_core.kv_placement_hazard``): what it learns from
the prompts read, its exact scores against the offline model's functions, its cold start (LRU
exactly), and the order it gives where LRU's is wrong."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from superinfer.adapters.kv_placement import KV_POLICIES, HazardPlacement
from superinfer.policy_core.kv_placement import LRUPlacementPolicy
from superinfer.policy_core.kv_placement_hazard import HazardPlacementPolicy
from superinfer.policy_core.reuse_hazard import AGE_EDGES_S, hazard_tables, rho_index
from superinfer.policy_core.types import SLO, KVLocation, Placement, PrefixNodeView, RequestView

CHAT = SLO("chat", ttft_ms=1000.0)


def arrive(policy: HazardPlacementPolicy, t: float, *chunks: str) -> None:
    policy.observe_request(RequestView(f"r{t}-{chunks[0]}", t, 16 * len(chunks), 1, CHAT,
                                       prompt_chunk_keys=chunks))  # fmt: skip


def node(key: str, last_access_s: float, chunks: tuple[str, ...] | None = None) -> PrefixNodeView:
    """A root node of one 16-token chunk ``key`` (or ``chunks``), in HBM, not in use."""
    chunks = (key,) if chunks is None else chunks
    return PrefixNodeView(
        node_id=f"n-{key}", parent_id=None, num_tokens=16 * len(chunks), num_blocks=len(chunks),
        location=KVLocation.HBM, hit_count=0, last_access_s=last_access_s, in_use=False,
        content_key=chunks[-1] if chunks else key, chunk_keys=chunks,
    )  # fmt: skip


def test_each_read_of_a_known_key_closes_one_interval_in_its_class_and_gap_bin() -> None:
    policy = HazardPlacementPolicy(refit_reads=1_000)
    for t in (0.0, 1.0, 3.0, 10.0):
        arrive(policy, t, "a")
    arrive(policy, 10.0, "b")
    assert policy.num_closed == 3
    expected = np.zeros((4, len(AGE_EDGES_S)))
    # gap 1 s after the 1st read (class 0), 2 s after the 2nd and 7 s after the 3rd (class 1)
    for cls, gap in ((0, 1.0), (1, 2.0), (1, 7.0)):
        expected[cls, bisect_right(AGE_EDGES_S, gap) - 1] += 1
    assert np.array_equal(np.asarray(policy.closed), expected)
    assert policy.fits == 0 and not policy.fitted


def test_the_density_is_the_offline_models_rho_of_the_closed_and_open_intervals() -> None:
    policy = HazardPlacementPolicy(classes=2, min_intervals=1, refit_reads=6)
    arrive(policy, 0.0, "a", "b", "c")
    arrive(policy, 4.0, "a", "b", "d")  # closes a and b at 4 s; the 6th read: a refit at 4 s
    assert policy.fits == 1 and policy.fitted
    closed = np.zeros(len(AGE_EDGES_S))
    closed[bisect_right(AGE_EDGES_S, 4.0) - 1] = 2
    censored = [np.zeros(len(AGE_EDGES_S)) for _ in range(2)]
    censored[0][bisect_right(AGE_EDGES_S, 4.0) - 1] = 1  # c, read once, 4 s ago
    censored[0][0] = 1  # d, read once, just now
    censored[1][0] = 2  # a and b, read twice, just now
    ages = np.array([0.5, 3.0, 30.0, 2.0])
    reads = np.array([1, 1, 2, 3])
    expected = []
    for age, n in zip(ages, reads, strict=True):
        cls = 0 if n == 1 else 1
        x, s, integral = hazard_tables(closed if cls == 0 else np.zeros(len(AGE_EDGES_S)),
                                       censored[cls])  # fmt: skip
        expected.append(np.interp(age, x, rho_index(s, integral)))
    assert np.array_equal(policy.density(ages, reads), np.asarray(expected))
    assert policy.density(ages, reads)[0] > 0  # class 0 has seen reuse after 4 s


def test_before_it_has_learned_its_decisions_are_lrus_exactly() -> None:
    policy, lru = HazardPlacementPolicy(min_intervals=3), LRUPlacementPolicy()
    arrive(policy, 0.0, "a", "b")
    arrive(policy, 1.0, "a", "b")  # 2 intervals closed: not yet learned
    nodes = tuple(node(k, t) for k, t in (("a", 1.0), ("b", 1.0), ("c", 0.5), ("d", 0.2)))
    for needed in (1, 2, 3):
        assert policy.decide(nodes, 2.0, 0, 0, needed, 8) == lru.decide(nodes, 2.0, 0, 0,
                                                                          needed, 8)  # fmt: skip
    assert not policy.fitted


def test_a_session_about_to_return_outlives_a_newer_prompt_that_never_returns() -> None:
    """Sessions come back every 10 s; one-time prompts never do. At 50 s the engine holds session
    ``s0``'s chunk, read 9 s ago (its next turn due in 1 s), and one-time prompt ``y``'s, read
    1 s ago. LRU drops the session; the hazard policy the one-time prompt."""
    policy = HazardPlacementPolicy(min_intervals=10, refit_reads=1)
    for t in range(41):
        for s in range(4):
            if t % 10 == s:  # session s reads at s, s + 10, s + 20, ...
                arrive(policy, float(t) + 1.0, f"s{s}")
        if t % 4 == 0:
            arrive(policy, float(t) + 0.5, f"x{t // 4}")
    arrive(policy, 49.0, "y")
    nodes = (node("s0", 41.0), node("y", 49.0))
    assert policy.fitted
    decision = policy.decide(nodes, 50.0, 0, 0, 1, 2)
    assert decision.actions == {"n-y": Placement.DROP}
    assert LRUPlacementPolicy().decide(nodes, 50.0, 0, 0, 1, 2).actions == {"n-s0": Placement.DROP}


class Scored(HazardPlacementPolicy):
    """Keeps the scores of its last call."""

    def _scores(self, *args: Any) -> Any:
        self.last = super()._scores(*args)
        return self.last


def test_a_node_is_scored_by_its_deepest_whole_chunk_and_unknown_ones_by_their_own_age() -> None:
    policy = Scored(classes=1, min_intervals=1, refit_reads=1)
    for t in (0.0, 10.0, 20.0):
        arrive(policy, t, "p", "q")
    # "pq": its deepest chunk q read 3 times, last at 20 s (the node's own last access, 22 s,
    # is a touch, not a read); "out": no whole chunk; "new": a chunk never read
    nodes = (node("pq", 22.0, ("p", "q")), node("out", 21.0, ()), node("new", 15.0, ("zz",)))
    policy.decide(nodes, 25.0, 0, 0, 0, 8)
    age = np.array([5.0, 4.0, 10.0])
    expected = policy.density(age, np.array([3, 1, 1])) - 1e-12 * age / (1.0 + age)
    score, cpu, calibrated = policy.last
    assert np.array_equal(np.asarray(score), expected) and cpu is None and not calibrated


def test_without_prompt_keys_it_learns_from_the_nodes_accesses() -> None:
    policy = HazardPlacementPolicy(min_intervals=2, refit_reads=1)
    for t in (1.0, 5.0, 9.0):
        policy.decide((node("a", t), node("b", t - 0.5)), t + 0.1, 0, 0, 0, 4)
    assert not policy.from_prompts
    assert policy.num_closed == 4 and policy.fitted  # a and b, twice each


def test_nodes_without_a_content_key_are_one_chunk_keyed_by_their_id() -> None:
    """An engine whose node ids name the content (TensorRT-LLM's hashed blocks: no
    ``content_key``) gets the same learning: each node is read as its id at its last access."""
    policy = HazardPlacementPolicy(min_intervals=2, refit_reads=1)
    for t in (1.0, 5.0, 9.0):
        nodes = tuple(replace(n, content_key=None, chunk_keys=())
                      for n in (node("a", t), node("b", t - 0.5)))  # fmt: skip
        assert [n.chunks for n in nodes] == [("n-a",), ("n-b",)]
        policy.decide(nodes, t + 0.1, 0, 0, 0, 4)
    assert policy.num_closed == 4 and policy.fitted
    assert list(policy._keys) == ["n-b", "n-a"]


def test_keys_beyond_max_keys_are_forgotten_least_recently_read_first() -> None:
    policy = HazardPlacementPolicy(max_keys=2)
    arrive(policy, 0.0, "a", "b")
    arrive(policy, 1.0, "c")
    arrive(policy, 2.0, "a")  # forgotten: a new key, no interval closed
    arrive(policy, 3.0, "c")
    assert policy.num_closed == 1 and policy.metrics()["keys"] == 2


@pytest.mark.parametrize("field", ["classes", "min_intervals", "refit_reads", "max_keys"])
def test_bad_settings_are_a_clear_error(field: str) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        HazardPlacementPolicy(**{field: 0})


def test_the_hazard_plugin_is_registered_and_asks_for_prompt_keys() -> None:
    assert KV_POLICIES["hazard"] is HazardPlacement
    assert HazardPlacement.reads_prompt_keys
