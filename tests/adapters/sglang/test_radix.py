"""KV placement on the real ``UnifiedRadixCache``: the ``superinfer`` eviction order and pins on the
Python tree core; insert priorities from the policy's ranks on the Rust tree core."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pytest

from tests.adapters.sglang.gate import require_sglang

require_sglang()

import torch  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_LENGTH  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.common import release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402

from superinfer.adapters.hookspecs import hookimpl  # noqa: E402
from superinfer.adapters.manager import build_plugin_manager  # noqa: E402
from superinfer.adapters.sglang.apply import Band, SuperinferEvictionStrategy  # noqa: E402
from superinfer.adapters.sglang.config import AdapterConfig  # noqa: E402
from superinfer.adapters.sglang.plugin import SGLangAdapter  # noqa: E402
from superinfer.adapters.sglang.prefix_view import chunk_hashes, path_hash  # noqa: E402
from superinfer.adapters.sglang.view import EngineLimits  # noqa: E402
from superinfer.policy_core.types import (  # noqa: E402
    Placement,
    PlacementDecision,
    PrefixNodeView,
    RequestView,
    ScheduleDecision,
    StepState,
)
from tests.adapters.sglang.worlds import World, arrive, make_adapter, make_req  # noqa: E402

PREFIXES = {"A": 0, "B": 100, "C": 200, "D": 300}  # four disjoint 8-token prompts


class Placer:
    """A test placement plugin: applies ``actions`` (prefix name -> placement) to the nodes."""

    name = "placer"

    def __init__(self, node_of: dict[str, str], actions: dict[str, Placement]) -> None:
        self.node_of = node_of
        self.actions = actions
        self.seen: list[tuple[PrefixNodeView, ...]] = []
        self.sizes: list[tuple[int, int, int]] = []  # (free, needed, total) HBM blocks per call

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        return ScheduleDecision()

    @hookimpl
    def superinfer_kv_placement(
        self,
        nodes: tuple[PrefixNodeView, ...],
        now_s: float,
        free_hbm_blocks: int,
        needed_hbm_blocks: int,
        total_hbm_blocks: int,
    ) -> PlacementDecision:
        self.seen.append(nodes)
        self.sizes.append((free_hbm_blocks, needed_hbm_blocks, total_hbm_blocks))
        return PlacementDecision({self.node_of[n]: act for n, act in self.actions.items()})


def tokens(name: str, n: int = 8) -> array:
    return array("q", range(PREFIXES[name], PREFIXES[name] + n))


def fill(world: World) -> dict[str, str]:
    """Insert A, B, C, D (8 tokens each, touched in that order); their node ids by name."""
    node_of = {}
    for name in PREFIXES:
        value = world.allocator.alloc(8).to(torch.int64)
        res = world.cache.insert(InsertParams(key=RadixKey(tokens(name)), value=value))
        node_of[name] = str(res.last_device_node)
    return node_of


def cached(world: World) -> list[str]:
    """Names of the prefixes still fully in HBM."""
    return [
        name
        for name in PREFIXES
        if world.cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens(name)))).device_prefix_len
        == 8
    ]


def evict(adapter: SGLangAdapter, world: World, num_tokens: int) -> None:
    """``cache.evict`` with the adapter's AROUND hook on ``_evict`` in place."""
    original = UnifiedRadixCache._evict
    cache = world.cache
    cache._evict = lambda params, *a, **k: adapter.evict(original, cache, params, *a, **k)
    try:
        cache.evict(EvictParams(num_tokens=num_tokens))
    finally:
        del cache._evict


def placing(
    world: World, actions: dict[str, Placement], fraction: float = 0.25
) -> tuple[SGLangAdapter, Placer]:
    node_of = fill(world)
    placer = Placer(node_of, actions)
    adapter = make_adapter(placer, world=world, config=AdapterConfig(pin_budget_fraction=fraction))
    # What install() arranges for the caches SGLang builds: the strategy reads this adapter's book.
    world.cache.tree_core.eviction_strategy = SuperinferEvictionStrategy(lambda: adapter.book)
    return adapter, placer


