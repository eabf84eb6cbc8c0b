"""Offline prefix-cache evaluator: replay a trace's KV block hashes through LRU, LFU, the reuse
predictor and Belady's MIN at several capacities, with and without a CPU tier.

Model of the replay (the same for every policy):

- Requests are processed one at a time in arrival order. A request's **prefix hit** is the
  longest leading run of its blocks that are cached (HBM or CPU); a block after the first miss
  is recomputed even if cached, as in vLLM's and SGLang's prefix caches. Then every block of the
  request is in HBM (hits loaded, misses computed), and the policy brings the cache back within
  capacity. The capacity counts blocks kept for reuse; the running request's own KV is not
  counted (all requests are done before the next arrives).
- ``block_hit_rate`` = prefix-hit blocks / blocks requested. ``token_hit_rate`` = sum over
  requests of ``min(k * block_tokens, prompt_tokens)`` / prompt tokens, for a k-block hit (the
  last block is usually partial), as in ``shared/data/traces/README.md``.
- **With a CPU tier** (``cpu_tier = True``), CPU memory holds ``cpu_ratio`` x the HBM capacity.
  HBM evictions go to CPU (exclusive tiers); a CPU hit counts as a hit in both rates (it saves
  the prefill) and costs a PCIe load, counted separately in ``hit_rates_detail.csv``
  (``cpu_block_hit_rate``, ``offloaded_blocks``).
- LRU, LFU and the predictor evict through the same :class:`TierPlanner` (leaves only, lowest
  keep-score first, deeper first on ties); they differ only in the score: LRU the last access
  instant, LFU the accesses since insertion (ties by recency), the predictor P(reuse within its
  horizon) after its LRU cold start.
- Belady's MIN (Belady, IBM Systems Journal 1966) keeps the blocks with the nearest next use
  (bypassing blocks never used again), ties broken deeper-first. A block's parent is in every
  request that holds the block, so its next use is never later: MIN's cache is prefix-closed and
  its plain hits are prefix hits; MIN maximizes plain hits, which bound every policy's prefix
  hits, so it is optimal here. With a CPU tier, its HBM holds the ``C_hbm`` nearest next uses
  and the union the ``C_hbm + C_cpu`` nearest (MIN at each capacity; the union may prefetch
  freely), an upper bound for both rates.
"""

from __future__ import annotations

import heapq
import json
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from superinfer.harness.errors import DataError, TraceFormatError, UserError
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, manifest, write_atomic
from superinfer.harness.workload.data import trace_path
from superinfer.harness.workload.traces import MOONCAKE_BLOCK_TOKENS, TraceRow, load_mooncake_jsonl
from superinfer.policy_core.reuse import NodeColumns, ReusePredictor, ReusePredictorConfig
from superinfer.policy_core.tiers import ScoreFn, TierPlanner

__all__ = [
    "CACHE_TRACES",
    "HIT_RATE_COLUMNS",
    "POLICIES",
    "BlockTrace",
    "CacheEvalConfig",
    "ReplayResult",
    "block_trace",
    "load_cache_trace",
    "replay",
    "replay_ordered",
    "run_cache_eval",
    "write_cache_eval",
    "write_cache_report",
]

POLICIES = ("lru", "lfu", "predictor", "belady")
#: The columns of ``hit_rates.csv`` (issue 6), in this order.
HIT_RATE_COLUMNS = (
    "trace",
    "policy",
    "capacity_frac",
    "cpu_tier",
    "block_hit_rate",
    "token_hit_rate",
)
#: ``--trace`` names of traces with block hashes.
CACHE_TRACES = {"mooncake": "conversation_trace.jsonl"}
DEFAULT_CAPACITY_FRACS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
#: CPU tier size as a multiple of the HBM prefix-cache capacity. A DGX H100 has 2 TB of host
#: DRAM for 640 GB of HBM (3.2x), of which weights take a part, so KV space in DRAM is ~4x.
DEFAULT_CPU_RATIO = 4.0
#: The cold-start window reported separately, in s.
COLD_START_S = 600.0

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class BlockTrace:
    """A trace as dense block ids: request r's blocks are ``blocks[offsets[r]:offsets[r+1]]``.

    Attributes:
        name: trace name (the ``trace`` column).
        arrival_s: shape (R,), arrival of each request, s from the first.
        prompt_tokens: shape (R,).
        offsets: shape (R+1,).
        blocks: shape (sum of blocks,), dense block ids 0..U-1 in first-appearance order.
        parent: shape (U,), the block before each block in every prompt holding it, -1 for first.
        depth: shape (U,), the block's index in the prompts holding it.
        tokens: shape (U,), tokens of the block where it first appeared (< block_tokens when it
            was the partial last block).
        block_tokens: tokens per full block.
    """

    name: str
    arrival_s: FloatArray
    prompt_tokens: IntArray
    offsets: IntArray
    blocks: IntArray
    parent: IntArray
    depth: IntArray
    tokens: IntArray
    block_tokens: int

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)

    @property
    def num_unique(self) -> int:
        return len(self.parent)


