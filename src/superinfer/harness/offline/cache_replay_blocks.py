"""Replays of a block trace through the request-level block caches of
:mod:`superinfer.policy_core.reuse_adaptive`: ARC, S3-FIFO and the adaptive reuse predictor
(model: ``offline.cache_eval``).

The HBM tier is the policy's cache; with a CPU tier, the blocks HBM evicts move to CPU memory,
which drops its least recently offloaded leaf (a block none of whose children is cached in either
tier) when full. A request's blocks found in CPU memory are loaded back to HBM, where the policy
sees them as misses (a key the policy remembers as a ghost counts as one).
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

from superinfer.harness.offline.cache_trace import (
    BlockTrace,
    ReplayResult,
    prefix_hits,
    record_hits,
)
from superinfer.policy_core.reuse_adaptive import AdaptiveCache, make_block_cache

__all__ = ["BLOCK_POLICIES", "replay_blocks"]

#: Policies replayed here.
BLOCK_POLICIES = ("arc", "s3fifo", "adaptive")


def replay_blocks(
    trace: BlockTrace, policy: str, capacity_frac: float, hbm_blocks: int, cpu_blocks: int = 0
) -> ReplayResult:
    """Replay ``trace`` under ``policy`` (one of :data:`BLOCK_POLICIES`, or ``lru`` / ``lfu``
    as request-level heaps) with ``hbm_blocks`` of HBM and ``cpu_blocks`` of CPU.

    The result's ``predictor`` holds the adaptive cache's metrics (leader, switches) and
    ``us_per_request``, the replay's wall time per request in µs (the placement work one request
    costs, shadow caches included).
    """
    start = time.perf_counter()
    parent = trace.parent.tolist()
    cache = make_block_cache(
        policy, hbm_blocks, parent, trace.depth.tolist(), cpu_capacity=cpu_blocks
    )
    tier = bytearray(trace.num_unique)  # 0 none, 1 HBM, 2 CPU
    kids_any = [0] * trace.num_unique
    cpu: OrderedDict[int, None] = OrderedDict()
    offsets = trace.offsets.tolist()
    flat = trace.blocks.tolist()
    arrival = trace.arrival_s.tolist()
    k = np.zeros(trace.num_requests, dtype=np.int64)
    k_hbm = np.zeros(trace.num_requests, dtype=np.int64)
    offloaded = 0
    for r in range(trace.num_requests):
        blocks = flat[offsets[r] : offsets[r + 1]]
        k[r], k_hbm[r] = prefix_hits(tier, blocks)
        for b in blocks:
            if tier[b] == 2:
                del cpu[b]
            elif tier[b] == 0:
                p = parent[b]
                if p >= 0:
                    kids_any[p] += 1
            tier[b] = 1
        for v in cache.request(blocks, arrival[r]):
            if cpu_blocks:
                tier[v] = 2
                cpu[v] = None
                offloaded += 1
            else:
                tier[v] = 0
                p = parent[v]
                if p >= 0:
                    kids_any[p] -= 1
        while len(cpu) > cpu_blocks:
            victim = next((b for b in cpu if kids_any[b] == 0), None)
            if victim is None:
                break
            del cpu[victim]
            tier[victim] = 0
            p = parent[victim]
            if p >= 0:
                kids_any[p] -= 1
    res = ReplayResult(policy, capacity_frac, hbm_blocks, cpu_blocks, offloaded_blocks=offloaded)
    record_hits(res, trace, k, k_hbm)
    res.wall_s = time.perf_counter() - start
    info: dict[str, object] = {"us_per_request": 1e6 * res.wall_s / max(trace.num_requests, 1)}
    if isinstance(cache, AdaptiveCache):
        info.update(cache.metrics())
    res.predictor = info
    return res
