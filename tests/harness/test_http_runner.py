"""The ``http`` engine without a model: what each backend sends, how a stream is counted, the
TTFT / TPOT / ITL definitions on hand-made token timelines, and every request accounted for
against a deliberately faulty local server."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from superinfer.harness.bench import BenchConfig, run_bench
from superinfer.harness.engines.hf import RequestTrace, trace_requests_frame
from superinfer.harness.engines.http import (
    HTTPOptions,
    StreamAccount,
    StreamError,
    build_request,
    http_options,
    normalize_url,
    replay_http,
)
from superinfer.harness.errors import UserError
from superinfer.harness.report.metrics import add_latency_columns, summarize
from superinfer.harness.workload.workload import BATCH_SLO, CHAT_SLO, Workload
from superinfer.sim.request import RequestSpec

pytest.importorskip("httpx_sse", reason="httpx-sse missing: run `make install-serve`")


def spec(rid: str = "r", arrival_s: float = 0.0, output_tokens: int = 4, slo: Any = CHAT_SLO):
    return RequestSpec(rid, arrival_s, 16, output_tokens, output_tokens, slo, source=slo.name)


# -- options and request shapes -----------------------------------------------------------------


def test_options_parse_and_name_the_bad_key() -> None:
    opts = http_options({"timeout_s": "5", "retries": "2", "send_slo": "off", "endpoint": "chat"})
    assert opts == HTTPOptions(timeout_s=5.0, retries=2, send_slo=False, endpoint="chat")
    with pytest.raises(UserError, match="unknown --engine-option 'timeout' for engine http"):
        http_options({"timeout": "5"})
    with pytest.raises(UserError, match="send_slo='maybe': expected true or false"):
        http_options({"send_slo": "maybe"})
    with pytest.raises(UserError, match="endpoint='embed': use completions or chat"):
        http_options({"endpoint": "embed"})
    with pytest.raises(UserError, match="prompt=ids needs endpoint=completions"):
        http_options({"prompt": "ids", "endpoint": "chat"})
    with pytest.raises(UserError, match="eos_token_ids='x'"):
        http_options({"eos_token_ids": "x"})
    assert normalize_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    with pytest.raises(UserError, match="--url '127.0.0.1:8000': expected http://HOST:PORT"):
        normalize_url("127.0.0.1:8000")


def test_each_backend_sends_length_slo_and_priority_its_own_way() -> None:
    chat = spec("c", output_tokens=7, slo=CHAT_SLO)
    batch = spec("b", output_tokens=3, slo=BATCH_SLO)
    opts = HTTPOptions()
    path, body, headers = build_request(chat, "hi", backend="sglang", opts=opts, model="m")
    assert path == "/v1/completions"
    assert body == {
        "model": "m",
        "max_tokens": 7,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "prompt": "hi",
        "ignore_eos": True,
        "custom_params": {"slo": {"class": "chat", "ttft_ms": 1000.0, "tpot_ms": 100.0}},
        "priority": 0,
    }
    assert headers == {}
    _, body, _ = build_request(batch, "hi", backend="sglang", opts=opts, model="m")
    assert body["priority"] == -1  # SGLang: higher is more urgent; batch ranks below chat
    assert body["custom_params"] == {"slo": {"class": "batch", "deadline_s": 600.0}}

    _, body, headers = build_request(batch, [5, 6], backend="vllm", opts=opts, model="m")
    assert body["priority"] == 1 and body["ignore_eos"] is True and body["prompt"] == [5, 6]
    assert headers == {"x-slo-class": "batch", "x-slo-deadline-s": "600"}

    _, body, headers = build_request(chat, "hi", backend="trtllm", opts=opts, model="m")
    assert "priority" not in body and body["ignore_eos"] is True
    assert headers == {"x-slo-class": "chat", "x-slo-ttft-ms": "1000", "x-slo-tpot-ms": "100"}
    on = HTTPOptions(send_priority=True)
    _, body, _ = build_request(batch, "hi", backend="trtllm", opts=on, model="m")
    assert body["priority"] == 0.5  # 1 / (1 + rank)

    path, body, headers = build_request(
        chat, "hi", backend="openai", opts=HTTPOptions(endpoint="chat"), model="m",
        eos_token_ids=(0, 2),
    )  # fmt: skip
    assert path == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["logit_bias"] == {"0": -100, "2": -100}
    assert "ignore_eos" not in body and "priority" not in body
    assert headers["x-slo-class"] == "chat"
    quiet = HTTPOptions(send_slo=False, include_usage=False)
    _, body, headers = build_request(chat, "hi", backend="sglang", opts=quiet, model="m")
    assert "custom_params" not in body and "stream_options" not in body and headers == {}


# -- TTFT / TPOT / ITL on hand-made timelines ---------------------------------------------------


def chunk(text: str | None, finish: str | None = None, chat: bool = False) -> str:
    if chat:
        delta = {} if text is None else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish}
    return json.dumps({"choices": [choice]})


def usage(completion: int, prompt: int = 16) -> str:
    return json.dumps({"choices": [], "usage": {"completion_tokens": completion,
                                                 "prompt_tokens": prompt}})  # fmt: skip


def frame_of(account: StreamAccount, s: RequestSpec) -> pd.Series:
    """The requests-table row the ``http`` engine writes for a stream."""
    status, reason = account.outcome(s.output_tokens, exact=True)
    times = account.token_times_s(s.output_tokens)
    rec = RequestTrace(s, token_times=times, status=status, reason=reason, end_s=times[-1])
    return trace_requests_frame([rec], {}, engine="http", policy="p").iloc[0]


def test_ttft_tpot_and_itl_follow_docs_metrics_on_a_hand_made_timeline() -> None:
    # Arrival 0.5 s; a role-only chunk, then 4 one-token events at 0.75, 0.875, 1.0, 1.5 s,
    # an empty-text chunk (not a token), the finish chunk, usage, [DONE].
    s = spec(arrival_s=0.5, output_tokens=4)
    acc = StreamAccount(chat=True)
    acc.feed(chunk(None, chat=True), 0.625)
    for t, text in ((0.75, "a"), (0.875, "b"), (1.0, ""), (1.0, "c"), (1.5, "d")):
        acc.feed(chunk(text, chat=True), t)
    acc.feed(chunk(None, "length", chat=True), 1.5)
    acc.feed(usage(4), 1.5)
    acc.feed("[DONE]", 1.5)
    row = frame_of(acc, s)
    assert (row.status, row.generated_tokens) == ("finished", 4)
    assert row.ttft_ms == 250.0  # first token 0.75 - arrival 0.5
    assert row.e2e_ms == 1000.0  # last token 1.5 - arrival 0.5
    assert row.tpot_ms == 250.0  # (1.5 - 0.75) / (4 - 1)
    assert row.max_itl_ms == 500.0  # 1.0 -> 1.5
    assert bool(row.met_slo) is False  # TPOT 250 ms > 100 ms


def test_events_that_carry_several_tokens_count_by_usage() -> None:
    # SGLang-style stream interval: 3 events carry 6 tokens (usage says so). TPOT spreads the
    # decode time over 5 intervals; ITL is between events (tokens of one event arrive together).
    s = spec(arrival_s=0.0, output_tokens=6)
    acc = StreamAccount()
    for t in (0.25, 0.5, 1.0):
        acc.feed(chunk("xy"), t)
    acc.feed(chunk("", "length"), 1.0)
    acc.feed(usage(6), 1.0)
    acc.feed("[DONE]", 1.0)
    assert acc.token_times_s(6) == [0.25, 0.5, 1.0, 1.0, 1.0, 1.0]
    row = frame_of(acc, s)
    assert (row.ttft_ms, row.tpot_ms, row.max_itl_ms, row.e2e_ms) == (250.0, 150.0, 500.0, 1000.0)


def test_usage_prompt_tokens_details_give_the_cached_tokens() -> None:
    acc = StreamAccount()
    acc.feed(chunk("a", "length"), 0.5)
    acc.feed(json.dumps({"choices": [], "usage": {"completion_tokens": 1, "prompt_tokens": 64,
                         "prompt_tokens_details": {"cached_tokens": 48}}}), 0.5)  # fmt: skip
    assert (acc.prompt_tokens, acc.cached_tokens) == (64, 48)
    plain = StreamAccount()
    plain.feed(usage(1, 64), 0.5)  # no details (SGLang without --enable-cache-report)
    assert (plain.prompt_tokens, plain.cached_tokens) == (64, None)


def test_without_usage_finish_reason_length_means_max_tokens() -> None:
    # llama.cpp's server sends no usage in streams; "length" says it generated max_tokens.
    s = spec(output_tokens=5)
    acc = StreamAccount()
    for t in (0.5, 0.75, 1.0, 1.25):  # one token decoded to nothing was never sent as an event
        acc.feed(chunk("w"), t)
    acc.feed(chunk("", "length"), 1.25)
    acc.feed("[DONE]", 1.25)
    assert acc.num_tokens(5) == 5 and acc.outcome(5, exact=True) == ("finished", "")
    row = frame_of(acc, s)
    assert (row.ttft_ms, row.tpot_ms, row.max_itl_ms) == (500.0, 187.5, 250.0)


def test_the_same_timeline_gives_the_same_numbers_through_the_sim_path() -> None:
    # hf and http rows come from trace_requests_frame, sim rows from first/finish/generated:
    # both end in metrics.add_latency_columns, so one timeline gives one set of numbers.
    s = spec(arrival_s=0.5, output_tokens=4)
    acc = StreamAccount()
    for t in (0.75, 0.875, 1.0, 1.5):
        acc.feed(chunk("t"), t)
    acc.feed(chunk("", "length"), 1.5)
    acc.feed("[DONE]", 1.5)
    http_row = frame_of(acc, s)
    sim_like = pd.DataFrame(
        [{"status": "finished", "arrival_s": 0.5, "first_token_s": 0.75, "finish_s": 1.5,
          "generated_tokens": 4, "slo_ttft_ms": 1000.0, "slo_tpot_ms": 100.0,
          "slo_deadline_s": float("nan")}]
    )  # fmt: skip
    sim_row = add_latency_columns(sim_like).iloc[0]
    for col in ("ttft_ms", "tpot_ms", "e2e_ms", "met_slo"):
        assert http_row[col] == sim_row[col], col


def test_a_one_token_stream_has_no_tpot_and_meets_a_tpot_target_vacuously() -> None:
    s = spec(arrival_s=0.0, output_tokens=1)
    acc = StreamAccount()
    acc.feed(chunk("x", "length"), 0.5)
    acc.feed("[DONE]", 0.5)
    row = frame_of(acc, s)
    # one token: no gap, so max_itl_ms is empty (issue 20 item 9)
    assert row.ttft_ms == 500.0 and pd.isna(row.tpot_ms) and pd.isna(row.max_itl_ms)
    assert bool(row.met_slo) is True


def test_a_token_that_decodes_to_no_text_is_stamped_by_its_finish_chunk() -> None:
    # llama.cpp: a one-token output that is the first byte of a UTF-8 character streams no
    # text; its finish chunk says "length", so the token exists and arrived by then.
    s = spec(arrival_s=0.25, output_tokens=1)
    acc = StreamAccount()
    acc.feed(chunk("", "length"), 0.75)
    acc.feed("[DONE]", 0.75)
    row = frame_of(acc, s)
    assert (row.status, row.generated_tokens, row.ttft_ms, row.e2e_ms) == (
        "finished", 1, 500.0, 500.0,
    )  # fmt: skip


def test_stream_outcomes_name_what_went_wrong() -> None:
    acc = StreamAccount()
    acc.feed(chunk("a"), 0.1)
    assert acc.outcome(4, exact=True) == (
        "failed", "stream_cut: closed without [DONE] after 1 token events",
    )  # fmt: skip
    acc.feed(chunk("b", "stop"), 0.2)
    acc.feed("[DONE]", 0.2)
    assert acc.outcome(4, exact=True) == (
        "failed", "token_count_mismatch: 2 of 4 tokens (finish_reason stop)",
    )  # fmt: skip
    assert acc.outcome(4, exact=False) == ("finished", "")
    empty = StreamAccount()
    empty.feed(chunk("", "stop"), 0.1)
    empty.feed(usage(0), 0.1)
    empty.feed("[DONE]", 0.1)
    assert empty.outcome(4, exact=True) == ("failed", "no_tokens")
    with pytest.raises(StreamError, match=r"malformed_sse: not JSON: '\{\"choices\": \['"):
        StreamAccount().feed('{"choices": [', 0.0)
    with pytest.raises(StreamError, match="malformed_sse: no choices list"):
        StreamAccount().feed('{"choices": 3}', 0.0)
    with pytest.raises(StreamError, match="stream_error: out of memory"):
        StreamAccount().feed('{"error": {"message": "out of memory"}}', 0.0)
    # SGLang's error chunk for a request a scheduler aborted with 503 before any token: a
    # refusal; after a token it is a failure like any other error in the stream
    refusal = '{"error": {"message": "rejected by superinfer policy: late", "code": 503}}'
    with pytest.raises(StreamError) as err:
        StreamAccount().feed(refusal, 0.0)
    assert (err.value.status, str(err.value)) == ("rejected", "rejected by superinfer policy: late")
    started = StreamAccount()
    started.feed(chunk("a"), 0.1)
    with pytest.raises(StreamError) as err:
        started.feed(refusal, 0.2)
    assert err.value.status == "failed" and str(err.value).startswith("stream_error: rejected")


# -- a deliberately faulty server ---------------------------------------------------------------

#: What the faulty server does, by the first word of the prompt.
FAULTS = {
    "ok": ("finished", ""),
    "noisy": ("finished", ""),  # comments, `event:` lines, a line without a colon: SSE ignores
    "multi": ("finished", ""),  # two tokens per event, counted by usage
    "http500": ("failed", "http_500: boom"),
    "rejected": ("rejected", "load_shed"),
    "html502": ("failed", "http_502: <html>bad gateway</html>"),
    "stall": ("failed", "timeout: no [DONE] within 1.5 s (1 token events)"),
    "cut": ("failed", "stream_cut: RemoteProtocolError after 2 token events"),
    "nodone": ("failed", "stream_cut: closed without [DONE] after 4 token events"),
    "malformed": ("failed", 'malformed_sse: not JSON: \'{"choices": [{"text": \''),
    "inerror": ("failed", "stream_error: engine died"),
    "abort503": ("rejected", "rejected by superinfer policy: hopeless"),
    "notsse": (
        "failed",
        "not_event_stream: Expected response header Content-Type to contain "
        "'text/event-stream', got 'application/json'",
    ),  # fmt: skip
    "short": ("failed", "token_count_mismatch: 2 of 4 tokens (finish_reason stop)"),
    "flaky": ("failed", "http_503: busy"),  # retries off: one attempt
}


def _sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def _tok(text: str, finish: str | None = None) -> bytes:
    return _sse({"choices": [{"index": 0, "text": text, "finish_reason": finish}]})


class FaultyServer:
    """An HTTP/1.1 server on 127.0.0.1 that misbehaves on purpose, one way per prompt word."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.seen: dict[str, int] = {}
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        start = asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.server = self.loop.run_until_complete(start)
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:  # the stalled handlers
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode().split("\r\n"):
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":")[1])
            body = json.loads(await reader.readexactly(length))
            word = str(body["prompt"]).split()[0]
            self.seen[word] = self.seen.get(word, 0) + 1
            await getattr(self, f"_{word}")(writer, self.seen[word])
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _head(writer: asyncio.StreamWriter, status: str, kind: str, extra: str = "") -> None:
        writer.write(f"HTTP/1.1 {status}\r\ncontent-type: {kind}\r\n{extra}\r\n".encode())
        await writer.drain()

    async def _stream(self, writer: asyncio.StreamWriter, parts: list[bytes]) -> None:
        await self._head(writer, "200 OK", "text/event-stream", "connection: close\r\n")
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.01)

    async def _error(self, writer: asyncio.StreamWriter, status: str, body: bytes) -> None:
        await self._head(
            writer, status, "application/json",
            f"content-length: {len(body)}\r\nconnection: close\r\n",
        )  # fmt: skip
        writer.write(body)
        await writer.drain()

    def _good(self) -> list[bytes]:
        usage_chunk = _sse({"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens": 16}})
        return [*(_tok(t) for t in "abcd"), _tok("", "length"), usage_chunk, _sse(b"[DONE]")]

    async def _ok(self, writer: asyncio.StreamWriter, _: int) -> None:
        await self._stream(writer, self._good())

    async def _noisy(self, writer: asyncio.StreamWriter, _: int) -> None:
        good = self._good()
        noise = [b": ping\n\n", b"event: message\nid: 7\nretry: 10\n", b"garbage\n"]
        await self._stream(writer, [noise[0], good[0], noise[1], *good[1:3], noise[2], *good[3:]])

    async def _multi(self, writer: asyncio.StreamWriter, _: int) -> None:
        # as SGLang with --enable-cache-report: 12 of the 16 prompt tokens from its radix cache
        usage_chunk = _sse({"choices": [], "usage": {
            "completion_tokens": 4, "prompt_tokens": 16,
            "prompt_tokens_details": {"cached_tokens": 12}}})  # fmt: skip
        await self._stream(writer, [_tok("ab"), _tok("cd", "length"), usage_chunk, _sse(b"[DONE]")])

    async def _http500(self, writer: asyncio.StreamWriter, _: int) -> None:
        await self._error(writer, "500 Internal Server Error", b'{"error": {"message": "boom"}}')

    async def _rejected(self, writer: asyncio.StreamWriter, _: int) -> None:
        body = b'{"error": {"message": "no", "type": "rejected", "code": "load_shed"}}'
        await self._error(writer, "503 Service Unavailable", body)

    async def _html502(self, writer: asyncio.StreamWriter, _: int) -> None:
        await self._error(writer, "502 Bad Gateway", b"<html>bad gateway</html>")

    async def _stall(self, writer: asyncio.StreamWriter, _: int) -> None:
        await self._stream(writer, [_tok("a")])
        await asyncio.sleep(30)

    async def _cut(self, writer: asyncio.StreamWriter, _: int) -> None:
        head = "200 OK", "text/event-stream", "transfer-encoding: chunked\r\n"
        await self._head(writer, *head)
        for part in (_tok("a"), _tok("b")):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
        writer.write(b'40\r\ndata: {"cho')  # a chunk announced, cut mid-way
        await writer.drain()
        writer.transport.abort()

    async def _nodone(self, writer: asyncio.StreamWriter, _: int) -> None:
        await self._stream(writer, self._good()[:-1])

    async def _malformed(self, writer: asyncio.StreamWriter, _: int) -> None:
        await self._stream(writer, [_tok("a"), b'data: {"choices": [{"text": \n\n', *self._good()])

    async def _inerror(self, writer: asyncio.StreamWriter, _: int) -> None:
        await self._stream(writer, [_tok("a"), _sse({"error": {"message": "engine died"}})])

    async def _abort503(self, writer: asyncio.StreamWriter, _: int) -> None:
        # what SGLang 0.5.23 streams for a request its scheduler aborted with HTTPStatus 503
        error = {"object": "error", "message": "rejected by superinfer policy: hopeless",
                 "type": "SERVICE_UNAVAILABLE", "param": None, "code": 503}  # fmt: skip
        await self._stream(writer, [_sse({"error": error}), _sse(b"[DONE]")])

    async def _notsse(self, writer: asyncio.StreamWriter, _: int) -> None:
        await self._error(writer, "200 OK", b'{"choices": [{"text": "abcd"}]}')

    async def _short(self, writer: asyncio.StreamWriter, _: int) -> None:
        usage_chunk = _sse({"choices": [], "usage": {"completion_tokens": 2}})
        await self._stream(writer, [_tok("a"), _tok("b", "stop"), usage_chunk, _sse(b"[DONE]")])

    async def _flaky(self, writer: asyncio.StreamWriter, attempt: int) -> None:
        if attempt % 2:
            await self._error(writer, "503 Service Unavailable", b'{"error": {"message": "busy"}}')
        else:
            await self._ok(writer, attempt)


