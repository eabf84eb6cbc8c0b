"""Prefix-cache placement in the simulator: the engine's own LRU vs the learned reuse predictor.

``--trace mooncake`` (the default) runs the ``mooncake-chat`` workload (real Kimi chat traffic
with 512-token block hashes) on each engine profile under ``fcfs``, behind each router (round
robin spreads a conversation's turns over replicas; ``cache_aware`` sends them where their
prefix is cached), once per kv policy: the engine's own eviction (``lru``) and the ``reuse``
placement plugin (``policy_core.reuse`` + ``policy_core.kv_placement_plan``); it writes
``results/cache/sim_mooncake.csv``.

``--trace gen-multi-turn`` (or another ``gen-*`` trace of
``harness.offline.cache_workloads``) builds the workload from that seeded generator instead:
each generated request keeps its 64-token block hashes, its arrival and its prompt length, with
``--output-tokens`` output tokens, the built-in ``chat`` SLO (TTFT 1 s), on ``--replicas``
replicas whose HBM KV pool is ``--num-gpu-blocks`` blocks (the engine option of that name, so
the cache is under pressure: the generated traces' unique KV is far below an H100's), without a
CPU tier unless ``--cpu-kv-ratio`` says otherwise; default kv policies ``lru``, ``arc``,
``s3fifo``, ``reuse``. It writes ``results/cache/sim_<trace>.csv``.

Columns: per router, engine and kv policy, TTFT p50/p99 and mean, SLO attainment, prompt tokens
in all, prompt tokens served from the cache (the prefill saved) and their share
(``prefix_hit_rate``), the wall time of the run.

Usage: ``python benchmarks/kv_reuse_sim.py [--trace mooncake] [--duration-s 1200]
[--out results/cache]``; ``python benchmarks/kv_reuse_sim.py --trace gen-multi-turn
--engines sim:vllm`` for a generated one.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from superinfer.harness.bench import BenchConfig, build_bench_workload, run_bench
from superinfer.harness.offline.cache_workloads import GENERATED_TRACES, generated_workload
from superinfer.harness.report.metrics import add_latency_columns

COLUMNS = ["router", "engine", "kv_policy", "n_requests", "ttft_p50_ms", "ttft_p99_ms",
           "slo_attainment", "prompt_tokens_cached", "prefix_hit_rate", "wall_s"]  # fmt: skip
#: Columns the generated-trace runs add (``sim_<gen trace>.csv``).
GEN_COLUMNS = [*COLUMNS[:6], "ttft_mean_ms", *COLUMNS[6:8], "prompt_tokens", *COLUMNS[8:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake", help="mooncake or a gen-* trace")
    parser.add_argument("--engines", default="sim:vllm,sim:sglang,sim:trtllm")
    parser.add_argument("--duration-s", type=float, default=1200.0)
    parser.add_argument("--routers", default="round_robin,cache_aware")
    parser.add_argument(
        "--kv-policies", default=None, help="default lru,reuse; gen-*: lru,arc,s3fifo,reuse"
    )
    parser.add_argument("--replicas", type=int, default=None, help="default 11 (mooncake), 2")
    parser.add_argument("--num-gpu-blocks", type=int, default=1024, help="gen-* only")
    parser.add_argument("--output-tokens", type=int, default=64, help="gen-* only")
    parser.add_argument(
        "--cpu-kv-ratio", type=float, default=None, help="CPU/HBM; default: profile's, 0 gen-*"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/cache")
    args = parser.parse_args()
    gen = args.trace != "mooncake"
    if gen and args.trace not in GENERATED_TRACES:
        parser.error(f"--trace: mooncake or one of {', '.join(GENERATED_TRACES)}")
    kv_policies = (args.kv_policies or ("lru,arc,s3fifo,reuse" if gen else "lru,reuse")).split(",")
    rows = []
    cpu_ratio = 0.0 if gen and args.cpu_kv_ratio is None else args.cpu_kv_ratio
    blocks = {"num_gpu_blocks": str(args.num_gpu_blocks)} if gen else {}
    base = BenchConfig(workload="mooncake-chat", engines=tuple(args.engines.split(",")),
                       policies=("fcfs",), duration_s=None if gen else args.duration_s,
                       model="llama-3.1-70b", gpu="h100-80gb", tp=4, cpu_kv_ratio=cpu_ratio,
                       replicas=args.replicas or (2 if gen else 11), seed=args.seed,
                       engine_options=blocks)  # fmt: skip
    if gen:
        workload = generated_workload(args.trace, seed=args.seed, output_tokens=args.output_tokens)
    else:
        workload = build_bench_workload(base)
    for router in args.routers.split(","):
        for kv_policy in kv_policies:
            config = BenchConfig(**{**base.__dict__, "kv_policy": kv_policy, "router": router})
            start = time.perf_counter()
            result = run_bench(config, workload=workload)
            wall = time.perf_counter() - start
            summary = result.summary[result.summary["slo_class"] == "all"]
            reqs = add_latency_columns(result.requests)
            for _, row in summary.iterrows():
                cell = reqs[reqs["engine"] == row["engine"]]
                rows.append({"router": router, "kv_policy": kv_policy, "wall_s": round(wall, 1),
                             "ttft_mean_ms": float(cell["ttft_ms"].mean()),
                             "prompt_tokens": int(cell["prompt_tokens"].sum()),
                             **{c: row[c] for c in COLUMNS if c in row}})  # fmt: skip
                print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"sim_{args.trace}.csv"
    pd.DataFrame(rows)[GEN_COLUMNS if gen else COLUMNS].to_csv(
        out / name, index=False, float_format="%.6g"
    )
    print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
