"""Sweep executors: wall time of one small sweep in this process, in a local process pool, and
as Ray tasks on a local instance, and a check that all three give the same table.

The sweep: Llama-3.1-70B on H100-80GB, TP4, five busy minutes of the Azure mix (from t = 1,200 s),
sim:vllm and sim:trtllm x fcfs and priority x 2, 4, 8 replicas (12 cells, a few seconds each).
No cache, so every cell runs. Writes ``results/benchmarks/sweep_executors.csv`` with columns
``executor, workers, cells, wall_s, start_s, same_table`` (``start_s``: starting the Ray
instance, included in ``wall_s``; a local pool starts with its first cell).

Usage: ``python benchmarks/sweep_executors.py [--workers 2] [--out PATH]``; Ray rows need the
``ray`` extra (skipped without it).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import time
from pathlib import Path

from superinfer.harness.grid.cells import CellSpec, load_workload
from superinfer.harness.grid.executors import CellRunner
from superinfer.harness.grid.sweep import sweep_table

COLUMNS = ["executor", "workers", "cells", "wall_s", "start_s", "same_table"]


def cells() -> list[CellSpec]:
    base = CellSpec(gpu="h100-80gb", start_s=1200.0, duration_s=300.0)
    grid = itertools.product(("sim:vllm", "sim:trtllm"), ("fcfs", "priority"), (2, 4, 8))
    return [
        CellSpec(**{**base.__dict__, "engine": e, "policy": p, "replicas": r}) for e, p, r in grid
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="results/benchmarks/sweep_executors.csv")
    args = parser.parse_args()
    todo = cells()
    load_workload("azure", 1.0)  # parse the trace once, outside every timing
    runs = [("local", 1), ("local", args.workers)]
    try:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # 127.0.0.1 only
        import ray  # noqa: F401

        runs.append(("ray", args.workers))
    except ImportError:
        print("ray not installed: skipping the Ray executor")
    rows, reference = [], None
    for executor, workers in runs:
        t0 = time.perf_counter()
        with CellRunner(executor, workers=workers) as runner:
            started = time.perf_counter() - t0
            table = sweep_table(todo, runner.run(todo))
        wall = time.perf_counter() - t0
        reference = table if reference is None else reference
        rows.append({"executor": executor, "workers": workers, "cells": len(todo),
                     "wall_s": round(wall, 2), "start_s": round(started, 2),
                     "same_table": bool(table.equals(reference))})  # fmt: skip
        print(rows[-1], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