@pytest.fixture(scope="module")
def faulty() -> Iterator[FaultyServer]:
    server = FaultyServer()
    yield server
    server.close()


def fault_workload() -> tuple[list[RequestSpec], list[str]]:
    specs = [spec(f"{word}-{i}", 0.01 * i) for i, word in enumerate(FAULTS)]
    return specs, [f"{word} please" for word in FAULTS]


def test_every_request_against_a_faulty_server_is_accounted_for(faulty: FaultyServer) -> None:
    specs, prompts = fault_workload()
    run = replay_http(
        f"http://127.0.0.1:{faulty.port}", specs, prompts,
        opts=HTTPOptions(timeout_s=1.5), model="m",
    )  # fmt: skip
    got = {r.spec.request_id.split("-")[0]: (r.status, r.reason) for r in run.records}
    assert got == FAULTS
    assert run.attempts == [1] * len(FAULTS)
    # only "multi" reports prefix-cache hits (usage.prompt_tokens_details.cached_tokens)
    assert {r.spec.request_id.split("-")[0]: c for r, c in
            zip(run.records, run.server_cached_tokens, strict=True) if c is not None} == {
        "multi": 12}  # fmt: skip
    for rec in run.records:
        assert rec.end_s is not None and rec.end_s >= rec.spec.arrival_s
    df = trace_requests_frame(run.records, {}, engine="http", policy="server")
    (row,) = [r for r in summarize(df, engine="http", policy="server", kv_peak_bytes={})
              if r["slo_class"] == "all"]  # fmt: skip
    assert (row["n_requests"], row["n_finished"], row["n_rejected"], row["n_failed"]) == (
        len(FAULTS), 3, 2, len(FAULTS) - 5,
    )  # fmt: skip
    ok = df[df["status"] == "finished"]
    assert (ok["generated_tokens"] == 4).all() and ok["ttft_ms"].notna().all()
    assert df.loc[df["status"] != "finished", "ttft_ms"].isna().all()


