"""What Belady keeps that the adaptive reuse predictor evicts, on the cells where Belady leads
the best simple policy by >= 5 points (issue 22).

For each cell (trace, HBM capacity, no CPU tier) the adaptive predictor's block cache
(:class:`~superinfer.policy_core.reuse_adaptive.AdaptiveCache`, default experts) is replayed;
every block it evicts is labelled **kept by Belady** when its next reference comes no later than
the farthest next reference Belady's MIN holds after that request at that capacity (MIN keeps
the ``C`` nearest next uses, so such a block would still be cached under MIN; an approximation,
as MIN's content differs). Per cell it writes the share of evictions so labelled, where they are
(a branching prefix: a block with two or more distinct child blocks seen so far, i.e. shared by
diverging prompts; a partial last block), and the AUC (0.5 = chance, 1 = perfect separation;
below 0.5: the smaller value marks the kept blocks) of single features at the eviction for
telling them from the rest: the decayed access counts of the LRFU experts (log2 F at the
eviction, half-lives 20 s and 200 s), the age since the last access, accesses so far, the age
over the block's EWMA gap between accesses (elapsed think time against its usual one, -1 after
one access), depth, distinct children seen (cross-user popularity of a prefix) and the number of
requests since the block was first seen.

Writes ``results/cache/gap_analysis.csv``.

    python benchmarks/cache_gap_analysis.py [--cells gen-agentic:0.05,...]
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from superinfer.harness.offline.cache_replay import next_use
from superinfer.harness.offline.cache_trace import BlockTrace, load_cache_trace
from superinfer.policy_core.reuse_adaptive import AdaptiveCache

#: Half-lives (s) of the decayed access counts reported as features (the LRFU experts').
LRFU_HALF_LIVES = (20.0, 200.0)

#: The 11 no-CPU-tier cells of targets.csv (git 2c3a4b4) where Belady led by >= 5 points.
CELLS = (
    "gen-agentic:0.02,gen-agentic:0.05,gen-agentic:0.1,"
    "gen-multi-turn:0.01,gen-multi-turn:0.02,gen-multi-turn:0.05,gen-multi-turn:0.1,"
    "mooncake:0.01,mooncake:0.02,mooncake:0.05,mooncake:0.1"
)


def belady_threshold(trace: BlockTrace, nxt: np.ndarray, capacity: int) -> np.ndarray:
    """Shape (R,): after request r, the farthest next use MIN still holds (R when it holds a
    block never used again, i.e. the cache is not full of reused blocks)."""
    never = trace.num_requests
    cached = np.zeros(trace.num_unique, dtype=bool)
    cur = np.full(trace.num_unique, never, dtype=np.int64)
    heap: list[tuple[int, int]] = []
    size = 0
    out = np.full(trace.num_requests, never, dtype=np.int64)
    off, flat, nx = trace.offsets.tolist(), trace.blocks.tolist(), nxt.tolist()
    for r in range(trace.num_requests):
        for o in range(off[r], off[r + 1]):
            b = flat[o]
            if not cached[b]:
                cached[b] = True
                size += 1
            cur[b] = nx[o]
            heapq.heappush(heap, (-nx[o], b))
        while size > capacity:
            neg, b = heapq.heappop(heap)
            if cached[b] and cur[b] == -neg:
                cached[b] = False
                size -= 1
        while heap and not (cached[heap[0][1]] and cur[heap[0][1]] == -heap[0][0]):
            heapq.heappop(heap)
        out[r] = -heap[0][0] if heap else never
    return out


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties half (Mann-Whitney)."""
    pos, neg = int(label.sum()), int((~label).sum())
    if not pos or not neg:
        return float("nan")
    ranks = pd.Series(score).rank(method="average").to_numpy()
    return float((ranks[label].sum() - pos * (pos + 1) / 2) / (pos * neg))


