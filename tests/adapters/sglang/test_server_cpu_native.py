"""The real SGLang server with its own scheduling (``--policy native``: no plugin), and a start-up
failure. One server start for the ordering test, one failed start; flags as in live.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.adapters.sglang.gate import require_sglang

require_sglang()

from superinfer.adapters.sglang.server import ServerStartError, SGLangServer  # noqa: E402
from tests.adapters.sglang.live import chat_behind_batch, live_server  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[SGLangServer]:
    yield from live_server("native")


def test_native_runs_without_the_plugin(server: SGLangServer) -> None:
    assert not server.plugin and server.stats() is None
    assert "SUPERINFER_SGLANG" not in server.env
    assert server.argv[server.argv.index("--schedule-policy") + 1] == "fcfs"
    assert "--enable-priority-scheduling" not in server.argv


def test_chat_behind_a_queue_of_batch_waits_under_native(server: SGLangServer) -> None:
    received, chat, batch = chat_behind_batch(server)
    assert any(ts > received for ts in batch.values()), "no batch request was queued"
    # First come, first served: every batch request starts before the chat that came 1 s later,
    # the ones still queued when it arrived included.
    assert sorted(name for name, ts in batch.items() if ts > chat) == []
    assert chat > max(batch.values())


def test_a_start_up_failure_is_one_line_naming_the_cause(tmp_path) -> None:
    log = tmp_path / "bad.log"
    bad = SGLangServer("native", ["--max-total-tokens", "lots"], log_path=log)
    with pytest.raises(ServerStartError) as err:
        bad.start()
    message = str(err.value)
    assert "\n" not in message and message.startswith("sglang server (native) exited with code")
    cause = "sglang serve: error: argument --max-total-tokens: Invalid integer value: 'lots'."
    assert f"before /health answered: {cause}" in message
    assert f"[log {log}, last line: " in message and log.exists()
