"""Replays of a block trace through one cache policy: Belady's MIN, plain LRU/LFU order, and
the placement planner with LRU, LFU or the reuse predictor (model: ``offline.cache_eval``)."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from superinfer.harness.errors import UserError
from superinfer.harness.offline.cache_replay_blocks import BLOCK_POLICIES, replay_blocks
from superinfer.harness.offline.cache_trace import (
    POLICIES,
    BlockTrace,
    FloatArray,
    IntArray,
    ReplayResult,
    prefix_hits,
    record_hits,
)
from superinfer.policy_core.kv_placement_plan import PlacementPlanner, ScoreFn
from superinfer.policy_core.reuse import NodeColumns, ReusePredictor, ReusePredictorConfig
from superinfer.policy_core.reuse_adaptive import adaptive_sample_rate

__all__ = [
    "belady_prefix_hits",
    "next_use",
    "replay",
    "replay_belady",
    "replay_ordered",
]


# -------------------------------------------------------------------------------------------------
# Belady's MIN
# -------------------------------------------------------------------------------------------------


def next_use(trace: BlockTrace) -> IntArray:
    """Shape (sum of blocks,): for each block reference, the request index of the block's next
    reference, or R (never again)."""
    r_of = np.repeat(np.arange(trace.num_requests), np.diff(trace.offsets))
    nxt = np.full(len(trace.blocks), trace.num_requests, dtype=np.int64)
    order = np.lexsort((r_of, trace.blocks))  # by block, then request
    same = trace.blocks[order[1:]] == trace.blocks[order[:-1]]
    nxt[order[:-1][same]] = r_of[order[1:][same]]
    return nxt


def belady_prefix_hits(trace: BlockTrace, capacity_blocks: int) -> IntArray:
    """Shape (R,): each request's prefix hit under Belady's MIN with bypass at this capacity.

    After each request the cache keeps the ``capacity_blocks`` blocks whose next use is nearest
    (ties: shallower first), dropping blocks never used again.
    """
    nxt = next_use(trace)
    never = trace.num_requests
    cached = np.zeros(trace.num_unique, dtype=bool)
    cur = np.full(trace.num_unique, never, dtype=np.int64)
    heap: list[tuple[int, int, int]] = []  # (-next use, -depth, block): pops the farthest
    size = 0
    k = np.zeros(trace.num_requests, dtype=np.int64)
    depth = trace.depth.tolist()
    for r in range(trace.num_requests):
        lo, hi = int(trace.offsets[r]), int(trace.offsets[r + 1])
        blocks = trace.blocks[lo:hi].tolist()
        hit = 0
        while hit < len(blocks) and cached[blocks[hit]]:
            hit += 1
        k[r] = hit
        for o, b in zip(range(lo, hi), blocks, strict=True):
            nu = int(nxt[o])
            if not cached[b]:
                cached[b] = True
                size += 1
            cur[b] = nu
            heapq.heappush(heap, (-nu, -depth[b], b))
        while size > capacity_blocks:
            neg, _, b = heapq.heappop(heap)
            if cached[b] and cur[b] == -neg:
                cached[b] = False
                size -= 1
    return k


def replay_belady(
    trace: BlockTrace, capacity_frac: float, hbm_blocks: int, cpu_blocks: int
) -> ReplayResult:
    """Belady's MIN at ``hbm_blocks`` (and at ``hbm_blocks + cpu_blocks`` for the union)."""
    start = time.perf_counter()
    k_hbm = belady_prefix_hits(trace, hbm_blocks)
    k = belady_prefix_hits(trace, hbm_blocks + cpu_blocks) if cpu_blocks else k_hbm
    res = ReplayResult("belady", capacity_frac, hbm_blocks, cpu_blocks)
    record_hits(res, trace, k, k_hbm)
    res.wall_s = time.perf_counter() - start
    return res


# -------------------------------------------------------------------------------------------------
# LRU and LFU with heaps (the planner's order, without its O(cache) work per request)
# -------------------------------------------------------------------------------------------------


