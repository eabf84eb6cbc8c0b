"""The ``http`` engine's client loop: one asyncio task per request, streamed server-sent events
read into per-token timelines (statuses and reasons: ``engines.http``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from superinfer.harness.engines.hf import RequestTrace
from superinfer.harness.engines.http_client import (
    BACKENDS,
    RETRYABLE,
    HTTPOptions,
    build_request,
    normalize_url,
)
from superinfer.harness.errors import UserError
from superinfer.sim.request import RequestSpec

if TYPE_CHECKING:
    import httpx

__all__ = ["HTTPRun", "StreamAccount", "StreamError", "replay_http"]


# -- reading one stream -------------------------------------------------------------------------


class StreamError(Exception):
    """A stream that cannot be trusted, or that the server ended with a refusal; the message is
    the request's reason and ``status`` its outcome (``failed``, or ``rejected``)."""

    def __init__(self, message: str, status: str = "failed") -> None:
        super().__init__(message)
        self.status = status


@dataclass
class StreamAccount:
    """What one streamed response said, and when.

    Feed it every server-sent event's ``data`` with the instant it arrived; then
    :meth:`outcome` says how the request ended and when each of its tokens arrived.

    A **token event** is a chunk whose first choice carries non-empty text (``text`` for
    completions, ``delta.content`` for chat); role-only and empty deltas are not tokens. Its
    arrival instant stamps the tokens it carries. A stream whose tokens all decoded to no text
    (a one-token output that is part of a UTF-8 character) has its tokens stamped by the chunk
    that carried the ``finish_reason``. The number of tokens is, in this order: the
    usage chunk's ``completion_tokens``; the requested ``max_tokens`` if the server said
    ``finish_reason: "length"`` (it stopped because it generated exactly that many); the number
    of token events (one token per event, as llama.cpp, vLLM and SGLang stream by default).

    Attributes:
        chat: the stream is ``chat.completion.chunk`` objects.
        event_times_s: arrival instant of each token event, s.
        finish_reason: the last ``finish_reason`` seen.
        completion_tokens: ``usage.completion_tokens``, if the server sent usage.
        prompt_tokens: ``usage.prompt_tokens``, if the server sent usage.
        cached_tokens: ``usage.prompt_tokens_details.cached_tokens`` (the OpenAI API's field),
            the prompt tokens the server found in its prefix cache, if it reported them (SGLang
            0.5.23 does with ``--enable-cache-report``, read in its ``usage_processor.py``).
        done: ``data: [DONE]`` arrived.
        finish_s: arrival instant of the first chunk with a ``finish_reason``.
    """

    chat: bool = False
    event_times_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    finish_s: float | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    done: bool = False

    def feed(self, data: str, at_s: float) -> None:
        """Account for one event's data.

        Raises:
            StreamError: the data is not an OpenAI chunk (``malformed_sse``) or is an error
                object (``stream_error``); status ``rejected`` for an error of code 503 (or of
                type ``rejected``) before any token: the server refused the request (SGLang ends
                a stream so when a scheduler aborts a request with 503, as our plugin does for
                the policy's rejections).
        """
        if self.done:
            return
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            raise StreamError(f"malformed_sse: not JSON: {data[:80]!r}") from None
        if not isinstance(obj, dict):
            raise StreamError(f"malformed_sse: not an object: {data[:80]!r}")
        if "error" in obj:
            err = obj["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            refusal = isinstance(err, dict) and (
                err.get("code") == 503 or err.get("type") == "rejected"
            )
            if refusal and not self.event_times_s:
                raise StreamError(str(message)[:200], status="rejected")
            raise StreamError(f"stream_error: {str(message)[:200]}")
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self.completion_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                self.cached_tokens = details["cached_tokens"]
        choices = obj.get("choices")
        if choices is None and isinstance(usage, dict):
            return
        if not isinstance(choices, list):
            raise StreamError(f"malformed_sse: no choices list: {data[:80]!r}")
        if not choices:
            return
        choice = choices[0]
        if not isinstance(choice, dict):
            raise StreamError(f"malformed_sse: a choice is not an object: {data[:80]!r}")
        if self.chat:
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else None
        else:
            text = choice.get("text")
        if isinstance(text, str) and text:
            self.event_times_s.append(at_s)
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
            if self.finish_s is None:
                self.finish_s = at_s

    def num_tokens(self, requested: int) -> int:
        """Tokens the stream carried (see the class docstring)."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        if self.finish_reason == "length":
            return requested
        return len(self.event_times_s)

    def token_times_s(self, requested: int) -> list[float]:
        """One arrival instant per token: each token event's instant, the tokens beyond the
        events' count stamped with the last event (they arrived with it at the latest)."""
        times = self.event_times_s
        if not times and self.finish_s is not None:
            times = [self.finish_s]
        n = self.num_tokens(requested)
        if not times or n <= 0:
            return []
        if n >= len(times):
            return times + [times[-1]] * (n - len(times))
        return times[: n - 1] + [times[-1]]

    def outcome(self, requested: int, *, exact: bool) -> tuple[str, str]:
        """``(status, reason)`` of a stream that closed normally (no transport error)."""
        if not self.done:
            got = len(self.event_times_s)
            return "failed", f"stream_cut: closed without [DONE] after {got} token events"
        n = self.num_tokens(requested)
        if n <= 0 or not self.token_times_s(requested):
            return "failed", "no_tokens"
        if exact and n != requested:
            return "failed", (
                f"token_count_mismatch: {n} of {requested} tokens "
                f"(finish_reason {self.finish_reason})"
            )
        return "finished", ""


