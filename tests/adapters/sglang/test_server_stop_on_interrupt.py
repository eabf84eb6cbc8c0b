"""``SGLangServer.start`` stops the process it spawned when the wait for ``/health`` is
interrupted (SIGTERM's ``SystemExit``, Ctrl-C), not only when it fails: no orphaned server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from superinfer.adapters.sglang import server as server_mod
from superinfer.adapters.sglang.server import SGLangServer


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupted_start_stops_the_spawned_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt: type[BaseException]
) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]

    def fake_command(argv: Any, env: Any, cpu: Any = None) -> tuple[list[str], Any, str]:
        return sleeper, env, ""

    def interrupted(self: SGLangServer, begin: float) -> None:
        assert self.proc is not None and self.proc.poll() is None  # spawned and running
        raise interrupt

    monkeypatch.setattr(server_mod, "server_command", fake_command)
    monkeypatch.setattr(SGLangServer, "_wait_ready", interrupted)
    server = SGLangServer("native", [], log_path=tmp_path / "server.log")
    with pytest.raises(interrupt):
        server.start()
    assert server.proc is not None and server.proc.poll() is not None  # stopped, not orphaned