def test_retries_resend_only_requests_that_got_no_token(faulty: FaultyServer) -> None:
    faulty.seen.pop("flaky", None)
    faulty.seen.pop("http500", None)
    specs = [spec("flaky"), spec("http500", 0.01), spec("stall", 0.02)]
    prompts = ["flaky", "http500", "stall"]
    opts = HTTPOptions(timeout_s=1.0, retries=2, retry_backoff_s=0.05)
    run = replay_http(f"http://127.0.0.1:{faulty.port}", specs, prompts, opts=opts, model="m")
    assert [(r.status, r.reason) for r in run.records] == [
        ("finished", ""),
        ("failed", "http_500: boom"),
        ("failed", "timeout: no [DONE] within 1 s (1 token events)"),
    ]
    assert run.attempts == [2, 3, 1]  # 503 then ok; 500 three times; a started stream never


def test_a_server_that_is_not_there_gets_requests_not_sent() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the replay: nobody listens
    run = replay_http(f"http://127.0.0.1:{port}", [spec("a"), spec("b", 0.01)], ["x", "y"],
                      model="m")  # fmt: skip
    assert [r.status for r in run.records] == ["failed", "failed"]
    assert all(r.reason.startswith("not_sent: connect_error") for r in run.records)


def test_bench_rejects_http_misuse_in_one_line() -> None:
    wl = Workload("w", (spec("a"),), (), 1.0, None)
    with pytest.raises(UserError, match="engine http needs --url"):
        run_bench(BenchConfig(engines=("http",), policies=("x",)), workload=wl)
    with pytest.raises(UserError, match="give at most one --policies label"):
        run_bench(BenchConfig(engines=("http",), policies=("a", "b"), url="http://x:1"),
                  workload=wl)  # fmt: skip
    with pytest.raises(UserError, match="with http among the engines give one --policies"):
        run_bench(BenchConfig(engines=("sim:vllm", "http"), policies=("fcfs", "priority")),
                  workload=wl)  # fmt: skip


