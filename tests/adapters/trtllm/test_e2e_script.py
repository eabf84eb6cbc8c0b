"""``benchmarks/trtllm_e2e.*`` outside a GPU machine: the shell script skips and says why; the
Python script runs its three modes against the test double (rows marked as not GPU numbers)."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_the_shell_script_skips_cleanly_with_its_reason() -> None:
    if importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("tensorrt_llm is installed here: the script would run the benchmark")
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "trtllm_e2e.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert out.stdout.startswith("trtllm_e2e: skipped: tensorrt_llm is not importable here")


def test_the_benchmark_runs_every_mode_on_the_double(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "trtllm_e2e.py"),
            "--double",
            "--requests",
            "8",
            "--rate",
            "400",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=ROOT,
    )
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], r["slo_class"]) for r in rows] == [
        (mode, cls) for mode in ("engine", "gate", "mode_b") for cls in ("chat", "batch", "all")
    ]
    assert all(r["hw"].startswith("double (CPU test double, not a GPU measurement)") for r in rows)
    assert [int(r["finished"]) for r in rows if r["slo_class"] == "all"] == [8, 8, 8]
    assert (tmp_path / "manifest.json").exists()
