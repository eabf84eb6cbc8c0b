"""Simulator speed: wall time to simulate the whole Azure 2023 conv+code hour.

Setup (issue 3): Llama-3.1-70B on A100-80GB, TP4, 8 replicas behind round robin, one process (one
core), once per engine profile under its native policy (falling back to ``fcfs`` where the native
policy is not registered). Writes ``results/benchmarks/sim_speed.csv`` with columns
``engine, policy, n_requests, replicas, simulated_s, wall_s`` (plus ``steps`` and
``schedule_calls``), and prints where the time goes when asked (``--profile``).

Usage: ``python benchmarks/sim_speed.py [--engines ...] [--profile] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import pstats
import time
from pathlib import Path

from superinfer.adapters.manager import available_policies, build_plugin_manager
from superinfer.harness.workload.workload import build_workload
from superinfer.sim.engine import SimConfig, Simulator
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.profiles import get_profile

COLUMNS = ["engine", "policy", "n_requests", "replicas", "simulated_s", "wall_s", "steps",
           "schedule_calls"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sim:vllm,sim:sglang,sim:trtllm")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--profile", action="store_true", help="print the top functions by time")
    parser.add_argument("--out", default="results/benchmarks/sim_speed.csv")
    args = parser.parse_args()
    workload = build_workload("azure")
    registered = available_policies()
    rows = []
    for engine in args.engines.split(","):
        profile = get_profile(engine)
        policy = profile.native_policy if profile.native_policy in registered else "fcfs"
        config = SimConfig(profile, get_model("llama-3.1-70b"), get_gpu("a100-80gb"), tp=4,
                           replicas=args.replicas)  # fmt: skip
        sim = Simulator(config, build_plugin_manager(policy).hook)
        profiler = cProfile.Profile() if args.profile else None
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        result = sim.run(workload.requests)
        if profiler:
            profiler.disable()
        wall = time.perf_counter() - start
        rows.append({"engine": engine, "policy": policy, "n_requests": len(workload.requests),
                     "replicas": args.replicas, "simulated_s": round(result.end_s, 1),
                     "wall_s": round(wall, 2), "steps": result.num_steps,
                     "schedule_calls": result.num_schedule_calls})  # fmt: skip
        print(rows[-1], flush=True)
        if profiler:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
