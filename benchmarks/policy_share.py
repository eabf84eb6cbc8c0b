"""The policy's share of step time inside the real engines, from their own step traces (issue 21).

Reads the ``manifest.json`` of ``superinfer bench --suite engines`` runs and writes one row per
real-engine cell with our policy in the loop:

* ``hf`` (transformers + SmolLM2 on CPU): the engine's own per-step trace
  (``HFEngine``'s ``StepRecord``: ``policy_s`` is the wall time inside the ``superinfer_schedule``
  hook, ``duration_s`` the whole step; summed per cell in the manifest's ``step_profile``);
* ``sglang`` (SGLang 0.5.23's CPU server with our plugin): the plugin's counters
  (``adapters/sglang/stats.py``: ``policy_us`` is every ``superinfer_schedule`` call,
  ``step_us`` every ``Scheduler.run_batch``, i.e. the forward pass). The counters are cumulative
  over the server's life, so a cell's figures are the difference from the previous cell on the
  same scheduler pid, in the order the suite ran them.

Columns (``results/benchmarks/policy_share.csv``): ``run, engine, policy, load, repeat, steps,
policy_calls, policy_ms, forward_ms, step_ms, policy_us_per_call, policy_share_of_forward,
policy_share_of_step`` (``step_ms``: the whole step, hf only; SGLang's plugin sees only the
forward pass, so its ``policy_share_of_step`` is left empty and ``policy_share_of_forward`` is an
upper bound of the share of the scheduler's loop).

Usage: ``python benchmarks/policy_share.py [--src DIR ...] [--out FILE]`` (default ``--src
results/engines-cpu``, ``--out results/benchmarks/policy_share.csv``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.report.results import write_atomic

COLUMNS = [
    "run", "engine", "policy", "load", "repeat", "steps", "policy_calls", "policy_ms",
    "forward_ms", "step_ms", "policy_us_per_call", "policy_share_of_forward",
    "policy_share_of_step",
]  # fmt: skip


def _hf_row(run: str, key: str, cell: dict[str, Any]) -> dict[str, Any] | None:
    engine, policy, load, repeat = key.split("/")
    profile = cell.get("cells", {}).get(f"{engine}/{policy}", {}).get("step_profile")
    if not profile or not profile.get("num_steps"):
        return None
    policy_ms = profile["phases"]["policy"]["total_s"] * 1e3
    forward_ms = profile["phases"]["forward"]["total_s"] * 1e3
    step_ms = profile["step_time_s"] * 1e3
    calls = profile["num_steps"]  # the hf engine asks the policy once per step
    return {
        "run": run, "engine": engine, "policy": policy, "load": float(load),
        "repeat": int(repeat), "steps": calls, "policy_calls": calls, "policy_ms": policy_ms,
        "forward_ms": forward_ms, "step_ms": step_ms,
        "policy_us_per_call": policy_ms * 1e3 / calls,
        "policy_share_of_forward": policy_ms / forward_ms,
        "policy_share_of_step": policy_ms / step_ms,
    }  # fmt: skip


def rows_of(manifest: dict[str, Any], run: str) -> list[dict[str, Any]]:
    """One row (:data:`COLUMNS`) per real-engine cell of an engines-suite manifest whose policy
    time was recorded; SGLang cells as differences of the plugin's cumulative counters.

    Raises:
        ValueError: the manifest has no ``runs`` (not an engines-suite run).
    """
    runs = manifest.get("runs")
    if not isinstance(runs, dict):
        raise ValueError("no 'runs' in the manifest (not a --suite engines run)")
    rows: list[dict[str, Any]] = []
    last: dict[int, dict[str, Any]] = {}  # scheduler pid -> its previous counters
    for key, cell in runs.items():
        parts = key.split("/")
        if len(parts) != 4:
            continue
        if parts[0] == "hf":
            row = _hf_row(run, key, cell)
            if row:
                rows.append(row)
            continue
        stats = cell.get("plugin_stats")
        if parts[0] != "sglang" or not stats:
            continue
        prev = last.get(stats["pid"], {"policy_us": {"sum": 0.0, "count": 0},
                                       "step_us": {"sum": 0.0, "count": 0}})  # fmt: skip
        last[stats["pid"]] = stats
        calls = stats["policy_us"]["count"] - prev["policy_us"]["count"]
        policy_ms = (stats["policy_us"]["sum"] - prev["policy_us"]["sum"]) / 1e3
        forward_ms = (stats["step_us"]["sum"] - prev["step_us"]["sum"]) / 1e3
        steps = stats["step_us"]["count"] - prev["step_us"]["count"]
        if steps <= 0:
            continue
        rows.append({
            "run": run, "engine": parts[0], "policy": parts[1], "load": float(parts[2]),
            "repeat": int(parts[3]), "steps": steps, "policy_calls": calls,
            "policy_ms": policy_ms, "forward_ms": forward_ms, "step_ms": float("nan"),
            "policy_us_per_call": policy_ms * 1e3 / calls if calls else float("nan"),
            "policy_share_of_forward": policy_ms / forward_ms,
            "policy_share_of_step": float("nan"),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", action="append", type=Path, help="an engines-suite run directory")
    ap.add_argument("--out", type=Path, default=Path("results/benchmarks/policy_share.csv"))
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for src in args.src or [Path("results/engines-cpu")]:
        path = src / "manifest.json"
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
            rows += rows_of(manifest, str(src))
        except (OSError, ValueError) as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 2
    if not rows:
        print("error: no real-engine cell with policy time in the runs given", file=sys.stderr)
        return 2
    table = pd.DataFrame(rows, columns=COLUMNS)
    write_atomic(args.out, lambda p: table.to_csv(p, index=False, float_format="%.6g"))
    mine = table[table["policy"] == "superinfer"]
    for (run, engine), part in mine.groupby(["run", "engine"], sort=False):
        col = "policy_share_of_step" if engine == "hf" else "policy_share_of_forward"
        print(
            f"{run} {engine} superinfer: {len(part)} cells, {col} "
            f"{part[col].min():.4%}-{part[col].max():.4%}, "
            f"{part['policy_us_per_call'].min():.0f}-{part['policy_us_per_call'].max():.0f} µs/call"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