def block_trace(
    rows: Sequence[TraceRow],
    name: str,
    *,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    source: object = "trace",
) -> BlockTrace:
    """Dense-id form of ``rows`` (sorted by arrival, as loaded).

    Raises:
        TraceFormatError: a request without block hashes, a hash repeated in one request, or a
            hash preceded by different hashes in two requests (not prefix-chained).
    """
    ids: dict[int, int] = {}
    parent: list[int] = []
    depth: list[int] = []
    tokens: list[int] = []
    flat: list[int] = []
    offsets = [0]
    for row in rows:
        if not row.block_hashes:
            raise TraceFormatError(source, row.line, "hash_ids", "no block hashes")
        if len(set(row.block_hashes)) != len(row.block_hashes):
            raise TraceFormatError(source, row.line, "hash_ids", "a hash repeats in one request")
        prev = -1
        last = len(row.block_hashes) - 1
        for d, h in enumerate(row.block_hashes):
            b = ids.get(h)
            if b is None:
                b = ids[h] = len(parent)
                parent.append(prev)
                depth.append(d)
                tokens.append(
                    row.prompt_tokens - block_tokens * last if d == last else block_tokens
                )
            elif parent[b] != prev:
                raise TraceFormatError(
                    source,
                    row.line,
                    "hash_ids",
                    f"hash {h} follows a different block than where it first appeared "
                    "(hashes are not prefix-chained)",
                )
            flat.append(b)
            prev = b
        offsets.append(len(flat))
    t0 = rows[0].arrival_s if rows else 0.0
    return BlockTrace(
        name=name,
        arrival_s=np.array([r.arrival_s - t0 for r in rows], dtype=np.float64),
        prompt_tokens=np.array([r.prompt_tokens for r in rows], dtype=np.int64),
        offsets=np.array(offsets, dtype=np.int64),
        blocks=np.array(flat, dtype=np.int64),
        parent=np.array(parent, dtype=np.int64),
        depth=np.array(depth, dtype=np.int64),
        tokens=np.array(tokens, dtype=np.int64),
        block_tokens=block_tokens,
    )


def load_cache_trace(trace: str, *, duration_s: float | None = None) -> BlockTrace:
    """The trace named ``trace`` (``mooncake``) or a Mooncake-format ``.jsonl`` path.

    Raises:
        UserError: unknown name, or an empty window.
        DataError: the file is missing.
        TraceFormatError: malformed file.
    """
    if trace in CACHE_TRACES:
        path, name = trace_path(CACHE_TRACES[trace]), trace
    elif Path(trace).is_file():
        path, name = Path(trace), Path(trace).stem
    else:
        known = ", ".join(CACHE_TRACES)
        raise UserError(f"unknown trace {trace!r}: give {known} or a Mooncake .jsonl file")
    rows = load_mooncake_jsonl(path)
    if duration_s is not None:
        if not duration_s > 0:
            raise UserError(f"--duration-s must be > 0, got {duration_s}")
        rows = [r for r in rows if r.arrival_s - rows[0].arrival_s < duration_s]
    return block_trace(rows, name, source=path)


