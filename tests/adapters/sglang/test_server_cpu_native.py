"""The real SGLang server with its own scheduling (``--policy native``: no plugin), its step log,
and a start-up failure. One server start for the ordering and step-log tests, one failed start;
flags as in live.py."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pytest

from tests.adapters.sglang.gate import require_sglang

require_sglang()

from superinfer.adapters.sglang.server import ServerStartError, SGLangServer  # noqa: E402
from superinfer.adapters.sglang.steplog import COLUMNS  # noqa: E402
from tests.adapters.sglang.live import (  # noqa: E402
    chat_behind_batch,
    concurrently,
    generate,
    live_server,
    prompt,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    log = tmp_path_factory.mktemp("native") / "steps.csv"
    yield from live_server("native", step_log_path=log)


def _steps(server: SGLangServer) -> pd.DataFrame:
    assert server.step_log_path is not None
    return pd.read_csv(server.step_log_path)


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


def test_the_step_log_records_a_lone_request_step_by_step(server: SGLangServer) -> None:
    before = len(_steps(server))
    meta = generate(server, prompt(7, 40), 6)
    new = _steps(server).iloc[before:]
    assert tuple(new.columns) == COLUMNS and new["pid"].nunique() == 1
    p = int(meta["prompt_tokens"])
    prefill, decode = new[new["kind"] == "prefill"], new[new["kind"] == "decode"]
    # the prompt in prefill passes, then one decode per output token after the first
    assert int(prefill["num_prefill_tokens"].sum()) == p - int(meta["cached_tokens"])
    assert int(prefill["kv_tokens"].iloc[-1]) == p
    assert decode["num_seqs"].tolist() == [1] * 5
    assert decode["kv_tokens"].tolist() == [p + 1, p + 2, p + 3, p + 4, p + 5]
    assert (new["duration_ms"] > 0).all() and int(new["retracted"].sum()) == 0
    assert new["step_index"].diff().iloc[1:].eq(1).all()


def test_the_step_log_counts_retractions_and_their_second_prefill(server: SGLangServer) -> None:
    before = len(_steps(server))
    jobs = {f"r{i}": (lambda i=i: generate(server, prompt(200 + i, 25), 300)) for i in range(8)}
    metas = concurrently(jobs, dict.fromkeys(jobs, 0.05))
    assert {m["completion_tokens"] for m in metas.values()} == {300}
    new = _steps(server).iloc[before:]
    retracted = int(new["retracted"].sum())
    assert retracted >= 1  # a 1,024-token pool for 8 x ~375 tokens (live.py)
    prefill, decode = new[new["kind"] == "prefill"], new[new["kind"] == "decode"]
    # a retracted request is prefilled again (prompt and output so far), which also gives it
    # its next token: one more prefill and one fewer decode per retraction
    assert int(decode["num_seqs"].sum()) == 8 * 299 - retracted
    # Re-prefills of up to 325 tokens can overrun the chunk (512 tokens, launch.py): SGLang's
    # PrefillAdder then truncates the batch's last request to fill the chunk exactly, and that
    # request appears once more in a later prefill batch. So each extra prefill row-sequence
    # beyond 8 + retracted needs a prefill batch that ran exactly a full chunk.
    chunk = int(server.argv[server.argv.index("--chunked-prefill-size") + 1])
    extra = int(prefill["num_seqs"].sum()) - (8 + retracted)
    full_chunks = int((prefill["num_prefill_tokens"] == chunk).sum())
    assert 0 <= extra <= full_chunks, (extra, full_chunks)


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
