"""The benchmark scripts run and write their result files (timings are never asserted)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_policy_overhead_writes_its_csv(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "policy_overhead.py"),
            "--sizes",
            "8x32,16x64",
            "--calls",
            "6",
            "--warmup",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    with (tmp_path / "policy_overhead.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:5] == ["policy", "n_running", "n_waiting", "median_us", "p99_us"]
    policies = ["edf", "fcfs", "lpm", "mlfq", "oracle", "priority", "superinfer"]
    assert [(r["policy"], r["n_running"], r["n_waiting"]) for r in rows] == [
        (p, n, w) for n, w in (("8", "32"), ("16", "64")) for p in policies
    ]
    assert all(float(r["median_us"]) > 0 for r in rows)
