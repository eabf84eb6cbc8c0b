"""Prefix-cache placement in the simulator: the engine's own LRU vs the learned reuse predictor.

Runs the ``mooncake-chat`` workload (real Kimi chat traffic with 512-token block hashes) on each
engine profile under ``fcfs``, behind each router (round robin spreads a conversation's turns
over replicas; ``cache_aware`` sends them where their prefix is cached), once with the engine's
own eviction (``lru``) and once with the ``reuse`` placement plugin (``policy_core.reuse`` +
``policy_core.kv_placement_plan``), and writes ``results/cache/sim_mooncake.csv``: per router,
engine and kv policy, TTFT p50/p99, SLO attainment, prompt tokens served from the cache and the
share of the prompt tokens that hit (the prefill saved).

Usage: ``python benchmarks/kv_reuse_sim.py [--duration-s 1200] [--out results/cache]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from superinfer.harness.bench import BenchConfig, build_bench_workload, run_bench

COLUMNS = ["router", "engine", "kv_policy", "n_requests", "ttft_p50_ms", "ttft_p99_ms",
           "slo_attainment", "prompt_tokens_cached", "prefix_hit_rate", "wall_s"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sim:vllm,sim:sglang,sim:trtllm")
    parser.add_argument("--duration-s", type=float, default=1200.0)
    parser.add_argument("--routers", default="round_robin,cache_aware")
    parser.add_argument("--out", default="results/cache")
    args = parser.parse_args()
    rows = []
    base = BenchConfig(workload="mooncake-chat", engines=tuple(args.engines.split(",")),
                       policies=("fcfs",), duration_s=args.duration_s, model="llama-3.1-70b",
                       gpu="h100-80gb", tp=4, replicas=11)  # fmt: skip
    workload = build_bench_workload(base)
    for router in args.routers.split(","):
        for kv_policy in ("lru", "reuse"):
            config = BenchConfig(**{**base.__dict__, "kv_policy": kv_policy, "router": router})
            start = time.perf_counter()
            result = run_bench(config, workload=workload)
            wall = time.perf_counter() - start
            summary = result.summary[result.summary["slo_class"] == "all"]
            for _, row in summary.iterrows():
                rows.append({"router": router, "kv_policy": kv_policy, "wall_s": round(wall, 1),
                             **{c: row[c] for c in COLUMNS if c in row}})  # fmt: skip
                print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows)[COLUMNS].to_csv(out / "sim_mooncake.csv", index=False, float_format="%.6g")
    print(f"wrote {out / 'sim_mooncake.csv'}")


if __name__ == "__main__":
    main()
