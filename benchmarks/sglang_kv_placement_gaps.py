"""Where the placement policies of a ``sglang_kv_placement.py`` run win or lose prompt tokens,
by how long the reusable prefix of each request had been idle.

For every request of the run's workload (rebuilt from the same arguments), the *reusable*
prefix is the longest prefix of its chunks read by an earlier request (what an infinite cache
would serve), its *gap* the time since the deepest of those chunks was last read (for a
multi-turn session: the think time since its previous turn, on the replay's clock), and its
*reads* how often that chunk had been read. Each policy's prompt tokens served from the cache
(``cached_tokens`` of ``OUT/<policy>-<repeat>/requests.parquet``, averaged over the repeats) are
summed per quarter of the requests (arrival order) and gap bucket.

Writes ``--csv`` (``quarter, gap_s, requests, reusable_tokens``, then one column of mean cached
tokens per policy)::

    .venv/bin/python benchmarks/sglang_kv_placement_gaps.py --runs /tmp/run --window-s 600 \\
        --kv-policies hazard,s3fifo,lru --repeats 3 --csv OUT.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from sglang_kv_placement import add_workload_args, workload_from_args

#: Gap buckets' right edges, s (the last one open).
GAP_EDGES_S = (0.0, 5.0, 10.0, 20.0, 40.0, 80.0, np.inf)


def reusable(block_hashes: list[list[int]], arrival_s: list[float]) -> pd.DataFrame:
    """Per request (in the given order): ``reusable_chunks`` (its longest prefix read before),
    ``gap_s`` (time since the deepest of them was last read; NaN without one) and ``reads``
    (that chunk's reads before)."""
    last: dict[int, float] = {}
    reads: dict[int, int] = {}
    rows = []
    for hashes, t in zip(block_hashes, arrival_s, strict=True):
        k = 0
        while k < len(hashes) and hashes[k] in last:
            k += 1
        deep = hashes[k - 1] if k else None
        rows.append((k, t - last[deep] if deep is not None else np.nan,
                     reads.get(deep, 0) if deep is not None else 0))  # fmt: skip
        for h in hashes:
            last[h] = t
            reads[h] = reads.get(h, 0) + 1
    return pd.DataFrame(rows, columns=["reusable_chunks", "gap_s", "reads"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True, help="a sglang_kv_placement --out")
    parser.add_argument("--kv-policies", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv", type=Path, required=True)
    add_workload_args(parser)  # the run's own options, to rebuild its workload
    args = parser.parse_args()
    workload = workload_from_args(parser, args)
    reqs = sorted(workload.requests, key=lambda r: r.arrival_s)
    table = reusable([list(r.block_hashes) for r in reqs], [r.arrival_s for r in reqs])
    table["reusable_tokens"] = table.reusable_chunks * args.block_tokens
    n = len(reqs)
    table["quarter"] = np.arange(n) * 4 // n + 1
    policies = args.kv_policies.split(",")
    for policy in policies:
        cached = np.zeros(n)
        for repeat in range(args.repeats):
            path = args.runs / f"{policy}-{repeat}" / "requests.parquet"
            if not path.is_file():
                print(f"error: {path}: no such run", file=sys.stderr)
                return 1
            done = pd.read_parquet(path).sort_values("arrival_s", kind="stable")
            if len(done) != n:
                print(f"error: {path}: {len(done)} requests, the workload has {n}",
                      file=sys.stderr)  # fmt: skip
                return 1
            cached += done["cached_tokens"].to_numpy(dtype=np.float64)
        table[policy] = cached / args.repeats
    reused = table[table.reusable_chunks > 0].copy()
    reused["gap_s"] = pd.cut(reused.gap_s, GAP_EDGES_S).astype(str)
    sums = {p: (p, "sum") for p in policies}
    out = (reused.groupby(["quarter", "gap_s"], sort=False)
           .agg(requests=("reads", "size"), reusable_tokens=("reusable_tokens", "sum"), **sums)
           .reset_index())  # fmt: skip
    out = out.sort_values(["quarter", "gap_s"], key=lambda c: c.map(_order))
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.csv, index=False, float_format="%.1f")
    print(out.to_string(index=False))
    return 0


def _order(value: object) -> object:
    """Sort key: quarters as numbers, gap buckets by their left edge."""
    if isinstance(value, str) and value.startswith("("):
        return float(value[1:].split(",")[0])
    return value


if __name__ == "__main__":
    sys.exit(main())