def test_eviction_follows_the_placement_on_the_python_core() -> None:
    world = World(64, "superinfer", "python")
    actions = {"C": Placement.DROP, "B": Placement.OFFLOAD, "D": Placement.PIN}
    adapter, placer = placing(world, actions)
    evict(adapter, world, 8)
    assert cached(world) == ["A", "B", "D"]  # C dropped first, though A is least recent
    evict(adapter, world, 8)
    assert cached(world) == ["B", "D"]  # then LRU among the kept: A (B offloads only with HiCache)
    assert adapter.book.offloads_unavailable >= 1
    evict(adapter, world, 64)
    assert cached(world) == ["D"]  # the pin survives eviction of everything else
    assert world.cache.protected_size() == 8 and world.cache.evictable_size() == 0
    assert adapter.book.band(int(placer.node_of["C"])) is Band.DROP
    # every call carries the whole pool and asks for the tokens SGLang is about to evict
    assert [(needed, total) for _, needed, total in placer.sizes] == [(8, 64), (8, 64), (64, 64)]


def test_a_placement_policys_own_order_reaches_the_eviction() -> None:
    """A policy that ranks the newest prefix lowest (node ids grow with insertion; through the
    real planner) makes SGLang evict D, the newest, where its own LRU order evicts A: the policy
    is asked to free what SGLang evicts, and its victims become DROP nodes (before 2026-12-06 it
    was asked for nothing, so only pins reached the cache and every placement policy evicted as
    LRU)."""
    from superinfer.adapters.kv_placement import _PlacementHook
    from superinfer.policy_core.kv_placement import LRUPlacementPolicy

    class MRUPlacement(_PlacementHook, LRUPlacementPolicy):
        name = "mru"

        def decide(self, nodes: Any, *args: Any) -> Any:
            self.node_ids = {nd.key: int(nd.node_id) for nd in nodes}
            return super().decide(nodes, *args)

        def _scores(self, keys: Any, cols: Any, now_s: float, has_cpu_tier: bool) -> Any:
            ids = [self.node_ids[k] for k in keys]
            return -np.asarray(ids, float), None, False  # the newest node scores lowest

    world = World(64, "superinfer", "python")
    fill(world)
    pm = build_plugin_manager("fcfs")
    pm.register(MRUPlacement(), name="mru")
    adapter = SGLangAdapter(AdapterConfig(), pm.hook, EngineLimits())
    adapter.bind(world.allocator, world.cache)
    world.cache.tree_core.eviction_strategy = SuperinferEvictionStrategy(lambda: adapter.book)
    evict(adapter, world, 8)
    assert cached(world) == ["A", "B", "C"]


def test_the_registered_reuse_placement_policy_orders_a_real_cache() -> None:
    """The real ``reuse`` plugin takes every hookspec argument: the adapter must pass them."""

    world = World(64, "superinfer", "python")
    fill(world)
    pm = build_plugin_manager("fcfs", kv_policy="reuse")
    adapter = SGLangAdapter(AdapterConfig(), pm.hook, EngineLimits())
    adapter.bind(world.allocator, world.cache)
    world.cache.tree_core.eviction_strategy = SuperinferEvictionStrategy(lambda: adapter.book)
    evict(adapter, world, 8)
    assert len(cached(world)) == 3  # one of the four 8-token prompts evicted, none lost


def test_without_a_placement_the_order_is_sglangs_priority_then_lru() -> None:
    world = World(64, "superinfer", "python")
    fill(world)
    adapter = make_adapter("fcfs", world=world)
    evict(adapter, world, 16)
    assert cached(world) == ["C", "D"] and adapter.stats.placements == 0


def test_pins_stay_within_the_budget_and_are_released_when_no_longer_named() -> None:
    world = World(64, "superinfer", "python")
    pins = {"A": Placement.PIN, "B": Placement.PIN, "C": Placement.PIN}
    adapter, placer = placing(world, pins, fraction=0.25)  # 16 of 64 tokens
    evict(adapter, world, 64)
    assert cached(world) == ["A", "B"]
    assert (adapter.book.pinned_tokens, adapter.book.pins_refused) == (16, 1)
    placer.actions = {"A": Placement.PIN}
    evict(adapter, world, 64)
    assert cached(world) == ["A"] and adapter.book.pinned_tokens == 8
    placer.actions = {}
    evict(adapter, world, 64)
    assert cached(world) == [] and world.cache.protected_size() == 0