# -- the replay ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Sent:
    """The client's side of one request, beyond its :class:`RequestTrace`."""

    attempts: int = 0
    sent_s: float | None = None
    server_prompt_tokens: int | None = None
    server_cached_tokens: int | None = None


@dataclass
class HTTPRun:
    """What :func:`replay_http` observed.

    Attributes:
        records: one per request, in workload order; instants on the client clock (s from the
            replay's start).
        attempts: attempts per request.
        submit_lag_s: per request, how late its first attempt was sent after its arrival.
        server_prompt_tokens: per request, the server's ``usage.prompt_tokens`` (``None``
            without usage).
        wall_s: wall time of the replay.
        server_cached_tokens: per request, the server's
            ``usage.prompt_tokens_details.cached_tokens`` (``None`` where it sent none).
    """

    records: list[RequestTrace]
    attempts: list[int]
    submit_lag_s: list[float]
    server_prompt_tokens: list[int | None]
    wall_s: float
    server_cached_tokens: list[int | None] = field(default_factory=list)


def _error_reason(status: int, text: str) -> tuple[str, str]:
    """``(status, reason)`` of an HTTP error answer."""
    message, kind, code = text.strip(), None, None
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj))
        if isinstance(err, dict):
            message = str(err.get("message", err))
            kind, code = err.get("type"), err.get("code")
        else:
            message = str(err)
    if kind == "rejected":
        return "rejected", str(code or message)[:200]
    return "failed", f"http_{status}: {' '.join(message.split())[:200]}"


async def _attempt(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    account: StreamAccount,
    clock: Any,
) -> tuple[str, str, int | None]:
    """One attempt: ``(status, reason, http_status)``; ``status`` is empty when the stream
    closed normally (its account then says how the request ended)."""
    import httpx
    from httpx_sse import EventSource, SSEError

    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                raw = await response.aread()
                status, reason = _error_reason(response.status_code, raw.decode(errors="replace"))
                return status, reason, response.status_code
            try:
                async for sse in EventSource(response).aiter_sse():
                    account.feed(sse.data, clock())
                    if account.done:
                        break
            except SSEError as exc:
                return "failed", f"not_event_stream: {exc}"[:200], 200
            except StreamError as exc:
                return exc.status, str(exc), 200
            return "", "", 200
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        return "failed", f"not_sent: connect_error: {exc or type(exc).__name__}"[:200], None
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        got = len(account.event_times_s)
        return "failed", f"stream_cut: {type(exc).__name__} after {got} token events", 200
    except httpx.HTTPError as exc:
        return "failed", f"http_error: {type(exc).__name__}: {exc}"[:200], None