def analyse(trace: BlockTrace, frac: float) -> dict[str, object]:
    cap = max(1, int(frac * trace.num_unique))
    nxt = next_use(trace)
    thr = belady_threshold(trace, nxt, cap)
    cache = AdaptiveCache(cap, trace.parent.tolist(), trace.depth.tolist())
    off, flat, arrival = trace.offsets.tolist(), trace.blocks.tolist(), trace.arrival_s.tolist()
    u, never = trace.num_unique, trace.num_requests
    pending = [never] * u  # each block's next use, as of its last reference
    fan = [0] * u
    first_req = [-1] * u
    last = [0.0] * u
    acc = [0] * u
    gap = [math.nan] * u  # EWMA (weight 0.5) of the gaps between accesses, s
    log_f = {h: [-math.inf] * u for h in LRFU_HALF_LIVES}
    parent, depth, nx = trace.parent.tolist(), trace.depth.tolist(), nxt.tolist()
    partial = (trace.tokens < trace.block_tokens).tolist()
    rows: list[tuple[float, ...]] = []
    for r in range(trace.num_requests):
        lo, hi = off[r], off[r + 1]
        blocks = flat[lo:hi]
        now = arrival[r]
        for o, b in zip(range(lo, hi), blocks, strict=True):
            if first_req[b] < 0:
                first_req[b] = r
                if parent[b] >= 0:
                    fan[parent[b]] += 1
            else:
                g = now - last[b]
                gap[b] = g if gap[b] != gap[b] else 0.5 * (g + gap[b])
            for h, lf in log_f.items():
                x = lf[b] - (now - last[b]) / h
                lf[b] = x + math.log2(1.0 + 2.0**-x) if x > -60.0 else 0.0
            last[b] = now
            acc[b] += 1
            pending[b] = nx[o]
        for v in cache.request(blocks, now):
            age = now - last[v]
            rows.append((
                float(pending[v] <= thr[r] and pending[v] < never),
                float(pending[v] < never),
                *(log_f[h][v] - age / h for h in LRFU_HALF_LIVES),
                age,
                float(acc[v]),
                age / gap[v] if gap[v] == gap[v] and gap[v] > 0 else -1.0,
                float(depth[v]),
                float(fan[v]),
                float(r - first_req[v]),
                float(partial[v]),
            ))  # fmt: skip
    a = np.asarray(rows)
    keep = a[:, 0] > 0
    nh = len(LRFU_HALF_LIVES)
    out: dict[str, object] = {
        "trace": trace.name,
        "capacity_frac": frac,
        "capacity_blocks": cap,
        "evictions": len(a),
        "kept_by_belady_share": keep.mean(),
        "reused_ever_share": a[:, 1].mean(),
        "kept_in_branching_prefix_share": (a[keep, 6 + nh] >= 2).mean() if keep.any() else np.nan,
        "kept_partial_share": a[keep, 8 + nh].mean() if keep.any() else np.nan,
    }
    names = [f"lrfu{h:g}_log_f" for h in LRFU_HALF_LIVES] + [
        "age", "accesses", "age_over_gap", "depth", "children_seen", "requests_since_first",
    ]  # fmt: skip
    for i, name in enumerate(names, start=2):
        out[f"auc_{name}"] = auc(a[:, i], keep)
    out["adaptive_leader"] = cache.leader
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default=CELLS, help="comma list of trace:capacity")
    parser.add_argument("--out", default="results/cache")
    args = parser.parse_args()
    rows = []
    traces: dict[str, BlockTrace] = {}
    for cell in args.cells.split(","):
        name, frac = cell.split(":")
        tr = traces.setdefault(name, load_cache_trace(name))
        start = time.process_time()
        row = analyse(tr, float(frac))
        row["cpu_s"] = round(time.process_time() - start, 1)
        row["load_avg_1m"] = os.getloadavg()[0]
        rows.append(row)
        print(row, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "gap_analysis.csv", index=False, float_format="%.4g")
    print(f"wrote {out / 'gap_analysis.csv'}")


if __name__ == "__main__":
    main()