def test_node_views_are_exact_and_a_pin_is_not_a_use() -> None:
    world = World(64, "superinfer", "python")
    adapter, placer = placing(world, {"A": Placement.PIN})
    held = world.cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens("B"))))
    lock = world.cache.lock(held.last_device_node)  # a running request on B
    evict(adapter, world, 8)
    evict(adapter, world, 8)
    first, second = placer.seen
    by_id = {v.node_id: v for v in second}
    a, b = by_id[placer.node_of["A"]], by_id[placer.node_of["B"]]
    assert (a.num_tokens, a.num_blocks, a.parent_id, a.in_use) == (8, 8, None, False)
    assert b.in_use and b.hit_count == 1
    assert {v.node_id for v in first} == set(placer.node_of.values())
    assert len(second) == 3  # C (least recent unpinned, unused) went in the first eviction
    world.cache.unlock(lock)


def test_a_prefix_inserted_again_or_split_keeps_its_content_key() -> None:
    """SGLang gives a re-inserted prefix a new node id; its content key (the path hash of its
    tokens from the root) is the same, and a split leaves the hash of each path's end as it was:
    the policies' history and shadow caches follow the content across evictions."""
    world = World(64, "superinfer", "python")
    adapter, placer = placing(world, {})
    evict(adapter, world, 8)  # A (least recent) leaves
    keys = {v.node_id: v.content_key for v in placer.seen[0]}
    a_key = keys[placer.node_of["A"]]
    root = path_hash(0, b"None\x00None")  # no extra_key, no cache_salt
    assert a_key == f"{path_hash(root, range(0, 8)):x}"
    value = world.allocator.alloc(8).to(torch.int64)
    again = world.cache.insert(InsertParams(key=RadixKey(tokens("A")), value=value))
    assert str(again.last_device_node) != placer.node_of["A"]
    # B split after its 4th token by a prompt that shares those 4 tokens
    value = world.allocator.alloc(8).to(torch.int64)
    split = array("q", [*range(100, 104), *range(900, 904)])
    world.cache.insert(InsertParams(key=RadixKey(split), value=value))
    evict(adapter, world, 8)
    by_id = {v.node_id: v for v in placer.seen[1]}
    assert by_id[str(again.last_device_node)].content_key == a_key
    b = by_id[placer.node_of["B"]]
    assert (b.num_tokens, b.content_key) == (4, keys[placer.node_of["B"]])
    assert by_id[b.parent_id].content_key == f"{path_hash(root, range(100, 104)):x}"
    assert b.chunk_keys == ()  # 8 tokens from the root: no 16-token chunk ends in it


class Reader(Placer):
    """A placer that also keeps the views of the requests that arrive, and asks for their
    prompt keys (``reads_prompt_keys``, as the ``adaptive`` plugins do)."""

    reads_prompt_keys = True

    def __init__(self) -> None:
        super().__init__({}, {})
        self.arrived: list[RequestView] = []

    @hookimpl
    def superinfer_request_arrived(self, request: RequestView, now_s: float) -> None:
        self.arrived.append(request)


