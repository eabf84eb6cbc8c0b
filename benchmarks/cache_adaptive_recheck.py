"""Replay the adaptive reuse predictor on every cell of ``results/cache/targets.csv`` with the
current code and compare its block hit rate with the committed one (the check that a change to
the predictors' cost did not cost hit rate; issue 22).

Each cell is replayed exactly as ``superinfer cache-eval`` does
(``harness.offline.cache_replay_blocks.replay_blocks``, HBM = ``int(capacity_frac x unique
blocks)``, CPU tier ``cpu_ratio`` (4) x HBM). Writes ``results/cache/adaptive_recheck.csv``:
trace, capacity_frac, cpu_tier, block_hit_rate (now), committed_block_hit_rate (targets.csv's
``predictor_block_hit_rate``), delta_points, best_simple_block_hit_rate, margin_points (now
minus the best simple policy, in points), leader, switches, cpu_us_per_request (CPU time of the
replay per request, µs; noisy on a shared machine), load_avg_1m.

    .venv/bin/python benchmarks/cache_adaptive_recheck.py [--jobs 2] [--out results/cache]
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from superinfer.harness.offline.cache_eval import DEFAULT_CPU_RATIO
from superinfer.harness.offline.cache_replay_blocks import replay_blocks
from superinfer.harness.offline.cache_trace import load_cache_trace


def _one(cell: tuple[str, float, bool]) -> dict[str, object]:
    name, frac, cpu = cell
    trace = load_cache_trace(name)
    hbm = max(1, int(frac * trace.num_unique))
    start = time.process_time()
    res = replay_blocks(trace, "adaptive", frac, hbm, int(DEFAULT_CPU_RATIO * hbm) if cpu else 0)
    cpu_s = time.process_time() - start
    info = res.predictor or {}
    return {
        "trace": name,
        "capacity_frac": frac,
        "cpu_tier": cpu,
        "block_hit_rate": res.block_hit_rate,
        "leader": info.get("leader"),
        "switches": info.get("num_switches"),
        "cpu_us_per_request": 1e6 * cpu_s / max(trace.num_requests, 1),
        "load_avg_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="results/cache/targets.csv")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="results/cache")
    args = parser.parse_args()
    targets = pd.read_csv(args.targets)
    cells = [(str(r.trace), float(r.capacity_frac), bool(r.cpu_tier)) for r in targets.itertuples()]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_one, cells))
    now = pd.DataFrame(rows)
    old = targets[["trace", "capacity_frac", "cpu_tier", "predictor_block_hit_rate",
                   "best_simple_block_hit_rate"]]  # fmt: skip
    out = now.merge(old, on=["trace", "capacity_frac", "cpu_tier"])
    out = out.rename(columns={"predictor_block_hit_rate": "committed_block_hit_rate"})
    out["delta_points"] = 100 * (out["block_hit_rate"] - out["committed_block_hit_rate"])
    out["margin_points"] = 100 * (out["block_hit_rate"] - out["best_simple_block_hit_rate"])
    cols = ["trace", "capacity_frac", "cpu_tier", "block_hit_rate", "committed_block_hit_rate",
            "delta_points", "best_simple_block_hit_rate", "margin_points", "leader", "switches",
            "cpu_us_per_request", "load_avg_1m"]  # fmt: skip
    path = Path(args.out) / "adaptive_recheck.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    out[cols].to_csv(path, index=False, float_format="%.6g")
    worst = out.loc[out["delta_points"].idxmin()]
    print(f"wrote {path}: {len(out)} cells, {int((out['delta_points'] < -0.1).sum())} below "
          f"-0.1 points, worst {worst['delta_points']:.3f} ({worst['trace']} "
          f"{worst['capacity_frac']:g} cpu={worst['cpu_tier']})")  # fmt: skip


if __name__ == "__main__":
    main()
