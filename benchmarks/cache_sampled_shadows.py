"""The adaptive reuse predictor with spatially sampled shadow caches against the unsampled one
(issue 22: its cost; ``AdaptiveConfig.sample_rate``, docs/kv-reuse.md).

Reads the ``hit_rates.csv`` and ``hit_rates_detail.csv`` of one or more ``superinfer
cache-eval`` runs with the policies ``adaptive`` and ``adaptive-sN`` (N = 1/sample rate), and
the committed ``results/cache/hit_rates.csv`` for the best simple policy (LRU, LFU, ARC,
S3-FIFO) and the committed adaptive rate of each cell. Writes ``sampled_shadows.csv``, one row
per trace x capacity x CPU tier x sample rate (1 = ``adaptive``, the unsampled predictor):
trace, capacity_frac, cpu_tier, sample_rate, block_hit_rate, delta_vs_unsampled_points (minus
the unsampled rate of the same run, in points), us_per_request (the replay's wall time per
request, µs, as in ``hit_rates_detail.csv``; noisy on a shared machine), delta_vs_committed_points
(minus the committed adaptive rate), best_simple_block_hit_rate,
delta_vs_best_simple_points, adaptive_leader, adaptive_switches.

    .venv/bin/python benchmarks/cache_sampled_shadows.py --runs DIR[,DIR...] \
        [--committed results/cache/hit_rates.csv] [--out results/cache/sampled_shadows.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from superinfer.harness.offline.cache_report import SIMPLE_POLICIES
from superinfer.policy_core.reuse_adaptive import adaptive_sample_rate

KEY = ["trace", "capacity_frac", "cpu_tier"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="comma list of cache-eval output dirs")
    parser.add_argument("--committed", default="results/cache/hit_rates.csv")
    parser.add_argument("--out", default="results/cache/sampled_shadows.csv")
    args = parser.parse_args()
    runs = []
    for d in args.runs.split(","):
        rates = pd.read_csv(Path(d) / "hit_rates.csv")
        detail = pd.read_csv(Path(d) / "hit_rates_detail.csv")
        cols = [*KEY, "policy", "us_per_request", "adaptive_leader", "adaptive_switches"]
        runs.append(rates.merge(detail[cols], on=[*KEY, "policy"]))
    df = pd.concat(runs, ignore_index=True)
    df["sample_rate"] = [
        1.0 if p == "adaptive" else adaptive_sample_rate(p) for p in df["policy"]
    ]  # fmt: skip
    if df["sample_rate"].isna().any():
        raise SystemExit("--runs: only adaptive and adaptive-sN rows are compared")
    base = df[df["policy"] == "adaptive"].set_index(KEY)["block_hit_rate"]
    committed = pd.read_csv(args.committed)
    old = committed[committed["policy"] == "adaptive"].set_index(KEY)["block_hit_rate"]
    simple = committed[committed["policy"].isin(SIMPLE_POLICIES)]
    best = simple.groupby(KEY)["block_hit_rate"].max()
    idx = pd.MultiIndex.from_frame(df[KEY])
    rate = df["block_hit_rate"].to_numpy()
    df["delta_vs_unsampled_points"] = 100 * (rate - base.reindex(idx).to_numpy())
    df["delta_vs_committed_points"] = 100 * (rate - old.reindex(idx).to_numpy())
    df["best_simple_block_hit_rate"] = best.reindex(idx).to_numpy()
    df["delta_vs_best_simple_points"] = 100 * (rate - df["best_simple_block_hit_rate"])
    order = {t: i for i, t in enumerate(dict.fromkeys(committed["trace"]))}
    df = df.sort_values(
        ["trace", "cpu_tier", "capacity_frac", "sample_rate"],
        key=lambda s: s.map(order) if s.name == "trace" else s,
        ascending=[True, True, True, False],
    )
    cols = [*KEY, "sample_rate", "block_hit_rate", "delta_vs_unsampled_points", "us_per_request",
            "delta_vs_committed_points", "best_simple_block_hit_rate",
            "delta_vs_best_simple_points", "adaptive_leader", "adaptive_switches"]  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    df[cols].to_csv(args.out, index=False, float_format="%.6g")
    print(f"wrote {args.out} ({len(df)} rows)")


if __name__ == "__main__":
    main()