def replay_ordered(
    trace: BlockTrace, policy: str, capacity_frac: float, hbm_blocks: int, cpu_blocks: int = 0
) -> ReplayResult:
    """LRU or LFU in the :class:`PlacementPlanner`'s exact order, with lazy heaps.

    The planner evicts the leaf with the least key (score, -depth, block id); LRU's score orders
    like the last access instant, LFU's like (accesses since insertion, last access). Neither
    key ever increases from a parent to its child (a child is only accessed with its parent, and
    leaves before it), so the least key in a tier is always one of its leaves and a heap of all
    nodes gives the planner's order. ``tests/harness/test_cache_eval.py`` checks the two
    implementations against each other.
    """
    if policy not in ("lru", "lfu"):
        raise UserError(f"ordered replay is for lru and lfu, not {policy!r}")
    start = time.perf_counter()
    lfu = policy == "lfu"
    tier = [0] * trace.num_unique  # 0 not cached, 1 HBM, 2 CPU
    count = [0] * trace.num_unique
    key: list[tuple[float, ...]] = [()] * trace.num_unique
    heaps: dict[int, list[tuple[float, ...]]] = {1: [], 2: []}
    used = {1: 0, 2: 0}
    depth = trace.depth.tolist()
    k = np.zeros(trace.num_requests, dtype=np.int64)
    k_hbm = np.zeros(trace.num_requests, dtype=np.int64)
    offloaded = 0
    offsets = trace.offsets.tolist()
    flat = trace.blocks.tolist()
    for r in range(trace.num_requests):
        now = float(trace.arrival_s[r])
        blocks = flat[offsets[r] : offsets[r + 1]]
        k[r], k_hbm[r] = prefix_hits(tier, blocks)
        for b in blocks:
            if tier[b] != 1:
                used[1] += 1
                if tier[b] == 2:
                    used[2] -= 1
            count[b] = count[b] + 1 if tier[b] else 1
            tier[b] = 1
            key[b] = (count[b], now, -depth[b], b) if lfu else (now, -depth[b], b)
            heapq.heappush(heaps[1], key[b])
        victims = _pop_least(heaps[1], key, tier, 1, used[1] - hbm_blocks)
        used[1] -= len(victims)
        for b in victims:
            if cpu_blocks:
                tier[b] = 2
                heapq.heappush(heaps[2], key[b])
            else:
                tier[b] = 0
        if cpu_blocks:
            used[2] += len(victims)
            dropped = _pop_least(heaps[2], key, tier, 2, used[2] - cpu_blocks)
            used[2] -= len(dropped)
            for b in dropped:
                tier[b] = 0
            offloaded += sum(1 for b in victims if tier[b] == 2)
    res = ReplayResult(policy, capacity_frac, hbm_blocks, cpu_blocks, offloaded_blocks=offloaded)
    record_hits(res, trace, k, k_hbm)
    res.wall_s = time.perf_counter() - start
    return res


def _pop_least(
    heap: list[tuple[float, ...]],
    key: list[tuple[float, ...]],
    tier: list[int],
    level: int,
    need: int,
) -> list[int]:
    """Pop the ``need`` least current entries of ``level`` (stale entries are skipped)."""
    out: list[int] = []
    while len(out) < need and heap:
        entry = heapq.heappop(heap)
        b = int(entry[-1])
        if tier[b] == level and key[b] == entry:
            out.append(b)
            tier[b] = -level  # taken: not popped twice
    for b in out:
        tier[b] = level
    return out


# -------------------------------------------------------------------------------------------------
# Online policies through the placement planner
# -------------------------------------------------------------------------------------------------


