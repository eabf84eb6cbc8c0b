"""``superinfer.serve``: an OpenAI-compatible server on the real CPU engine, with the policy
deciding every step.

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

Modules: ``config`` (:class:`ServeConfig`, the default SLO classes), ``parsing`` (request bodies
and headers -> what the engine runs, and the 400 errors), ``engine`` (:class:`ServingEngine`, the
bridge to the hf adapter's ``EngineSession``), ``metrics`` (Prometheus), ``responses`` (OpenAI
response bodies and server-sent events), ``app`` (routes, :func:`serve_forever`). This package
imports the hf adapter (``superinfer.adapters.hf``) and ``policy_core``; nothing below it
imports it.
"""

from __future__ import annotations

from superinfer.serve.app import build_app, serve_forever
from superinfer.serve.config import DEFAULT_SLO_CLASSES, PRIORITY_CONVENTIONS, ServeConfig
from superinfer.serve.engine import ServingEngine
from superinfer.serve.parsing import (
    RequestError,
    ignored_fields,
    priority_rank,
    request_slo,
    resolve_slo,
)

__all__ = [
    "DEFAULT_SLO_CLASSES",
    "PRIORITY_CONVENTIONS",
    "RequestError",
    "ServeConfig",
    "ServingEngine",
    "build_app",
    "ignored_fields",
    "priority_rank",
    "request_slo",
    "resolve_slo",
    "serve_forever",
]