@dataclass(slots=True)
class ReplayResult:
    """Counts of one replay; rates are derived properties.

    Attributes:
        policy: ``lru``, ``lfu``, ``predictor`` or ``belady``.
        capacity_frac: HBM capacity as a fraction of the trace's unique blocks.
        hbm_blocks, cpu_blocks: capacities in blocks (``cpu_blocks == 0``: no CPU tier).
        total_blocks, hit_blocks, cpu_hit_blocks: blocks requested, prefix hits (HBM + CPU),
            and of those the ones served from CPU.
        total_tokens, hit_tokens, cpu_hit_tokens: the same in prompt tokens.
        offloaded_blocks: HBM -> CPU copies.
        minute_*: shape (minutes,), the same counts per minute of arrival.
        predictor: the HBM model's :meth:`ReusePredictor.metrics` at the end (predictor only).
        cpu_predictor: the CPU-tier model's metrics (predictor with a CPU tier only).
        wall_s: wall time of the replay, s.
    """

    policy: str
    capacity_frac: float
    hbm_blocks: int
    cpu_blocks: int
    total_blocks: int = 0
    hit_blocks: int = 0
    cpu_hit_blocks: int = 0
    total_tokens: int = 0
    hit_tokens: int = 0
    cpu_hit_tokens: int = 0
    offloaded_blocks: int = 0
    minute_blocks: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    minute_hit_blocks: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    minute_tokens: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    minute_hit_tokens: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    minute_requests: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    predictor: dict[str, Any] | None = None
    cpu_predictor: dict[str, Any] | None = None
    wall_s: float = 0.0

    @property
    def cpu_tier(self) -> bool:
        return self.cpu_blocks > 0

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else math.nan

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.total_tokens if self.total_tokens else math.nan

    def window(self, minutes: int) -> tuple[float, float]:
        """Block and token hit rates over the first ``minutes`` minutes of arrivals."""
        b, hb = self.minute_blocks[:minutes].sum(), self.minute_hit_blocks[:minutes].sum()
        t, ht = self.minute_tokens[:minutes].sum(), self.minute_hit_tokens[:minutes].sum()
        return (hb / b if b else math.nan, ht / t if t else math.nan)


