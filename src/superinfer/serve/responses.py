"""OpenAI response bodies: whole answers, server-sent event streams, errors for requests the
engine rejected or failed."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from transformers.generation.continuous_batching.requests import GenerationOutput

from superinfer.serve.engine import CLIENT_DISCONNECTED, POLICY_ERROR, Ended, Live, ServingEngine
from superinfer.serve.parsing import RequestError

__all__ = ["Detokenizer", "EngineStream", "rejection", "stream", "whole"]

#: Engine rejection reasons that no load change can cure (HTTP 400); any other rejection is the
#: policy shedding load (HTTP 503).
_CLIENT_ERRORS = frozenset({"exceeds_max_model_len", "exceeds_kv_capacity"})


class Detokenizer:
    """Streamed text of a growing token list, held back while it ends inside a UTF-8 sequence.

    The offsets scheme of vLLM's ``detokenize_incrementally`` (``vllm/transformers_utils/
    detokenizer_utils.py``): decode a short window before the new tokens and after them, and
    emit the difference, so the cost per token does not grow with the output.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._prefix = 0
        self._read = 0

    def delta(self, tokens: list[int], *, final: bool) -> str:
        """Text added by the tokens past the last call (all of it when ``final``)."""
        decode = self._tok.decode
        before: str = decode(tokens[self._prefix : self._read], skip_special_tokens=True)
        after: str = decode(tokens[self._prefix :], skip_special_tokens=True)
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            self._prefix, self._read = self._read, len(tokens)
            return after[len(before) :]
        return ""


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


class EngineStream(StreamingResponse):
    """A streamed answer that cancels its engine request if the client goes away mid-way."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.headers["cache-control"] = "no-cache"
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def rejection(
    ended: Ended, live: Live | None = None, limits: tuple[int, int] | None = None
) -> JSONResponse:
    """The HTTP error of a request the engine ended without output: 400 for a request no load
    change can serve (:data:`_CLIENT_ERRORS`; with ``live`` and ``limits``, ``(context length
    in tokens, KV blocks of the pool)``, the message gives the request's size against the limit
    it exceeds, and ``param`` is ``max_tokens``), 500 (type and code ``policy_error``) for one
    the policy raised on, else 503 (the reason is the ``code``)."""
    if ended.status == "rejected":
        status = 400 if ended.reason in _CLIENT_ERRORS else 503
        detail, param = "", None
        if status == 400 and live is not None and limits is not None:
            total = live.prompt_tokens + live.max_tokens
            size = f"prompt {live.prompt_tokens} + max_tokens {live.max_tokens} = {total} tokens"
            if ended.reason == "exceeds_max_model_len":
                detail = f" ({size}, over the context's {limits[0]})"
            else:
                detail = f" ({size}: more KV than the pool's {limits[1]} blocks hold)"
            param = "max_tokens"
        message = f"request rejected: {ended.reason}{detail}"
        err = RequestError(status, message, param, kind="rejected")
        return err.response(code=ended.reason)
    if ended.reason.startswith(POLICY_ERROR):
        err = RequestError(500, f"request failed: {ended.reason}", kind="policy_error")
        return err.response(code="policy_error")
    err = RequestError(503, f"request failed: {ended.reason}", kind="engine_error")
    return err.response(code=ended.reason)


def _usage(live: Live) -> dict[str, int]:
    n = len(live.tokens)
    return {
        "prompt_tokens": live.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": live.prompt_tokens + n,
    }


async def stream(
    engine: ServingEngine,
    live: Live,
    first: GenerationOutput,
    chat: bool,
    include_usage: bool,
    model: str,
) -> AsyncIterator[bytes]:
    """Server-sent events of one request: a chunk per step that adds text, a last chunk with the
    finish reason, the usage chunk if asked, ``[DONE]``. An engine failure mid-way is sent as an
    ``error`` object (as vLLM and SGLang do), then the stream closes without ``[DONE]``."""
    detok = Detokenizer(engine.tokenizer)
    created = int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"
    role_sent = False

    def chunk(text: str | None, finish: str | None) -> bytes:
        nonlocal role_sent
        if chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if not role_sent and text is not None:
                delta["role"] = "assistant"
                role_sent = True
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return _sse(
            {"id": live.request_id, "object": kind, "created": created, "model": model,
             "choices": [choice]}
        )  # fmt: skip

    event: GenerationOutput | Ended | None = first
    while event is not None:
        if isinstance(event, Ended):
            engine.end(live, event)
            yield _sse({"error": {"message": f"request {event.status}: {event.reason}",
                                  "type": "engine_error", "code": event.reason}})  # fmt: skip
            return
        _, finish = engine.take(live, event)
        if finish is not None and finish.startswith("error"):
            yield _sse({"error": {"message": finish, "type": "engine_error", "code": None}})
            return
        text = detok.delta(live.tokens, final=finish is not None)
        if text:
            yield chunk(text, None)
        if finish is not None:
            yield chunk(None if chat else "", finish)
            if include_usage:
                yield _sse(
                    {"id": live.request_id, "object": kind, "created": created, "model": model,
                     "choices": [], "usage": _usage(live)}
                )  # fmt: skip
            yield b"data: [DONE]\n\n"
            return
        event = await engine.next_event(live)


async def whole(
    engine: ServingEngine,
    live: Live,
    first: GenerationOutput,
    chat: bool,
    model: str,
    request: Request,
) -> Response:
    """The whole answer of a request (``stream: false``): waits for its last token; 499 if the
    client went away (``app.watch_disconnect`` cancels the request and queues an :class:`Ended`
    with :data:`CLIENT_DISCONNECTED`), the rejection or a 500 if the engine ended or failed it.
    ``request`` is kept for the signature's callers; the watch reads its ``receive``."""
    event: GenerationOutput | Ended | None = first
    finish = None
    while finish is None:
        if event is None:
            return Response(status_code=499)
        if isinstance(event, Ended):
            engine.end(live, event)
            if event.reason == CLIENT_DISCONNECTED:
                return Response(status_code=499)  # nobody reads it
            return rejection(event, live, engine.limits())
        _, finish = engine.take(live, event)
        if finish is None:
            event = await engine.next_event(live)  # a disconnect arrives as an Ended
    if finish.startswith("error"):
        return RequestError(500, finish, kind="engine_error").response()
    text = engine.tokenizer.decode(live.tokens, skip_special_tokens=True)
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return JSONResponse(
        {
            "id": live.request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": _usage(live),
        }
    )
