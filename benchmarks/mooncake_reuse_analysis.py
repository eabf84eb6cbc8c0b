"""How predictable is reuse in the Mooncake conversation trace? The facts behind the predictor's
features and behind the gap it leaves to Belady (docs/kv-reuse.md).

Writes ``results/cache/reuse_analysis.csv`` (metric, value):

- reuse rate of blocks that were the partial last block of their request vs full blocks;
- for each request with new full blocks, whether any of them is ever reused (the conversation
  continues), and the AUC of request-level features for that outcome: prefix-hit blocks, prompt
  blocks, time since the previous turn, turns so far (AUC 0.5 = no signal);
- hit rate at 10 % capacity of LRU, Belady, and LRU that first evicts blocks never used again
  (a perfect dead-block oracle): how much of Belady's lead is knowing which blocks are dead.

    .venv/bin/python benchmarks/mooncake_reuse_analysis.py
"""

from __future__ import annotations

import argparse
import heapq
from pathlib import Path

import numpy as np
import pandas as pd

from superinfer.harness.offline.cache_eval import BlockTrace, belady_prefix_hits, load_cache_trace
from superinfer.harness.offline.cache_replay import next_use


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties."""
    ranks = pd.Series(score).rank(method="average").to_numpy()
    pos = label.sum()
    neg = len(label) - pos
    return float((ranks[label].sum() - pos * (pos + 1) / 2) / (pos * neg))


def lru_hits(trace: BlockTrace, capacity: int, nxt: np.ndarray | None) -> int:
    """Prefix hits of leaf LRU; with ``nxt``, blocks never used again are evicted first.

    Keys (alive, last request, -depth) never increase from parent to child, so the global
    minimum is always a leaf and a lazy heap implements the leaf order exactly."""
    cached: dict[int, tuple[int, int, int]] = {}
    heap: list[tuple[int, int, int, int]] = []
    hits = 0
    for r in range(trace.num_requests):
        lo, hi = int(trace.offsets[r]), int(trace.offsets[r + 1])
        blocks = trace.blocks[lo:hi].tolist()
        k = 0
        while k < len(blocks) and blocks[k] in cached:
            k += 1
        hits += k
        for o, b in zip(range(lo, hi), blocks, strict=True):
            alive = 1 if nxt is None or nxt[o] < trace.num_requests else 0
            key = (alive, r, -int(trace.depth[b]))
            cached[b] = key
            heapq.heappush(heap, (*key, b))
        while len(cached) > capacity:
            *key, b = heapq.heappop(heap)
            if cached.get(b) == tuple(key):
                del cached[b]
    return hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/cache/reuse_analysis.csv"))
    args = parser.parse_args()
    trace = load_cache_trace("mooncake")
    nxt = next_use(trace)
    rows: list[tuple[str, float]] = []
    n_blocks = np.diff(trace.offsets)
    is_last = np.zeros(len(trace.blocks), dtype=bool)
    is_last[trace.offsets[1:] - 1] = True
    first = np.zeros(len(trace.blocks), dtype=bool)
    _, first_idx = np.unique(trace.blocks, return_index=True)
    first[first_idx] = True
    reused = nxt < trace.num_requests
    for name, mask in (("partial_last_block", first & is_last), ("full_block", first & ~is_last)):
        rows.append((f"reuse_rate_{name}", float(reused[mask].mean())))
        rows.append((f"blocks_{name}", float(mask.sum())))

    # Request level: does the conversation continue (any new full block reused later)?
    seen_at: dict[int, float] = {}
    turns: dict[int, int] = {}
    feats, labels = [], []
    for r in range(trace.num_requests):
        lo, hi = int(trace.offsets[r]), int(trace.offsets[r + 1])
        blocks = trace.blocks[lo:hi].tolist()
        now = float(trace.arrival_s[r])
        k = 0
        while k < len(blocks) and blocks[k] in seen_at:
            k += 1
        new_full = list(range(lo + k, hi - 1))
        gap = now - seen_at[blocks[k - 1]] if k >= 2 else -1.0
        turn = turns.get(blocks[k - 1], 0) if k >= 2 else 0
        for b in blocks:
            seen_at[b] = now
            turns[b] = turns.get(b, 0) + 1
        if new_full:
            feats.append((k, len(blocks), gap, turn))
            labels.append(bool(reused[new_full].any()))
    x = np.asarray(feats, dtype=np.float64)
    y = np.asarray(labels)
    rows.append(("requests_with_new_full_blocks", float(len(y))))
    rows.append(("continuation_rate", float(y.mean())))
    for j, name in enumerate(
        ("prefix_hit_blocks", "prompt_blocks", "gap_since_prev_turn_s", "turns_so_far")
    ):
        rows.append((f"auc_continuation_{name}", auc(x[:, j], y)))

    capacity = int(0.1 * trace.num_unique)
    total = float(n_blocks.sum())
    rows.append(("capacity_blocks_at_0.1", float(capacity)))
    rows.append(("hit_rate_lru_0.1", lru_hits(trace, capacity, None) / total))
    rows.append(("hit_rate_lru_dead_block_oracle_0.1", lru_hits(trace, capacity, nxt) / total))
    rows.append(("hit_rate_belady_0.1", float(belady_prefix_hits(trace, capacity).sum()) / total))
    table = pd.DataFrame(rows, columns=["metric", "value"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False, float_format="%.6g")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