def _record(res: ReplayResult, trace: BlockTrace, k: IntArray, k_hbm: IntArray) -> None:
    """Fill ``res`` from per-request prefix hits ``k`` (HBM or CPU) and ``k_hbm`` (HBM only)."""
    n = np.diff(trace.offsets)
    bt = trace.block_tokens
    hit_tok = np.minimum(k * bt, trace.prompt_tokens)
    hbm_tok = np.minimum(k_hbm * bt, trace.prompt_tokens)
    res.total_blocks = int(n.sum())
    res.hit_blocks = int(k.sum())
    res.cpu_hit_blocks = int((k - k_hbm).sum())
    res.total_tokens = int(trace.prompt_tokens.sum())
    res.hit_tokens = int(hit_tok.sum())
    res.cpu_hit_tokens = int((hit_tok - hbm_tok).sum())
    minute = (trace.arrival_s // 60.0).astype(np.int64)
    size = int(minute.max()) + 1 if len(minute) else 0
    res.minute_requests = np.bincount(minute, minlength=size)
    res.minute_blocks = np.bincount(minute, weights=n, minlength=size).astype(np.int64)
    res.minute_hit_blocks = np.bincount(minute, weights=k, minlength=size).astype(np.int64)
    res.minute_tokens = np.bincount(minute, weights=trace.prompt_tokens, minlength=size).astype(
        np.int64
    )
    res.minute_hit_tokens = np.bincount(minute, weights=hit_tok, minlength=size).astype(np.int64)


# -------------------------------------------------------------------------------------------------
# Belady's MIN
# -------------------------------------------------------------------------------------------------


def _next_use(trace: BlockTrace) -> IntArray:
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
    nxt = _next_use(trace)
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
    _record(res, trace, k, k_hbm)
    res.wall_s = time.perf_counter() - start
    return res


# -------------------------------------------------------------------------------------------------
# LRU and LFU with heaps (the planner's order, without its O(cache) work per request)
# -------------------------------------------------------------------------------------------------


def replay_ordered(
    trace: BlockTrace, policy: str, capacity_frac: float, hbm_blocks: int, cpu_blocks: int = 0
) -> ReplayResult:
    """LRU or LFU in the :class:`TierPlanner`'s exact order, with lazy heaps.

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
        hit = 0
        while hit < len(blocks) and tier[blocks[hit]]:
            hit += 1
        in_hbm = 0
        while in_hbm < len(blocks) and tier[blocks[in_hbm]] == 1:
            in_hbm += 1
        k[r], k_hbm[r] = hit, in_hbm
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
    _record(res, trace, k, k_hbm)
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
# Online policies through the tier planner
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
    planner: TierPlanner | None = None,
    via_planner: bool = False,
) -> ReplayResult:
    """Replay ``trace`` under ``policy`` with ``hbm_blocks`` of HBM and ``cpu_blocks`` of CPU.

    Args:
        trace: the block trace.
        policy: one of :data:`POLICIES`.
        capacity_frac: recorded in the result (``hbm_blocks`` is the capacity used).
        hbm_blocks: HBM prefix-cache capacity in blocks (>= 1).
        cpu_blocks: CPU tier capacity in blocks (0: no CPU tier).
        predictor_config: the predictor's hyperparameters (``predictor`` only).
        planner: the tier planner (default :class:`TierPlanner`).
        via_planner: run LRU / LFU through the planner too, rather than
            :func:`replay_ordered` (same result, O(cache) work per request).

    Raises:
        UserError: unknown policy or a capacity < 1.
    """
    if policy == "belady":
        return replay_belady(trace, capacity_frac, hbm_blocks, cpu_blocks)
    if policy in ("lru", "lfu") and not via_planner:
        return replay_ordered(trace, policy, capacity_frac, hbm_blocks, cpu_blocks)
    if policy not in POLICIES:
        raise UserError(f"unknown cache policy {policy!r}; known: {', '.join(POLICIES)}")
    if hbm_blocks < 1 or cpu_blocks < 0:
        raise UserError(f"capacity must be >= 1 HBM block, got {hbm_blocks} (CPU {cpu_blocks})")
    start = time.perf_counter()
    planner = planner or TierPlanner()
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
    _record(res, trace, k, k_hbm)
    res.predictor = hbm_model.metrics() if hbm_model else None
    res.cpu_predictor = cpu_model.metrics() if cpu_model else None
    res.wall_s = time.perf_counter() - start
    return res


# -------------------------------------------------------------------------------------------------
# The evaluation grid and its files
# -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheEvalConfig:
    """What ``superinfer cache-eval`` runs.

    Attributes:
        trace: ``mooncake`` or a Mooncake-format ``.jsonl`` path.
        capacity_fracs: HBM capacities as fractions of the trace's unique blocks.
        cpu_ratio: CPU tier size as a multiple of the HBM capacity (0: no CPU-tier runs).
        policies: policies to replay.
        duration_s: replay only the first ``duration_s`` seconds of arrivals (``None``: all).
        jobs: worker processes.
        seed: the predictor's sampling seed.
    """

    trace: str = "mooncake"
    capacity_fracs: tuple[float, ...] = DEFAULT_CAPACITY_FRACS
    cpu_ratio: float = DEFAULT_CPU_RATIO
    policies: tuple[str, ...] = POLICIES
    duration_s: float | None = None
    jobs: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for p in self.policies:
            if p not in POLICIES:
                raise UserError(f"unknown cache policy {p!r}; known: {', '.join(POLICIES)}")
        if not self.policies:
            raise UserError("--policies is empty")
        if not self.capacity_fracs:
            raise UserError("--capacities is empty")
        for f in self.capacity_fracs:
            if not 0 < f <= 1:
                raise UserError(f"capacity fractions must be in (0, 1], got {f}")
        if self.cpu_ratio < 0:
            raise UserError(f"--cpu-ratio must be >= 0, got {self.cpu_ratio}")
        if self.jobs < 1:
            raise UserError(f"--jobs must be >= 1, got {self.jobs}")


def _one(args: tuple[BlockTrace, str, float, int, int, int]) -> ReplayResult:
    trace, policy, frac, hbm, cpu, seed = args
    cfg = ReusePredictorConfig(seed=seed) if policy == "predictor" else None
    return replay(trace, policy, frac, hbm, cpu, predictor_config=cfg)


def run_cache_eval(
    config: CacheEvalConfig, progress: Callable[[str], None] | None = None
) -> tuple[BlockTrace, list[ReplayResult]]:
    """Replay every policy x capacity x (with, without CPU tier) of ``config``.

    With-CPU-tier runs where HBM + CPU hold every unique block are skipped: nothing is ever
    dropped, so every policy hits every reuse (the infinite-cache rate).

    Returns:
        The trace and the results, ordered by CPU tier, capacity, then policy.
    """
    trace = load_cache_trace(config.trace, duration_s=config.duration_s)
    tiers = [0.0] + ([config.cpu_ratio] if config.cpu_ratio > 0 else [])
    tasks = []
    for ratio in tiers:
        for frac in sorted(config.capacity_fracs):
            hbm = max(1, int(frac * trace.num_unique))
            if ratio and hbm + int(ratio * hbm) >= trace.num_unique:
                continue  # the tiers hold every block: every policy has the infinite-cache rate
            for policy in config.policies:
                tasks.append((trace, policy, frac, hbm, int(ratio * hbm), config.seed))
    results: list[ReplayResult] = []
    if config.jobs == 1:
        for i, task in enumerate(tasks):
            if progress:
                progress(f"replay {i + 1}/{len(tasks)}: {task[1]} at {task[2]:g}")
            results.append(_one(task))
    else:
        with ProcessPoolExecutor(max_workers=config.jobs) as pool:
            for i, res in enumerate(pool.map(_one, tasks)):
                if progress:
                    progress(f"replay {i + 1}/{len(tasks)} done")
                results.append(res)
    return trace, results


def hit_rate_table(trace: BlockTrace, results: Sequence[ReplayResult]) -> pd.DataFrame:
    """``hit_rates.csv``: exactly :data:`HIT_RATE_COLUMNS`."""
    return pd.DataFrame(
        [
            (trace.name, r.policy, r.capacity_frac, r.cpu_tier, r.block_hit_rate, r.token_hit_rate)
            for r in results
        ],
        columns=list(HIT_RATE_COLUMNS),
    )


def detail_table(trace: BlockTrace, results: Sequence[ReplayResult]) -> pd.DataFrame:
    """``hit_rates_detail.csv``: the HBM / CPU split, transfers, cold start and predictor state."""
    minutes = int(COLD_START_S // 60)
    rows = []
    for r in results:
        cold_b, cold_t = r.window(minutes)
        p = r.predictor or {}
        rows.append(
            {
                **dict(zip(HIT_RATE_COLUMNS, hit_rate_table(trace, [r]).iloc[0], strict=True)),
                "hbm_blocks": r.hbm_blocks,
                "cpu_blocks": r.cpu_blocks,
                "hbm_block_hit_rate": (r.hit_blocks - r.cpu_hit_blocks) / r.total_blocks,
                "cpu_block_hit_rate": r.cpu_hit_blocks / r.total_blocks,
                "hbm_token_hit_rate": (r.hit_tokens - r.cpu_hit_tokens) / r.total_tokens,
                "cpu_token_hit_rate": r.cpu_hit_tokens / r.total_tokens,
                "offloaded_blocks": r.offloaded_blocks,
                "cpu_loaded_blocks": r.cpu_hit_blocks,
                "first_10min_block_hit_rate": cold_b,
                "first_10min_token_hit_rate": cold_t,
                "predictor_switched_at_s": p.get("switched_at_s"),
                "predictor_labels": p.get("num_labels"),
                "predictor_horizon_s": p.get("horizon_s"),
                "wall_s": r.wall_s,
            }
        )
    return pd.DataFrame(rows)


def minute_table(trace: BlockTrace, results: Sequence[ReplayResult]) -> pd.DataFrame:
    """``hit_rates_by_minute.csv``: hit rates per minute of arrival (cold start and drift)."""
    rows = []
    for r in results:
        for m in range(len(r.minute_blocks)):
            b, t = r.minute_blocks[m], r.minute_tokens[m]
            rows.append(
                {
                    "trace": trace.name,
                    "policy": r.policy,
                    "capacity_frac": r.capacity_frac,
                    "cpu_tier": r.cpu_tier,
                    "minute": m,
                    "requests": int(r.minute_requests[m]),
                    "block_hit_rate": r.minute_hit_blocks[m] / b if b else math.nan,
                    "token_hit_rate": r.minute_hit_tokens[m] / t if t else math.nan,
                }
            )
    return pd.DataFrame(rows)


def _plot(table: pd.DataFrame, minutes: pd.DataFrame, out_dir: Path, target_frac: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"lru": "tab:blue", "lfu": "tab:orange", "predictor": "tab:green", "belady": "black"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, col, label in zip(
        axes, ("block_hit_rate", "token_hit_rate"), ("blocks", "tokens"), strict=True
    ):
        for (policy, cpu), grp in table.groupby(["policy", "cpu_tier"], sort=False):
            grp = grp.sort_values("capacity_frac")
            ax.plot(
                grp.capacity_frac,
                grp[col],
                marker="o",
                ms=3,
                color=colors.get(str(policy)),
                ls="--" if cpu else "-",
                label=f"{policy}{' + CPU tier' if cpu else ''}",
            )
        ax.set_xscale("log")
        ax.axvline(target_frac, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("HBM capacity (fraction of unique blocks)")
        ax.set_title(f"prefix hit rate ({label})")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("hit rate")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    write_atomic(out_dir / "hit_rates.png", lambda p: fig.savefig(p, dpi=120, format="png"))
    plt.close(fig)

    sel = minutes[(minutes.capacity_frac == target_frac) & ~minutes.cpu_tier]
    if sel.empty:
        return
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for policy, grp in sel.groupby("policy", sort=False):
        ax.plot(grp.minute, grp.block_hit_rate, color=colors.get(str(policy)), label=str(policy))
    ax.axvline(COLD_START_S / 60, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("minute of the trace")
    ax.set_ylabel("block hit rate in that minute")
    ax.set_title(f"hit rate over time, HBM = {target_frac:g} of unique blocks, no CPU tier")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_atomic(
        out_dir / "hit_rates_by_minute.png", lambda p: fig.savefig(p, dpi=120, format="png")
    )
    plt.close(fig)


def _pct(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.2f}%"


def render_cache_report(
    trace: BlockTrace,
    config: CacheEvalConfig,
    table: pd.DataFrame,
    detail: pd.DataFrame,
    meta: dict[str, Any],
    target_frac: float = 0.1,
) -> str:
    """``report.md``: setup, definitions, the tables, the issue-6 target check, cold start."""
    lines = [
        "# Prefix-cache hit rates: LRU, LFU, reuse predictor, Belady",
        "",
        f"- Trace `{trace.name}`: {trace.num_requests:,} requests, {len(trace.blocks):,} block "
        f"references, {trace.num_unique:,} unique blocks of {trace.block_tokens} tokens, "
        f"{trace.arrival_s[-1] / 60:.1f} min.",
        f"- HBM capacities (fractions of unique blocks): "
        f"{', '.join(f'{f:g}' for f in sorted(config.capacity_fracs))}; CPU tier = "
        f"{config.cpu_ratio:g} x the HBM capacity (runs where HBM + CPU hold every block are "
        "skipped: every policy has the ideal rate there).",
        f"- Command: `{' '.join(meta.get('command', []))}`; git `{meta.get('git_sha')}`; "
        f"host {meta.get('host', {}).get('platform')} ({meta.get('host', {}).get('cpu_count')} "
        "CPUs).",
        "- Definitions (docs/kv-reuse.md): a block hit is a block of the longest cached prefix "
        "of a request; with a CPU tier a block found in CPU memory counts as a hit (it saves its "
        "prefill) and is reported separately in `hit_rates_detail.csv` (`cpu_block_hit_rate`), "
        "since it costs a PCIe load.",
        "",
        "## Hit rates",
        "",
    ]
    for cpu in sorted(table.cpu_tier.unique()):
        sub = table[table.cpu_tier == cpu]
        lines += [f"### {'With' if cpu else 'Without'} a CPU tier", ""]
        policies = list(dict.fromkeys(sub.policy))
        lines.append("| capacity | " + " | ".join(f"{p} blocks / tokens" for p in policies) + " |")
        lines.append("|---:|" + "---:|" * len(policies))
        for frac, grp in sub.groupby("capacity_frac"):
            by = grp.set_index("policy")
            cells = [
                f"{_pct(by.loc[p, 'block_hit_rate'])} / {_pct(by.loc[p, 'token_hit_rate'])}"
                for p in policies
            ]
            lines.append(f"| {frac:g} | " + " | ".join(cells) + " |")
        lines.append("")
    base = table[(table.capacity_frac == target_frac) & ~table.cpu_tier].set_index("policy")
    if {"lru", "predictor", "belady"} <= set(base.index):
        lru, pred, bel = (
            float(base.loc[p, "block_hit_rate"]) for p in ("lru", "predictor", "belady")
        )
        need = max(lru + 0.05, 0.9 * bel)
        verdict = "met" if pred >= need else f"missed by {100 * (need - pred):.2f} points"
        lines += [
            f"## Target at capacity {target_frac:g} (no CPU tier)",
            "",
            f"Predictor {_pct(pred)} vs LRU {_pct(lru)} (+{100 * (pred - lru):.2f} points; "
            f"target +5) and Belady {_pct(bel)} ({pred / bel:.3f} x; target 0.9 x): "
            f"**{verdict}** (needed {_pct(need)}).",
            "",
        ]
    cold = detail[(detail.capacity_frac == target_frac) & ~detail.cpu_tier]
    if not cold.empty:
        lines += [
            f"## Cold start (first {COLD_START_S / 60:.0f} minutes, capacity {target_frac:g})",
            "",
            "| policy | block hit rate | token hit rate | predictor switched at |",
            "|---|---:|---:|---:|",
        ]
        for _, row in cold.iterrows():
            sw = row.predictor_switched_at_s
            sw_txt = "–" if sw is None or pd.isna(sw) else f"{sw:.0f} s"
            lines.append(
                f"| {row.policy} | {_pct(row.first_10min_block_hit_rate)} | "
                f"{_pct(row.first_10min_token_hit_rate)} | {sw_txt} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    df.to_csv(path, index=False, float_format=CSV_FLOAT_FORMAT)


def _write_text(text: str, path: Path) -> None:
    path.write_text(text, encoding="utf-8")


def write_cache_eval(
    out_dir: Path,
    trace: BlockTrace,
    config: CacheEvalConfig,
    results: Sequence[ReplayResult],
    *,
    command: list[str] | None = None,
) -> dict[str, Path]:
    """Write ``hit_rates.csv``, ``hit_rates_detail.csv``, ``hit_rates_by_minute.csv`` and
    ``manifest.json`` into ``out_dir`` (each atomically), then the report and plots from them."""
    info = {
        "config": asdict(config),
        "trace": {
            "name": trace.name,
            "requests": trace.num_requests,
            "unique_blocks": trace.num_unique,
            "block_references": len(trace.blocks),
        },
        "predictor": {
            f"{r.capacity_frac:g}/{'cpu' if r.cpu_tier else 'hbm'}": {
                "hbm_model": r.predictor,
                "cpu_model": r.cpu_predictor,
            }
            for r in results
            if r.predictor
        },
    }
    meta = manifest(info, command=command)
    paths: dict[str, Path] = {}
    for name, df in (
        ("hit_rates.csv", hit_rate_table(trace, results)),
        ("hit_rates_detail.csv", detail_table(trace, results)),
        ("hit_rates_by_minute.csv", minute_table(trace, results)),
    ):
        paths[name] = out_dir / name
        write_atomic(paths[name], partial(_write_csv, df))
    write_atomic(
        out_dir / "manifest.json",
        partial(_write_text, json.dumps(meta, indent=2, default=str) + "\n"),
    )
    write_cache_report(out_dir, trace)
    paths.update({n: out_dir / n for n in ("report.md", "manifest.json", "hit_rates.png")})
    return paths


def write_cache_report(out_dir: Path, trace: BlockTrace | None = None) -> None:
    """(Re)write ``report.md`` and the plots of ``out_dir`` from its CSVs and manifest only.

    Raises:
        DataError: a file of the directory is missing.
    """
    try:
        meta = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
        table = pd.read_csv(out_dir / "hit_rates.csv")
        detail = pd.read_csv(out_dir / "hit_rates_detail.csv")
        minutes = pd.read_csv(out_dir / "hit_rates_by_minute.csv")
    except (OSError, ValueError) as exc:
        raise DataError(f"{out_dir}: not a cache-eval directory ({exc})") from None
    cfg = meta["config"]
    config = CacheEvalConfig(
        trace=cfg["trace"],
        capacity_fracs=tuple(cfg["capacity_fracs"]),
        cpu_ratio=cfg["cpu_ratio"],
        policies=tuple(cfg["policies"]),
        duration_s=cfg["duration_s"],
        jobs=cfg["jobs"],
        seed=cfg["seed"],
    )
    if trace is None:
        trace = load_cache_trace(config.trace, duration_s=config.duration_s)
    target = 0.1 if 0.1 in config.capacity_fracs else sorted(config.capacity_fracs)[0]
    _plot(table, minutes, out_dir, target)
    report = render_cache_report(trace, config, table, detail, meta, target)
    write_atomic(out_dir / "report.md", partial(_write_text, report))