def _columns_fn(
    cached: IntArray,
    ppos: IntArray,
    now: float,
    last: FloatArray,
    first: FloatArray,
    accesses: FloatArray,
    interval: FloatArray,
    trace: BlockTrace,
) -> Callable[[IntArray], NodeColumns]:
    """The predictor's columns of cached nodes (indices into ``cached``) at ``now``."""
    children = np.bincount(ppos[ppos >= 0], minlength=len(cached)).astype(np.float64)

    def cols_of(idx: IntArray) -> NodeColumns:
        c = cached[idx]
        return NodeColumns(
            age_s=now - last[c],
            since_first_s=now - first[c],
            num_accesses=accesses[c],
            interval_ewma_s=interval[c],
            depth=trace.depth[c].astype(np.float64),
            tokens_per_block=trace.tokens[c].astype(np.float64),
            num_children=children[idx],
        )

    return cols_of


def _learned_score(
    predictor: ReusePredictor,
    cached: IntArray,
    cols_of: Callable[[IntArray], NodeColumns],
    now: float,
    last: FloatArray,
) -> Callable[[IntArray], FloatArray]:
    """Label due samples, take new ones, and return the predictor's score of cached nodes."""
    predictor.learn(now, lambda keys: last[keys])
    sample = predictor.sample_indices(len(cached))
    predictor.add_samples(cached[sample], cols_of(sample), now)
    return lambda idx: predictor.scores(cols_of(idx))


