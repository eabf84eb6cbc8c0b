"""``exit_on_sigterm``: a bench killed by SIGTERM still runs the ``finally`` that stops servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import sys, time
from pathlib import Path
from superinfer.adapters.sglang.server import exit_on_sigterm
exit_on_sigterm()
mark = Path(sys.argv[1])
try:
    mark.write_text("started")
    time.sleep(60)
finally:
    mark.write_text("stopped")
"""


def test_sigterm_runs_finally_and_exits_143(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src")}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(mark)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.read_text() == "started"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert mark.read_text() == "stopped"
