"""The ``http`` engine: replay a workload against any OpenAI-compatible server, open loop.

One asyncio task per request, started at the request's arrival instant whatever the server is
doing (open loop), streams ``/v1/completions`` (or ``/v1/chat/completions``) as server-sent
events with ``httpx`` and ``httpx-sse``, and stamps every event that carries output text on the
client's monotonic clock. The requests table is built by the same code as the real CPU engine's
(``hf_runner.trace_requests_frame``), and the summary by ``metrics.summarize``: TTFT, TPOT, ITL
and E2E mean exactly what docs/metrics.md says, measured at the client.

How a request is sent depends on the server (``--backend``); ``rank`` is the request's
``SLO.priority`` (lower is more urgent: 0 for chat, 1 for batch):

* ``sglang``: length forced by ``max_tokens`` and ``ignore_eos: true``; the SLO as
  ``custom_params.slo`` (where the SGLang adapter reads it); ``priority: -rank`` (SGLang ranks
  higher values first).
* ``vllm``: ``max_tokens`` and ``ignore_eos: true``; the SLO as ``x-slo-*`` headers;
  ``priority: rank`` (the server needs ``--scheduling-policy priority``, else it answers 400).
* ``trtllm``: ``max_tokens`` and ``ignore_eos: true``; ``x-slo-*`` headers; no priority
  (``trtllm-serve`` 1.2.1 has none; ``send_priority=true`` sends ``1 / (1 + rank)``, the
  [0, 1] scale of later releases, higher is more urgent).
* ``openai``: ``max_tokens`` and ``logit_bias`` -100 on the end-of-sequence tokens (the OpenAI
  API has no ``ignore_eos``); ``x-slo-*`` headers; no priority.

Every request asks for ``stream_options.include_usage``, which servers that support it answer
with the exact ``completion_tokens``.

Every request ends in exactly one status:

* ``finished``: the stream ended with ``data: [DONE]`` and carried the requested number of tokens;
* ``rejected``: the server refused it with an OpenAI error whose ``type`` is ``"rejected"``
  (``superinfer serve``: the policy or the engine's limits), with the server's code as reason;
* ``failed``, with a reason: ``http_<status>: <message>``, ``timeout: ...``, ``stream_cut: ...``
  (the connection closed before ``[DONE]``), ``malformed_sse: ...`` (a ``data:`` line that is
  not an OpenAI chunk), ``stream_error: ...`` (an ``error`` object in the stream),
  ``not_event_stream: ...``, ``token_count_mismatch: ...``, ``no_tokens``, or
  ``not_sent: connect_error: ...`` when the request never reached the server.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from superinfer.harness.engines.hf import (
    PromptBuilder,
    RequestTrace,
    load_sharegpt_prompts,
    trace_requests_frame,
)
from superinfer.harness.errors import UserError
from superinfer.harness.workload.workload import Workload
from superinfer.sim.request import RequestSpec

if TYPE_CHECKING:
    import httpx

    from superinfer.harness.bench import BenchConfig, CellResult

__all__ = [
    "BACKENDS",
    "HTTP_ENGINE",
    "HTTPOptions",
    "HTTPRun",
    "StreamAccount",
    "StreamError",
    "build_request",
    "http_options",
    "normalize_url",
    "replay_http",
    "run_http_cell",
    "text_prompts",
]

HTTP_ENGINE = "http"
BACKENDS = ("sglang", "vllm", "trtllm", "openai")

#: HTTP statuses worth a retry (when retries are on): the server was busy or briefly down.
_RETRYABLE = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class HTTPOptions:
    """``--engine-option`` settings of the ``http`` engine.

    Attributes:
        endpoint: ``completions`` (``/v1/completions``, the prompt as it is) or ``chat``
            (``/v1/chat/completions``, the prompt as one user message; the server adds its
            chat template, so the model sees more prompt tokens than the workload says).
        model: the ``model`` field (``None``: the first id of the server's ``/v1/models``).
        prompt: ``text`` (ShareGPT text re-tokenizing to the requested length with the
            SmolLM2 tokenizer) or ``ids`` (the token ids themselves; vLLM, SGLang, TensorRT-LLM
            and ``superinfer serve`` accept them on ``/v1/completions``).
        timeout_s: most time a request may take from being sent to its ``[DONE]``, s.
        connect_timeout_s: most time to open a connection, s.
        retries: extra attempts for a request that got no token: connection refused, or HTTP
            429 / 5xx. Off (0) by default: a retry hides overload.
        retry_backoff_s: wait before the first retry, doubled for each further one, s.
        max_connections: most connections open at once (0: unbounded, the open loop as is).
        send_slo: send the SLO (``None``: yes; see the table in the module docstring).
        send_priority: send ``priority`` (``None``: the backend's default).
        eos_token_ids: ``openai``: tokens to ban with ``logit_bias`` (``auto``: the SmolLM2
            tokenizer's end-of-sequence tokens, 0 and 2; ``none``; or ids like ``0,2``).
        exact_output: a stream with fewer or more tokens than requested fails
            (``token_count_mismatch``); off: it counts as finished.
        include_usage: ask for ``stream_options.include_usage``.
    """

    endpoint: str = "completions"
    model: str | None = None
    prompt: str = "text"
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    retries: int = 0
    retry_backoff_s: float = 0.5
    max_connections: int = 0
    send_slo: bool | None = None
    send_priority: bool | None = None
    eos_token_ids: str = "auto"
    exact_output: bool = True
    include_usage: bool = True


def _bool(raw: str, key: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise UserError(f"--engine-option {key}={raw!r}: expected true or false")


def http_options(options: Mapping[str, str]) -> HTTPOptions:
    """Parse ``key=value`` engine options of the ``http`` engine.

    Raises:
        UserError: an unknown key or a bad value; the message names it.
    """
    known = dict(HTTPOptions.__annotations__)
    kwargs: dict[str, Any] = {}
    for key, raw in options.items():
        if key not in known:
            raise UserError(
                f"unknown --engine-option {key!r} for engine http; known: {', '.join(known)}"
            )
        kind = known[key]
        try:
            if kind.startswith("bool"):
                kwargs[key] = _bool(raw, key)
            elif kind.startswith("int"):
                kwargs[key] = int(raw)
            elif kind.startswith("float"):
                kwargs[key] = float(raw)
            else:
                kwargs[key] = raw.strip() or None
        except ValueError:
            raise UserError(f"--engine-option {key}={raw!r}: not a number") from None
    opts = HTTPOptions(**kwargs)
    if opts.endpoint not in ("completions", "chat"):
        raise UserError(f"--engine-option endpoint={opts.endpoint!r}: use completions or chat")
    if opts.prompt not in ("text", "ids"):
        raise UserError(f"--engine-option prompt={opts.prompt!r}: use text or ids")
    if opts.prompt == "ids" and opts.endpoint == "chat":
        raise UserError("--engine-option prompt=ids needs endpoint=completions")
    for key in ("timeout_s", "connect_timeout_s"):
        if not getattr(opts, key) > 0:
            raise UserError(f"--engine-option {key} must be > 0")
    if opts.retries < 0 or opts.max_connections < 0 or opts.retry_backoff_s < 0:
        raise UserError("--engine-option retries, retry_backoff_s, max_connections must be >= 0")
    _eos_ids(opts)  # validates
    return opts


def _eos_ids(opts: HTTPOptions) -> tuple[int, ...] | None:
    """Tokens the ``openai`` backend bans; ``None`` means "the tokenizer's"."""
    raw = (opts.eos_token_ids or "none").strip().lower()
    if raw == "auto":
        return None
    if raw == "none":
        return ()
    try:
        return tuple(int(t) for t in raw.split(",") if t.strip())
    except ValueError:
        raise UserError(
            f"--engine-option eos_token_ids={opts.eos_token_ids!r}: auto, none or ids like 0,2"
        ) from None


def normalize_url(url: str) -> str:
    """The server's base URL without a trailing ``/`` or ``/v1``.

    Raises:
        UserError: not an ``http://`` or ``https://`` URL.
    """
    base = url.strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise UserError(f"--url {url!r}: expected http://HOST:PORT")
    return base.removesuffix("/v1")


# -- what one request looks like on the wire ----------------------------------------------------


def build_request(
    spec: RequestSpec,
    prompt: str | list[int],
    *,
    backend: str,
    opts: HTTPOptions,
    model: str,
    eos_token_ids: Sequence[int] = (),
) -> tuple[str, dict[str, Any], dict[str, str]]:
    """The path, JSON body and headers of one request.

    Args:
        spec: the request (its ``output_tokens`` are forced, its SLO and rank sent).
        prompt: its prompt, text or token ids.
        backend: ``sglang``, ``vllm``, ``trtllm`` or ``openai``.
        opts: the engine options.
        model: the ``model`` field.
        eos_token_ids: ``openai``: tokens banned with ``logit_bias``.
    """
    n = spec.output_tokens
    body: dict[str, Any] = {"model": model, "max_tokens": n, "temperature": 0, "stream": True}
    if opts.include_usage:
        body["stream_options"] = {"include_usage": True}
    if opts.endpoint == "chat":
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        path = "/v1/completions"
        body["prompt"] = prompt
    if backend == "openai":
        if eos_token_ids:
            body["logit_bias"] = {str(t): -100 for t in eos_token_ids}
    else:
        body["ignore_eos"] = True
    slo = spec.slo
    headers: dict[str, str] = {}
    if opts.send_slo is not False:
        targets = {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "deadline_s": slo.deadline_s}
        if backend == "sglang":
            body["custom_params"] = {
                "slo": {"class": slo.name, **{k: v for k, v in targets.items() if v is not None}}
            }
        else:
            headers["x-slo-class"] = slo.name
            for key, value in targets.items():
                if value is not None:
                    headers[f"x-slo-{key.replace('_', '-')}"] = f"{value:g}"
    send_priority = opts.send_priority
    if send_priority is None:
        send_priority = backend in ("sglang", "vllm")
    if send_priority:
        rank = slo.priority
        if backend == "sglang":
            body["priority"] = -rank
        elif backend == "trtllm":
            body["priority"] = 1.0 / (1.0 + max(rank, 0))
        else:
            body["priority"] = rank
    return path, body, headers


# -- reading one stream -------------------------------------------------------------------------


class StreamError(Exception):
    """A stream that cannot be trusted; the message is the request's failure reason."""


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
        done: ``data: [DONE]`` arrived.
        finish_s: arrival instant of the first chunk with a ``finish_reason``.
    """

    chat: bool = False
    event_times_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    finish_s: float | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    done: bool = False

    def feed(self, data: str, at_s: float) -> None:
        """Account for one event's data.

        Raises:
            StreamError: the data is not an OpenAI chunk (``malformed_sse``) or is an error
                object (``stream_error``).
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
            raise StreamError(f"stream_error: {str(message)[:200]}")
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self.completion_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
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
    """

    records: list[RequestTrace]
    attempts: list[int]
    submit_lag_s: list[float]
    server_prompt_tokens: list[int | None]
    wall_s: float


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
                return "failed", str(exc), 200
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
            reason.startswith("not_sent") or (http_status in _RETRYABLE and status == "failed")
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


# -- prompts and the cell -----------------------------------------------------------------------


def text_prompts(
    tokenizer: Any, builder: PromptBuilder, specs: Sequence[RequestSpec]
) -> tuple[list[str], list[int]]:
    """Text prompts that re-tokenize to each request's ``prompt_tokens`` with ``tokenizer``.

    Request ``i``'s text is the decoded :meth:`PromptBuilder.build` of ``i``. A cut can land
    inside a word (or a UTF-8 sequence) and re-tokenize to another count; then the text is the
    shortest character prefix of a slightly longer decoded cut that tokenizes to the requested
    count (token counts grow with the prefix, so a binary search finds it), dropping up to 7
    leading characters when one character adds two tokens at the end.

    Returns:
        The texts, and each one's token count under ``tokenizer`` (equal to ``prompt_tokens``
        unless no prefix has exactly that count).
    """

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    texts, counts = [], []
    for i, spec in enumerate(specs):
        want = spec.prompt_tokens
        text = tokenizer.decode(builder.build(i, want))
        got = count(text)
        longer = tokenizer.decode(builder.build(i, want + 8)) if got != want else ""
        for skip in range(8 if got != want else 0):  # drop 0, 1, ... leading characters
            base = longer[skip:]
            lo, hi = 0, len(base)
            while lo < hi:  # the shortest prefix with at least `want` tokens
                mid = (lo + hi) // 2
                if count(base[:mid]) >= want:
                    hi = mid
                else:
                    lo = mid + 1
            n = count(base[:lo])
            if abs(n - want) < abs(got - want):
                text, got = base[:lo], n
            if got == want:
                break
        texts.append(text)
        counts.append(got)
    return texts, counts


def _discover_model(base: str, opts: HTTPOptions) -> str:
    import httpx

    try:
        response = httpx.get(f"{base}/v1/models", timeout=opts.connect_timeout_s + 5)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise UserError(
            f"cannot read the model name from {base}/v1/models ({type(exc).__name__}: {exc}); "
            "is the server up? --engine-option model=NAME skips this"
        ) from None


def run_http_cell(config: BenchConfig, engine: str, policy: str, workload: Workload) -> CellResult:
    """Replay ``workload`` against ``config.url`` (``--backend config.backend``), in real time.

    ``policy`` only labels the rows: the server runs its own.

    Raises:
        UserError: no ``--url``, a bad option, the client or tokenizer packages missing, the
            model name unreadable from the server.
    """
    from superinfer.harness.bench import TIMELINE_COLUMNS, CellResult

    if not config.url:
        raise UserError("engine http needs --url http://HOST:PORT of an OpenAI-compatible server")
    opts = http_options(config.engine_options)
    base = normalize_url(config.url)
    if config.backend not in BACKENDS:
        raise UserError(f"unknown --backend {config.backend!r}; known: {', '.join(BACKENDS)}")
    try:
        import httpx  # noqa: F401
        import httpx_sse  # noqa: F401

        from superinfer.adapters.hf.engine import ModelNotInstalledError, load_smollm2_tokenizer
    except ImportError as exc:
        raise UserError(
            f"engine http needs the http and hf extras ({exc}); run `make install-serve`"
        ) from None
    try:
        tokenizer = load_smollm2_tokenizer()
    except ModelNotInstalledError as exc:
        raise UserError(str(exc)) from None
    specs = workload.requests
    if not specs:
        raise UserError("the workload has no requests")
    builder = PromptBuilder(tokenizer, load_sharegpt_prompts(), seed=config.seed)
    prompts: list[str | list[int]]
    if opts.prompt == "ids":
        prompts = [builder.build(i, s.prompt_tokens) for i, s in enumerate(specs)]
        counts = [s.prompt_tokens for s in specs]
    else:
        texts, counts = text_prompts(tokenizer, builder, specs)
        prompts = list(texts)
    eos = _eos_ids(opts)
    if eos is None:
        eos = tuple(sorted({int(tokenizer.eos_token_id), int(tokenizer.convert_tokens_to_ids(
            "<|endoftext|>"))}))  # fmt: skip
    model = opts.model or _discover_model(base, opts)
    run = replay_http(
        base, specs, prompts, backend=config.backend, opts=opts, model=model,
        eos_token_ids=eos if config.backend == "openai" else (),
    )  # fmt: skip
    df = trace_requests_frame(run.records, {}, engine=engine, policy=policy)
    classes = {s.slo.name for s in specs}
    peaks = {name: float("nan") for name in (*classes, "all", "all_active")}
    lags = np.array(run.submit_lag_s)
    server_counts = [
        (c, s) for c, s in zip(counts, run.server_prompt_tokens, strict=True) if s is not None
    ]
    mismatch = [abs(c - s.prompt_tokens) for c, s in zip(counts, specs, strict=True)]
    reasons = pd.Series([r.reason.split(":")[0] for r in run.records if r.reason])
    info = {
        "wall_s": round(run.wall_s, 3),
        "url": base,
        "backend": config.backend,
        "model": model,
        "http": asdict(opts),
        "eos_token_ids_banned": list(eos) if config.backend == "openai" else [],
        "submit_lag_ms": {
            "p50": round(float(np.percentile(lags, 50)) * 1e3, 3),
            "max": round(float(lags.max()) * 1e3, 3),
        },
        "attempts": int(sum(run.attempts)),
        "prompt_tokens_off": {
            "requests": int(sum(m > 0 for m in mismatch)),
            "max": int(max(mismatch)),
        },
        "server_prompt_tokens_off": {
            "requests_with_usage": len(server_counts),
            "differ": int(sum(c != s for c, s in server_counts)),
            "max": int(max((abs(c - s) for c, s in server_counts), default=0)),
        },
        "reasons": {str(k): int(v) for k, v in reasons.value_counts().sort_index().items()},
        "kv": "not observable over HTTP (kv_peak_gb is empty)",
    }
    timeline = pd.DataFrame(columns=list(TIMELINE_COLUMNS))
    return CellResult(df, peaks, timeline, info)
