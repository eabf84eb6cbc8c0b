"""The ``http`` engine's options and how one request is sent to each kind of server
(``--backend``; see ``engines.http``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from superinfer.harness.errors import UserError
from superinfer.sim.request import RequestSpec

__all__ = [
    "BACKENDS",
    "HTTP_ENGINE",
    "RETRYABLE",
    "HTTPOptions",
    "build_request",
    "eos_ids",
    "http_options",
    "normalize_url",
]

HTTP_ENGINE = "http"
BACKENDS = ("sglang", "vllm", "trtllm", "openai")

#: HTTP statuses worth a retry (when retries are on): the server was busy or briefly down.
RETRYABLE = frozenset({429, 500, 502, 503, 504})


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
            and ``superinfer serve`` accept them on ``/v1/completions``). With ``ids``, a request
            that carries block hashes (Mooncake, the ``gen-*`` traces) gets one fixed block of
            ids per hash (``workload.prompts.hashed_prompt_ids``), so its prefix sharing reaches
            the server's cache as the trace records it.
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
    eos_ids(opts)  # validates
    return opts


def eos_ids(opts: HTTPOptions) -> tuple[int, ...] | None:
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