def test_a_new_requests_prompt_keys_are_the_chunk_keys_of_the_nodes_that_cache_it() -> None:
    """A 40-token prompt arrives with the keys of its two whole 16-token chunks (the 8-token
    tail has none); cached and split after its 20th token by a prompt that diverges there, its
    nodes carry the same keys, one each (positions 16 and 32 from the root)."""
    world = World(128, "superinfer", "python")
    reader = Reader()
    adapter = make_adapter(reader, world=world)
    arrive(adapter, [], make_req("r1", 40))
    keys = reader.arrived[0].prompt_chunk_keys
    root = path_hash(0, b"None\x00None")
    assert keys == (f"{path_hash(root, range(16)):x}", f"{path_hash(root, range(32)):x}")
    for ids in (range(40), [*range(20), *range(500, 520)]):
        value = world.allocator.alloc(len(ids)).to(torch.int64)
        world.cache.insert(InsertParams(key=RadixKey(array("q", ids)), value=value))
    evict(adapter, world, 1)
    by_tokens = {v.num_tokens: v for v in reader.seen[0] if v.parent_id is None}
    first = by_tokens[20]
    child = next(v for v in reader.seen[0] if v.parent_id == first.node_id and
                 v.content_key == f"{path_hash(root, range(40)):x}")  # fmt: skip
    assert first.chunk_keys + child.chunk_keys == keys
    # without a plugin that reads them (here a placement plugin that does not) the adapter
    # does not hash prompts
    Reader.reads_prompt_keys = False
    try:
        other = Reader()
        arrive(make_adapter(other, world=world), [], make_req("r2", 40))
    finally:
        Reader.reads_prompt_keys = True
    assert other.arrived[0].prompt_chunk_keys == ()


def test_chunk_hashes_mark_every_chunk_boundary_from_the_root_then_the_end() -> None:
    h0 = path_hash(0, [9])
    # tokens 5, 6, 7 at positions 2, 3, 4 from the root (chunk 2): boundaries after 5 and 7,
    # and 7 is the end too
    assert chunk_hashes(h0, 1, [5, 6, 7], 2) == [path_hash(h0, [5]), path_hash(h0, [5, 6, 7]),
                                                 path_hash(h0, [5, 6, 7])]  # fmt: skip
    # at positions 1, 2, 3: a boundary after 6, then the end
    assert chunk_hashes(h0, 0, [5, 6, 7], 2) == [path_hash(h0, [5, 6]), path_hash(h0, [5, 6, 7])]
    assert chunk_hashes(h0, 0, [5], 4) == [path_hash(h0, [5])]  # no boundary: the end alone
    assert path_hash(0, [1, 2]) == 2 * 1_000_003 + 3  # (0 * B + 2) * B + 3


def test_the_rust_core_orders_eviction_by_the_ranks_inserted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(128, "priority", "rust")
    tiers = {"t3": 3}
    low_first = EngineLimits(low_priority_values_first=True)
    adapter = make_adapter(_Tiering(tiers), world=world, limits=low_first)
    reqs = [
        make_req("chat", 8, first=0, slo="chat", max_new=2),
        make_req("batch", 8, first=100, slo="batch", max_new=2),
        make_req("t3", 8, first=200, slo="chat", max_new=2),
    ]
    queue: list[Any] = []
    arrive(adapter, queue, *reqs)
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    adapter.calc_priority(
        SchedulePolicy.calc_priority,
        SchedulePolicy("fcfs", world.cache, False, True, True),
        queue,
        ScheduleBatch(reqs=[]),
    )
    assert [adapter.records[r.rid].rank for r in reqs] == [0, 1, 3]
    batch = world.prefill(reqs)
    original = UnifiedRadixCache.checkpoint_into_tree
    monkeypatch.setattr(
        UnifiedRadixCache,
        "checkpoint_into_tree",
        lambda cache, req, **k: adapter.insert_with_rank(original, cache, req, **k),
    )
    for req in batch.reqs:
        req.finished_reason = FINISH_LENGTH(length=1)
        release_kv_cache(req, world.cache, checkpoint=True)
    # Scheduling priority follows --schedule-low-priority-values-first; eviction does not.
    assert [r.priority for r in reqs] == [0, 1, 3]
    got = []
    for _ in reqs:
        world.cache.evict(EvictParams(num_tokens=1))
        got.append([r.rid for r in reqs if _in_hbm(world, r)])
    assert got == [["chat", "batch"], ["chat"], []]


class _Tiering:
    name = "tiering"

    def __init__(self, tiers: dict[str, int]) -> None:
        self.tiers = tiers

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        return ScheduleDecision(tiers=dict(self.tiers.items()))


def _in_hbm(world: World, req: Any) -> bool:
    key = RadixKey(array("q", req.origin_input_ids))
    return world.cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len > 0
