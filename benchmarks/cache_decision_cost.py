"""CPU time per placement decision of the offline cache policies: one decision = serving one
request's blocks and bringing the cache back within capacity (for ``adaptive``: its six shadow
caches included; ``learned`` is the learned model alone, no longer one of them). Measured with
``time.process_time`` (CPU time of this process, so a stopped or descheduled process does not
inflate it), on each trace at each HBM capacity of ``--capacity`` (a comma list; default 0.1)
without a CPU tier.

Writes ``results/cache/decision_cost.csv`` (``--file``; trace, policy, capacity_frac, requests,
block_references, cpu_s, us_per_request, us_per_block, load_avg_1m). ``--policies`` takes any
name of ``make_block_cache``, e.g. ``adaptive-s8`` (shadows sampled at 1/8).

    .venv/bin/python benchmarks/cache_decision_cost.py [--traces mooncake,gen-multi-turn]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pandas as pd

from superinfer.harness.offline.cache_trace import load_cache_trace
from superinfer.policy_core.reuse_adaptive import make_block_cache

POLICIES = ("lru", "lfu", "arc", "s3fifo", "lrfu20", "lrfu200", "learned", "adaptive")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="mooncake,gen-multi-turn,gen-agentic")
    parser.add_argument("--capacity", default="0.1", help="comma list of HBM fractions")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--out", default="results/cache")
    parser.add_argument("--file", default="decision_cost.csv", help="file name under --out")
    args = parser.parse_args()
    rows = []
    cells = [(n, float(c)) for n in args.traces.split(",") for c in args.capacity.split(",")]
    for name, frac in cells:
        tr = load_cache_trace(name)
        cap = max(1, int(frac * tr.num_unique))
        parent, depth = tr.parent.tolist(), tr.depth.tolist()
        off, flat, arrival = tr.offsets.tolist(), tr.blocks.tolist(), tr.arrival_s.tolist()
        for policy in args.policies.split(","):
            cache = make_block_cache(policy, cap, parent, depth)
            start = time.process_time()
            for r in range(tr.num_requests):
                blocks = flat[off[r] : off[r + 1]]
                cache.prefix_hit(blocks)
                cache.request(blocks, arrival[r])
            cpu = time.process_time() - start
            rows.append({"trace": name, "policy": policy, "capacity_frac": frac,
                         "requests": tr.num_requests, "block_references": len(flat),
                         "cpu_s": round(cpu, 3), "us_per_request": 1e6 * cpu / tr.num_requests,
                         "us_per_block": 1e6 * cpu / len(flat),
                         "load_avg_1m": os.getloadavg()[0]})  # fmt: skip
            print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / args.file, index=False, float_format="%.6g")
    print(f"wrote {out / args.file}")


if __name__ == "__main__":
    main()
