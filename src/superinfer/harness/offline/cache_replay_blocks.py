"""Replays of a block trace through the request-level block caches of
:mod:`superinfer.policy_core.reuse_adaptive`: ARC, S3-FIFO and the adaptive reuse predictor
(model: ``offline.cache_eval``).

The HBM tier is the policy's cache; with a CPU tier, the blocks HBM evicts move to CPU memory,
which drops its least leaf (a block none of whose children is cached in either tier) when full,
in the order of the cache's ``cpu_key``: the least recently offloaded first, and for the
adaptive predictor while LFU leads, the least LFU-counted first, and once its union leader is
not LRU, the blocks that leader does not hold first (re-keyed as ``cpu_rekey`` names them). A
request's blocks found in
CPU memory are loaded back to HBM, where the policy sees them as misses (a key the policy
remembers as a ghost counts as one).
"""

from __future__ import annotations

import heapq
import time

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
    cpu: dict[int, tuple[int, int]] = {}  # block -> its key in the CPU heap
    cpu_seq: dict[int, int] = {}  # block -> its offload sequence number
    heap: list[tuple[int, int, int]] = []  # (key..., block), lazy
    seq, epoch = 0, cache.cpu_epoch
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
                del cpu_seq[b]
            elif tier[b] == 0:
                p = parent[b]
                if p >= 0:
                    kids_any[p] += 1
            tier[b] = 1
        for v in cache.request(blocks, arrival[r]):
            if cpu_blocks:
                tier[v] = 2
                key = cache.cpu_key(v, seq)
                cpu_seq[v] = seq
                seq += 1
                cpu[v] = key
                heapq.heappush(heap, (key[0], key[1], v))
                offloaded += 1
            else:
                tier[v] = 0
                p = parent[v]
                if p >= 0:
                    kids_any[p] -= 1
        if cache.cpu_epoch != epoch:  # the cache orders its CPU tier differently now
            epoch = cache.cpu_epoch
            cpu = {b: cache.cpu_key(b, cpu_seq[b]) for b in cpu}
            heap = [(k[0], k[1], b) for b, k in cpu.items()]
            heapq.heapify(heap)
        else:
            for b in cache.cpu_rekey():  # blocks whose order in the CPU tier changed
                if b in cpu:
                    key = cache.cpu_key(b, cpu_seq[b])
                    if key != cpu[b]:
                        cpu[b] = key
                        heapq.heappush(heap, (key[0], key[1], b))
        held: list[tuple[int, int, int]] = []
        while len(cpu) > cpu_blocks and heap:
            entry = heapq.heappop(heap)
            victim = entry[2]
            if cpu.get(victim) != entry[:2]:
                continue  # loaded back (or re-offloaded since)
            if kids_any[victim]:
                held.append(entry)
                continue
            del cpu[victim]
            del cpu_seq[victim]
            tier[victim] = 0
            p = parent[victim]
            if p >= 0:
                kids_any[p] -= 1
                if held and kids_any[p] == 0:  # a held parent may have become a leaf
                    for e in held:
                        heapq.heappush(heap, e)
                    held = []
        for e in held:
            heapq.heappush(heap, e)
        if len(heap) > 4 * cpu_blocks + 1024:
            heap = [(k[0], k[1], b) for b, k in cpu.items()]
            heapq.heapify(heap)
    res = ReplayResult(policy, capacity_frac, hbm_blocks, cpu_blocks, offloaded_blocks=offloaded)
    record_hits(res, trace, k, k_hbm)
    res.wall_s = time.perf_counter() - start
    info: dict[str, object] = {"us_per_request": 1e6 * res.wall_s / max(trace.num_requests, 1)}
    if isinstance(cache, AdaptiveCache):
        info.update(cache.metrics())
    res.predictor = info
    return res