async def _one(
    client: httpx.AsyncClient,
    base: str,
    spec: RequestSpec,
    prompt: str | list[int],
    rec: RequestTrace,
    sent: _Sent,
    *,
    backend: str,
    opts: HTTPOptions,
    model: str,
    eos: Sequence[int],
    clock: Any,
) -> None:
    path, body, headers = build_request(
        spec, prompt, backend=backend, opts=opts, model=model, eos_token_ids=eos
    )
    chat = opts.endpoint == "chat"
    start = clock()
    sent.sent_s = start
    deadline = start + opts.timeout_s
    account = StreamAccount(chat=chat)
    status, reason = "", ""
    while True:
        sent.attempts += 1
        account = StreamAccount(chat=chat)
        try:
            status, reason, http_status = await asyncio.wait_for(
                _attempt(client, base + path, body, headers, account, clock),
                timeout=max(deadline - clock(), 0.0),
            )
        except asyncio.TimeoutError:
            got = len(account.event_times_s)
            status, reason, http_status = (
                "failed",
                f"timeout: no [DONE] within {opts.timeout_s:g} s ({got} token events)",
                None,
            )
        except Exception as exc:  # a client bug must not lose the request
            status, reason, http_status = "failed", f"client_error: {type(exc).__name__}", None
        retryable = not account.event_times_s and (
            reason.startswith("not_sent") or (http_status in RETRYABLE and status == "failed")
        )
        if retryable and sent.attempts <= opts.retries:
            wait = opts.retry_backoff_s * 2 ** (sent.attempts - 1)
            if clock() + wait < deadline:
                await asyncio.sleep(wait)
                continue
        break
    if not status:
        status, reason = account.outcome(spec.output_tokens, exact=opts.exact_output)
    rec.token_times = account.token_times_s(spec.output_tokens)
    if status == "finished":
        rec.end_s = rec.token_times[-1]
    else:
        rec.end_s = clock()
        if not reason.startswith("token_count_mismatch"):
            rec.token_times = list(account.event_times_s)
    rec.status, rec.reason = status, reason
    rec.submit_lag_s = start - spec.arrival_s
    sent.server_prompt_tokens = account.prompt_tokens
    sent.server_cached_tokens = account.cached_tokens


async def _replay(
    base: str,
    specs: Sequence[RequestSpec],
    prompts: Sequence[str | list[int]],
    *,
    backend: str,
    opts: HTTPOptions,
    model: str,
    eos: Sequence[int],
) -> HTTPRun:
    import httpx

    limits = httpx.Limits(
        max_connections=opts.max_connections or None, max_keepalive_connections=None
    )
    timeout = httpx.Timeout(None, connect=opts.connect_timeout_s)
    records = [RequestTrace(s) for s in specs]
    sent = [_Sent() for _ in specs]
    order = sorted(range(len(specs)), key=lambda i: (specs[i].arrival_s, i))
    t0 = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - t0

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        tasks = []
        for i in order:
            delay = specs[i].arrival_s - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(
                asyncio.create_task(
                    _one(
                        client,
                        base,
                        specs[i],
                        prompts[i],
                        records[i],
                        sent[i],
                        backend=backend,
                        opts=opts,
                        model=model,
                        eos=eos,
                        clock=clock,
                    )  # fmt: skip
                )
            )
        await asyncio.gather(*tasks)
    return HTTPRun(
        records,
        [s.attempts for s in sent],
        [r.submit_lag_s for r in records],
        [s.server_prompt_tokens for s in sent],
        clock(),
        [s.server_cached_tokens for s in sent],
    )


def replay_http(
    url: str,
    specs: Sequence[RequestSpec],
    prompts: Sequence[str | list[int]],
    *,
    backend: str = "openai",
    opts: HTTPOptions | None = None,
    model: str = "default",
    eos_token_ids: Sequence[int] = (),
) -> HTTPRun:
    """Replay ``specs`` against the server at ``url`` in real time, open loop.

    Request ``i`` is sent at ``specs[i].arrival_s`` (s after the replay starts) with prompt
    ``prompts[i]``, asking for exactly ``output_tokens`` tokens; every request ends finished,
    rejected or failed (module docstring).

    Args:
        url: the server's base URL (``http://127.0.0.1:8000``; a trailing ``/v1`` is fine).
        specs: the requests.
        prompts: one prompt per request, text or token ids.
        backend: how fields are sent (:data:`BACKENDS`).
        opts: engine options.
        model: the ``model`` field.
        eos_token_ids: ``openai``: tokens banned with ``logit_bias``.

    Raises:
        UserError: an unknown backend or a bad URL.
    """
    if backend not in BACKENDS:
        raise UserError(f"unknown --backend {backend!r}; known: {', '.join(BACKENDS)}")
    if len(prompts) != len(specs):
        raise ValueError(f"{len(prompts)} prompts for {len(specs)} requests")
    return asyncio.run(
        _replay(
            normalize_url(url),
            specs,
            prompts,
            backend=backend,
            opts=opts or HTTPOptions(),
            model=model,
            eos=tuple(eos_token_ids),
        )
    )
