"""How predictable is reuse in the Mooncake conversation trace (or any cache trace)? The facts
behind the predictor's features and behind the gap it leaves to Belady (docs/kv-reuse.md).

Writes ``results/cache/reuse_analysis.csv`` for ``mooncake`` (``reuse_analysis_<trace>.csv`` for
another ``--trace``), two columns (metric, value):

- reuse rate of blocks that were the partial last block of their request vs full blocks;
- for each request with new full blocks, whether any of them is ever reused (the conversation
  continues), and the AUC of request-level features for that outcome: prefix-hit blocks, prompt
  blocks, time since the previous turn, turns so far (AUC 0.5 = no signal);
- whether the time to a conversation's next turn follows from the time since its previous one:
  the Spearman rank correlation of the two over the requests that have both (0 = the gap before
  says nothing of the gap after, as with independent think times);
- hit rate at each ``--capacity`` (a fraction of the unique blocks; 10 % by default) of LRU,
  Belady, and LRU that first evicts blocks never used again (a perfect dead-block oracle), and
  the share of Belady's lead over LRU that the oracle recovers: how much of it is knowing which
  blocks are dead, the rest being knowing *when* the live ones come back.

    .venv/bin/python benchmarks/mooncake_reuse_analysis.py [--trace gen-multi-turn]
        [--capacity 0.01,0.02,0.05,0.1]
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


def continuation_rows(trace: BlockTrace, nxt: np.ndarray) -> list[tuple[str, float]]:
    """Block- and request-level predictability rows (everything but the hit rates).

    A request's *new full blocks* are those after its longest prefix of blocks seen before, but
    its partial last block; the conversation *continues* if any of them is used again, and its
    next turn is the first later request that uses one. Its previous turn's gap is the time
    since the last block of that prefix was seen (requests with a prefix of >= 2 blocks); the
    gap correlation takes the requests whose prefix ends in a block one earlier request used
    (the conversation's previous turn, not a shared prompt many requests end in).

    Args:
        trace: the cache trace.
        nxt: shape (len(trace.blocks),), ``cache_replay.next_use``: the next request using the
            block of each reference (``trace.num_requests`` if none).
    """
    rows: list[tuple[str, float]] = []
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
    feats, labels, gaps = [], [], []
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
            after = int(nxt[new_full].min())
            if turn == 1 and after < trace.num_requests:
                gaps.append((gap, float(trace.arrival_s[after]) - now))
    x = np.asarray(feats, dtype=np.float64)
    y = np.asarray(labels)
    rows.append(("requests_with_new_full_blocks", float(len(y))))
    rows.append(("continuation_rate", float(y.mean())))
    for j, name in enumerate(
        ("prefix_hit_blocks", "prompt_blocks", "gap_since_prev_turn_s", "turns_so_far")
    ):
        rows.append((f"auc_continuation_{name}", auc(x[:, j], y)))
    g = pd.DataFrame(gaps, columns=["prev", "next"], dtype=np.float64)
    rows.append(("turns_with_prev_and_next_gap", float(len(g))))
    rows.append(("spearman_prev_vs_next_turn_gap", float(g["prev"].corr(g["next"], "spearman"))))
    return rows


def hit_rate_rows(trace: BlockTrace, nxt: np.ndarray, frac: float) -> list[tuple[str, float]]:
    """Hit rates at ``frac`` of the unique blocks (LRU, LRU with a dead-block oracle, Belady)
    and the share of Belady's lead over LRU the oracle recovers (NaN when Belady does not
    lead)."""
    capacity = int(frac * trace.num_unique)
    total = float(np.diff(trace.offsets).sum())
    lru = lru_hits(trace, capacity, None) / total
    dead = lru_hits(trace, capacity, nxt) / total
    belady = float(belady_prefix_hits(trace, capacity).sum()) / total
    share = (dead - lru) / (belady - lru) if belady > lru else float("nan")
    return [(f"capacity_blocks_at_{frac:g}", float(capacity)), (f"hit_rate_lru_{frac:g}", lru),
            (f"hit_rate_lru_dead_block_oracle_{frac:g}", dead),
            (f"hit_rate_belady_{frac:g}", belady),
            (f"dead_block_share_of_belady_lead_{frac:g}", share)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake")
    parser.add_argument("--capacity", default="0.1", help="comma list of fractions")
    parser.add_argument("--out", type=Path, help="default results/cache/reuse_analysis[_TRACE].csv")
    args = parser.parse_args()
    trace = load_cache_trace(args.trace)
    nxt = next_use(trace)
    rows = continuation_rows(trace, nxt)
    for frac in args.capacity.split(","):
        rows += hit_rate_rows(trace, nxt, float(frac))
    suffix = "" if args.trace == "mooncake" else f"_{args.trace}"
    out = args.out or Path(f"results/cache/reuse_analysis{suffix}.csv")
    table = pd.DataFrame(rows, columns=["metric", "value"])
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False, float_format="%.6g")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
