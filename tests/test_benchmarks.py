"""The benchmark scripts run and write their result files (timings are never asserted)."""

from __future__ import annotations

import csv
import json
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


# Runs each script's module body (its imports) without its `__main__` block, in one child process.
_IMPORT_ALL = """
import json, runpy, sys
failed, skipped = {}, {}
for path in sys.argv[1:]:
    try:
        runpy.run_path(path, run_name="benchmark_import_check")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "superinfer":
            failed[path] = repr(exc)
        else:  # an optional extra (torch, triton, ...) that this install lacks
            skipped[path] = exc.name
    except Exception as exc:
        failed[path] = repr(exc)
print(json.dumps({"failed": failed, "skipped": skipped}))
"""


def test_every_benchmark_script_imports() -> None:
    """Every script's top-level imports resolve: a moved superinfer module fails here, not later
    on a machine that runs the script (only ``policy_overhead.py`` runs in the tests)."""
    scripts = sorted(str(p) for p in (ROOT / "benchmarks").glob("*.py"))
    assert scripts
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, *scripts],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["failed"] == {}
