"""`make bench`'s decisions pinned across refactors (issue 16: behaviour unchanged).

``tests/data/bench_300s_summary.csv`` is the ``summary.csv`` of ``superinfer bench --duration-s
300`` (the `make bench` defaults: azure-mixed on sim:vllm, Llama-3.1-70B, A100-80GB, TP4, 4
replicas, every registered policy) written by the code *before* the harness/CLI/policy/simulator
redesign (commit dad3899). The whole hour is checked by ``benchmarks/check_make_bench.sh`` against
``results/default/summary.csv``. A deliberate change of behaviour regenerates the file and says
so: regenerated on 2026-12-03 when ``first_token_guard`` became a default of ``superinfer`` (and
so of ``oracle``), which moves only their rows (``superinfer`` chat attainment 0.980623 ->
0.978547 on these 300 s, three chats; on the whole hour it gains, ``docs/policies.md``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "bench_300s_summary.csv"


def test_bench_summary_is_byte_identical_to_the_pre_redesign_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "superinfer", "bench", "--duration-s", "300", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "summary.csv").read_text() == GOLDEN.read_text()
