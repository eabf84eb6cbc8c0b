"""The serving engine bridge: the hf adapter's running ``EngineSession`` as the routes see it
(submit, next event, cancel, per-class statistics and latency histograms)."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from starlette.responses import JSONResponse
from transformers.generation.continuous_batching.requests import GenerationOutput

from superinfer.adapters.hf.engine import EngineSession, LoadedModel
from superinfer.adapters.hf.view import TrackedRequest
from superinfer.policy_core.types import SLO
from superinfer.serve.config import ServeConfig
from superinfer.serve.metrics import TPOT_BUCKETS_S, TTFT_BUCKETS_S, EngineCollector
from superinfer.serve.parsing import Params, RequestError, parse_request

_log = logging.getLogger(__name__)
#: At most this many ignored field names per log line, each cut to :data:`_NAME_CHARS`.
_NAMES_LOGGED, _NAME_CHARS = 8, 40

__all__ = [
    "CLIENT_DISCONNECTED",
    "SERVER_SHUTDOWN",
    "ClassStats",
    "Ended",
    "Live",
    "ServingEngine",
    "failure_kind",
]

#: Reason of a request whose client went away before its answer was complete.
CLIENT_DISCONNECTED = "client disconnected"
#: Failure reason of a request still running when the shutdown's drain time ran out.
SERVER_SHUTDOWN = "server shutdown"
#: Reason prefix of a request failed because the policy raised on it (hf adapter).
POLICY_ERROR = "policy error"


def failure_kind(reason: str) -> str:
    """The metric label of a failure reason: its text before the first ``:``, snake_cased
    (``"policy error: OverflowError: ..."`` -> ``"policy_error"``), ``"other"`` if empty."""
    head = reason.split(":", 1)[0].strip().lower().replace(" ", "_")
    return head or "other"


@dataclass(slots=True)
class Ended:
    """A request ended without an engine output (rejected, cancelled)."""

    status: str
    reason: str


@dataclass
class Live:
    """A request the server has handed to the engine."""

    request_id: str
    slo: SLO
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    eos_token_ids: tuple[int, ...]
    events: asyncio.Queue[GenerationOutput | Ended] = field(default_factory=asyncio.Queue)
    tokens: list[int] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)
    ended: bool = False


@dataclass(slots=True)
class ClassStats:
    """Requests of one SLO class ended so far: finished, rejected, failed, and finished within
    every target (``met``); ``failed_by_kind`` splits ``failed`` by the kind of its reason
    (:func:`failure_kind`: ``policy_error``, ``client_disconnected``, ``engine_error``, ...)."""

    finished: int = 0
    rejected: int = 0
    failed: int = 0
    met: int = 0
    failed_by_kind: dict[str, int] = field(default_factory=dict)


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
        self._live: dict[str, Live] = {}
        self._stats: dict[str, ClassStats] = {}
        #: requests answered before the engine, by (HTTP status, field; "" if none)
        self.refused: dict[tuple[int, str], int] = {}
        #: requests served with top-level fields the server ignored (``Params.ignored``)
        self.ignored_field_requests = 0
        #: the server is shutting down: a request cancelled now is failed ``server shutdown``
        self.draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(self))
        self.ttft_s = Histogram(
            "superinfer_ttft_seconds",
            "Time to first token of finished requests (engine side: from receipt), s",
            ["slo_class"],
            buckets=TTFT_BUCKETS_S,
            registry=self.registry,
        )
        self.tpot_s = Histogram(
            "superinfer_tpot_seconds",
            "Time per output token after the first, of finished requests with >= 2 tokens, s",
            ["slo_class"],
            buckets=TPOT_BUCKETS_S,
            registry=self.registry,
        )
        session.binding.on_end = self._on_end_thread
        # a policy error fails its own request; the engine serves on (plugin.PolicyScheduler)
        session.binding.isolate_policy_errors = True

    @property
    def policy_errors(self) -> int:
        """Requests failed (or lifecycle hooks failed) because the policy raised, so far."""
        binding = self.session.binding
        with binding.lock:
            return binding.policy_errors

    def refuse(self, err: RequestError) -> JSONResponse:
        """Count a request answered with ``err`` before it reached the engine (a malformed or
        unsupported field, another model, a stopped engine) in ``superinfer_requests_refused``
        by status and field, and return its response: every request the server receives is
        counted once, here or as ended by the engine."""
        key = (err.status, re.sub(r"\[\d+\]", "[]", err.param or ""))
        self.refused[key] = self.refused.get(key, 0) + 1
        return err.response()

    def limits(self) -> tuple[int, int]:
        """``(context length, KV blocks of the pool)``, what a request must fit."""
        return self.loaded.max_model_len_tokens, self.session.binding.capacity_blocks

    def live_requests(self) -> int:
        """Requests handed to the engine whose end the server has not yet recorded."""
        return len(self._live)

    @property
    def healthy(self) -> bool:
        """The engine loop runs."""
        manager = self.session.manager
        return manager is not None and manager.is_running() and self.session.fatal_error is None

    # -- parsing ----------------------------------------------------------------------------

    def parse(self, body: Any, *, chat: bool) -> Params:
        """The engine request of an OpenAI body (``parsing.parse_request`` with this engine's
        tokenizer, context length and end-of-sequence tokens).

        A body with fields the server ignores (``Params.ignored``) is served; the fields are
        logged (a warning naming up to 8 of them, as vLLM logs them) and the request counted in
        ``superinfer_requests_with_ignored_fields``.

        Raises:
            RequestError: a malformed or unsupported field (HTTP 400).
        """
        params = parse_request(
            body,
            chat=chat,
            tokenizer=self.tokenizer,
            max_model_len_tokens=self.loaded.max_model_len_tokens,
            eos_token_ids=self.eos_token_ids,
            model=self.config.served_model_name,
        )
        if params.ignored:
            self.ignored_field_requests += 1
            names = ", ".join(repr(n[:_NAME_CHARS]) for n in params.ignored[:_NAMES_LOGGED])
            more = len(params.ignored) - _NAMES_LOGGED
            _log.warning(
                "request fields ignored (not read by this server): %s%s",
                names, f" and {more} more" if more > 0 else "",
            )  # fmt: skip
        return params

    def submit(self, params: Params, slo: SLO) -> Live:
        """Hand a parsed request to the engine (from the event loop).

        Raises:
            RequestError: the engine loop has stopped (HTTP 503).
        """
        if not self.healthy:
            raise RequestError(503, "the engine has stopped", kind="engine_error")
        self._loop = asyncio.get_running_loop()
        live = Live(
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
            loop.call_soon_threadsafe(live.events.put_nowait, Ended(status, reason))

    async def next_event(
        self, live: Live, disconnected: Callable[[], Awaitable[bool]] | None = None
    ) -> GenerationOutput | Ended | None:
        """The request's next engine event; ``None`` if the client went away while waiting (the
        request is then cancelled)."""
        while True:
            try:
                return await asyncio.wait_for(live.events.get(), timeout=0.5)
            except asyncio.TimeoutError:
                if not self.healthy and live.events.empty():
                    return Ended("failed", f"engine_error: {self.session.fatal_error}")
                if disconnected is not None and await disconnected():
                    self.cancel(live)
                    return None

    def cancel(self, live: Live, reason: str | None = None) -> None:
        """Drop a request whose client went away (or that the shutdown cuts): the engine
        frees its KV at its next loop iteration; it is counted ``failed`` with ``reason``
        (default :data:`CLIENT_DISCONNECTED`, :data:`SERVER_SHUTDOWN` while ``draining``), and
        a waiting route gets an :class:`Ended` with it."""
        if reason is None:
            reason = SERVER_SHUTDOWN if self.draining else CLIENT_DISCONNECTED
        if not live.ended:
            self.session.cancel(live.request_id)
            self._finish(live, "failed", reason)
            live.events.put_nowait(Ended("failed", reason))

    def cancel_all(self) -> int:
        """Fail every request in flight with :data:`SERVER_SHUTDOWN` (the shutdown's drain time
        ran out, or a second SIGINT forced it); each route then answers its client with the
        failure. Returns how many were cut."""
        cut = [live for live in list(self._live.values()) if not live.ended]
        for live in cut:
            self.cancel(live, SERVER_SHUTDOWN)
        return len(cut)

    def take(self, live: Live, out: GenerationOutput) -> tuple[list[int], str | None]:
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

    def _finish(self, live: Live, status: str, reason: str) -> None:
        if live.ended:
            return
        live.ended = True
        self._live.pop(live.request_id, None)
        if status != "finished":  # the engine drops the output handler of finished ones only
            self.session.forget_handler(live.request_id)
        stats = self._stats.setdefault(live.slo.name, ClassStats())
        if status == "rejected":
            stats.rejected += 1
            return
        if status != "finished":
            stats.failed += 1
            kind = failure_kind(reason)
            stats.failed_by_kind[kind] = stats.failed_by_kind.get(kind, 0) + 1
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

    def end(self, live: Live, ended: Ended) -> None:
        """Record an end the engine reported without an output."""
        self._finish(live, ended.status, ended.reason)

    def stats(self) -> dict[str, ClassStats]:
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