# -- the CLI around serve and bench -------------------------------------------------------------


def test_serve_options_fail_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from superinfer.cli import cli

    def run(*args: str) -> BaseException | None:
        return CliRunner().invoke(cli, ["serve", *args]).exception

    err = run("--engine", "sglang", "--slo-class", "chat:ttft_ms=5")
    assert isinstance(err, UserError) and str(err) == (
        "--slo-class applies to serve --engine hf only"
    )
    err = run("--engine", "hf", "--slo-class", "chat:ttft=5")
    assert isinstance(err, UserError) and str(err).startswith(
        "--slo-class 'chat:ttft=5': 'ttft=5' is not KEY=VALUE with KEY in"
    )
    err = run("--engine", "hf", "--slo-class", "gold:priority=0.5")
    assert isinstance(err, UserError)
    assert str(err) == "--slo-class gold: priority must be an integer"
    err = run("--engine", "hf", "--default-class", "gold")
    assert isinstance(err, UserError)
    assert str(err) == "default class 'gold' is not a class (batch, chat)"
    err = run("--engine", "hf", "--", "--model-path", "m")
    assert isinstance(err, UserError) and "takes no --config and no engine ARGS" in str(err)
    err = run("--engine", "hf", "--engine-option", "stall_s=5")  # a bench option: not ignored
    assert isinstance(err, UserError) and str(err) == (
        "--engine-option stall_s: a benchmark setting, not used by serve --engine hf (serve "
        "takes num_blocks, max_batch_tokens, max_num_seqs, page_size_tokens, num_threads, "
        "step_time_file)"
    )
    err = run("--engine", "hf", "--drain-s", "0")
    assert (
        isinstance(err, UserError)
        and str(err) == "drain_s must be a number of seconds > 0, got 0.0"
    )
    err = run("--engine", "sglang", "--drain-s", "5")
    assert isinstance(err, UserError) and str(err) == "--drain-s applies to serve --engine hf only"

    # sglang: --host / --port are handed on to SGLang's launcher
    import superinfer.adapters.sglang.launch as launch

    seen: dict[str, Any] = {}
    monkeypatch.setattr(
        launch, "launch_command", lambda args, **kw: (seen.setdefault("a", args), {})
    )
    monkeypatch.setattr(launch, "exec_server", lambda argv, env: None)
    result = CliRunner().invoke(
        cli, ["serve", "--engine", "sglang", "--port", "30001", "--", "--model-path", "m"]
    )
    assert result.exit_code == 0, result.output
    assert seen["a"] == ("--model-path", "m", "--port", "30001")


def test_bench_http_without_a_url_is_one_line() -> None:
    from click.testing import CliRunner

    from superinfer.cli import cli

    err = CliRunner().invoke(cli, ["bench", "--engine", "http", "--duration-s", "5"]).exception
    assert isinstance(err, UserError)
    assert str(err) == "engine http needs --url http://HOST:PORT of an OpenAI-compatible server"
