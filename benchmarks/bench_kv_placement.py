"""Cost of a placement decision: scoring N cached prefix nodes and planning, per call.

Two paths: the array path the offline evaluator uses (``ReusePredictor.scores`` + ``PlacementPlanner
.plan_arrays``), and the hook path an engine uses (``superinfer_kv_placement`` on N
``PrefixNodeView``s through pluggy, with the bounded history and the CPU-tier model). Writes
``results/cache/placement_overhead.csv`` (one row per path x N: median and p90 ms per call).

    .venv/bin/python benchmarks/bench_kv_placement.py [--out results/cache/placement_overhead.csv]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from superinfer.adapters.kv_placement import ReusePlacement
from superinfer.adapters.manager import build_plugin_manager
from superinfer.policy_core.kv_placement_plan import PlacementPlanner
from superinfer.policy_core.reuse import NodeColumns, ReusePredictor, ReusePredictorConfig
from superinfer.policy_core.types import KVLocation, PrefixNodeView

SIZES = (1_000, 10_000, 100_000)
HOOK_SIZES = (1_000, 10_000)
REPEATS = 20


def _forest(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Chains of 24 one-block nodes under one shared root block (Mooncake's shape)."""
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    for i in range(1, n):
        start = (i - 1) % 24 == 0
        parent[i] = 0 if start else i - 1
        depth[i] = 1 if start else depth[i - 1] + 1
    return parent, depth


def _trained(rng: np.random.Generator) -> ReusePredictor:
    pred = ReusePredictor(ReusePredictorConfig(min_labels=0, min_labels_per_class=0))
    pred.switched_at_s = 0.0  # score with the model, as after cold start
    pred.weights = rng.normal(0.0, 0.5, len(pred.weights))
    return pred


def bench_arrays(n: int, rng: np.random.Generator) -> list[float]:
    parent, depth = _forest(n, rng)
    pred = _trained(rng)
    planner = PlacementPlanner()
    cols = NodeColumns(
        age_s=rng.uniform(0, 600, n),
        since_first_s=rng.uniform(600, 1200, n),
        num_accesses=rng.integers(1, 5, n).astype(np.float64),
        interval_ewma_s=np.where(rng.random(n) < 0.5, np.nan, rng.uniform(10, 300, n)),
        depth=depth.astype(np.float64),
        tokens_per_block=np.full(n, 512.0),
        num_children=np.bincount(parent[parent >= 0], minlength=n).astype(np.float64),
    )
    out = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        score = pred.scores(cols)
        planner.plan_arrays(
            score=score,
            parent=parent,
            depth=depth,
            num_blocks=np.ones(n, dtype=np.int64),
            in_hbm=np.ones(n, dtype=bool),
            needed_hbm_blocks=24,
            free_hbm_blocks=0,
            free_cpu_blocks=0,
            total_hbm_blocks=n,
            has_cpu_tier=False,
            calibrated=True,
        )
        out.append(time.perf_counter() - t)
    return out


def bench_hook(n: int, rng: np.random.Generator) -> list[float]:
    parent, depth = _forest(n, rng)
    plugin = ReusePlacement()
    plugin.hbm_model = _trained(rng)
    pm = build_plugin_manager("fcfs", kv_policy=plugin)
    cpu = rng.random(n) < 0.3
    cpu[0] = False
    for i in range(1, n):  # keep HBM ancestor-closed
        cpu[i] = cpu[i] or (parent[i] >= 0 and cpu[parent[i]])
    nodes = tuple(
        PrefixNodeView(
            node_id=f"n{i}",
            parent_id=None if parent[i] < 0 else f"n{parent[i]}",
            num_tokens=512,
            num_blocks=1,
            location=KVLocation.CPU if cpu[i] else KVLocation.HBM,
            hit_count=int(rng.integers(0, 4)),
            last_access_s=float(rng.uniform(0, 600)),
            in_use=False,
            depth=int(depth[i]),
            slo_classes=("chat",),
        )
        for i in range(n)
    )
    out = []
    for rep in range(REPEATS):
        t = time.perf_counter()
        pm.hook.superinfer_kv_placement(
            nodes=nodes,
            now_s=600.0 + rep,
            free_hbm_blocks=0,
            free_cpu_blocks=0,
            needed_hbm_blocks=24,
            total_hbm_blocks=n,
        )
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/cache/placement_overhead.csv"))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for path, sizes, fn in (("arrays", SIZES, bench_arrays), ("hook", HOOK_SIZES, bench_hook)):
        for n in sizes:
            ms = np.asarray(fn(n, rng)) * 1e3
            rows.append(
                {
                    "path": path,
                    "num_nodes": n,
                    "p50_ms": float(np.median(ms)),
                    "p90_ms": float(np.percentile(ms, 90)),
                    "repeats": REPEATS,
                    "host": platform.node(),
                    "machine": platform.machine(),
                }
            )
            print(
                f"{path:6s} N={n:>7,d}  p50 {rows[-1]['p50_ms']:8.2f} ms  "
                f"p90 {rows[-1]['p90_ms']:8.2f} ms"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False, float_format="%.4g")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