def replay(
    trace: BlockTrace,
    policy: str,
    capacity_frac: float,
    hbm_blocks: int,
    cpu_blocks: int = 0,
    *,
    predictor_config: ReusePredictorConfig | None = None,
    planner: PlacementPlanner | None = None,
    via_planner: bool = False,
) -> ReplayResult:
    """Replay ``trace`` under ``policy`` with ``hbm_blocks`` of HBM and ``cpu_blocks`` of CPU.

    Args:
        trace: the block trace.
        policy: one of :data:`POLICIES`, or ``adaptive-sN`` (shadows sampled at 1/N).
        capacity_frac: recorded in the result (``hbm_blocks`` is the capacity used).
        hbm_blocks: HBM prefix-cache capacity in blocks (>= 1).
        cpu_blocks: CPU tier capacity in blocks (0: no CPU tier).
        predictor_config: the predictor's hyperparameters (``predictor`` only).
        planner: the placement planner (default :class:`PlacementPlanner`).
        via_planner: run LRU / LFU through the planner too, rather than
            :func:`replay_ordered` (same result, O(cache) work per request).

    Raises:
        UserError: unknown policy or a capacity < 1.
    """
    if policy == "belady":
        return replay_belady(trace, capacity_frac, hbm_blocks, cpu_blocks)
    if policy in ("lru", "lfu") and not via_planner:
        return replay_ordered(trace, policy, capacity_frac, hbm_blocks, cpu_blocks)
    sampled = adaptive_sample_rate(policy) is not None
    if policy not in POLICIES and not sampled:
        raise UserError(f"unknown cache policy {policy!r}; known: {', '.join(POLICIES)}")
    if hbm_blocks < 1 or cpu_blocks < 0:
        raise UserError(f"capacity must be >= 1 HBM block, got {hbm_blocks} (CPU {cpu_blocks})")
    if policy in BLOCK_POLICIES or sampled:
        return replay_blocks(trace, policy, capacity_frac, hbm_blocks, cpu_blocks)
    start = time.perf_counter()
    planner = planner or PlacementPlanner()
    hbm_model = cpu_model = None
    if policy == "predictor":
        # One model per tier: each learns "reused before this tier would evict it", with the
        # horizon measured from that tier's own evictions.
        cfg = predictor_config or ReusePredictorConfig()
        hbm_model = ReusePredictor(cfg)
        if cpu_blocks:
            cpu_model = ReusePredictor(replace(cfg, seed=cfg.seed + 1))
    interval_weight = hbm_model.config.interval_weight if hbm_model else 0.5
    u = trace.num_unique
    tier = np.zeros(u, dtype=np.int8)  # 0 not cached, 1 HBM, 2 CPU
    last = np.full(u, -np.inf)
    first = np.zeros(u)
    accesses = np.zeros(u)  # every access remembered (the predictor's history)
    in_cache = np.zeros(u)  # accesses since insertion (LFU)
    interval = np.full(u, np.nan)
    pos = np.full(u, -1, dtype=np.int64)
    hbm_used = cpu_used = offloaded = 0
    k = np.zeros(trace.num_requests, dtype=np.int64)
    k_hbm = np.zeros(trace.num_requests, dtype=np.int64)

    for r in range(trace.num_requests):
        now = float(trace.arrival_s[r])
        b = trace.blocks[trace.offsets[r] : trace.offsets[r + 1]]
        t = tier[b]
        miss = np.flatnonzero(t == 0)
        k[r] = miss[0] if len(miss) else len(b)
        not_hbm = np.flatnonzero(t != 1)
        k_hbm[r] = not_hbm[0] if len(not_hbm) else len(b)
        seen = last[b] > -np.inf
        gap = now - last[b]
        old = interval[b]
        interval[b] = np.where(
            seen,
            np.where(np.isnan(old), gap, interval_weight * gap + (1 - interval_weight) * old),
            np.nan,
        )
        first[b[~seen]] = now
        last[b] = now
        accesses[b] += 1
        in_cache[b] = np.where(t > 0, in_cache[b] + 1, 1)
        cpu_here = int((t == 2).sum())
        hbm_used += len(b) - int((t == 1).sum())
        cpu_used -= cpu_here
        tier[b] = 1
        need = hbm_used - hbm_blocks
        if need <= 0:
            continue
        cached = np.flatnonzero(tier > 0)
        pos[cached] = np.arange(len(cached))
        par = trace.parent[cached]
        ppos = np.where(par >= 0, pos[np.maximum(par, 0)], -1)
        in_hbm = tier[cached] == 1
        score: FloatArray | ScoreFn
        cpu_score: ScoreFn | None = None
        if hbm_model is None:
            age = now - last[cached]
            # LRU is the predictor's cold-start fallback, computed the same way to the bit.
            lru_score = -age
            score = lru_score if policy == "lru" else in_cache[cached] + 1.0 / (1.0 + age)
        else:
            cols_of = _columns_fn(cached, ppos, now, last, first, accesses, interval, trace)
            score = _learned_score(hbm_model, cached, cols_of, now, last)
            if cpu_model is not None:
                cpu_score = _learned_score(cpu_model, cached, cols_of, now, last)
        plan = planner.plan_arrays(
            score=score,
            cpu_score=cpu_score,
            parent=ppos,
            depth=trace.depth[cached],
            num_blocks=np.ones(len(cached), dtype=np.int64),
            in_hbm=in_hbm,
            needed_hbm_blocks=need,
            free_hbm_blocks=0,
            free_cpu_blocks=cpu_blocks - cpu_used,
            total_hbm_blocks=hbm_blocks,
            has_cpu_tier=cpu_blocks > 0,
            calibrated=hbm_model is not None and hbm_model.calibrated,
            pins=False,
        )
        dropped = cached[plan.drop]
        from_hbm = int(in_hbm[plan.drop].sum())
        moved = cached[plan.offload]
        tier[dropped] = 0
        tier[moved] = 2
        hbm_used -= from_hbm + len(moved)
        cpu_used += len(moved) - (len(dropped) - from_hbm)
        offloaded += len(moved)
        if hbm_model is not None:
            victims = np.concatenate([dropped[in_hbm[plan.drop]], moved])
            hbm_model.observe_evictions(now - last[victims])
        if cpu_model is not None:
            cpu_model.observe_evictions(now - last[dropped])
    res = ReplayResult(policy, capacity_frac, hbm_blocks, cpu_blocks, offloaded_blocks=offloaded)
    record_hits(res, trace, k, k_hbm)
    res.predictor = hbm_model.metrics() if hbm_model else None
    res.cpu_predictor = cpu_model.metrics() if cpu_model else None
    res.wall_s = time.perf_counter() - start
    return res
