"""Request parsing and validation: an OpenAI body and headers -> what the engine runs and the
request's SLO, or a :class:`RequestError` naming the field (HTTP 400)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from starlette.responses import JSONResponse

from superinfer.policy_core.slo_forms import SLO_FORMS, engine_relative, for_request, has_forms
from superinfer.policy_core.types import SLO
from superinfer.serve.config import ServeConfig

__all__ = [
    "NO_EFFECT_FIELDS",
    "READ_FIELDS",
    "Params",
    "RequestError",
    "chat_ids",
    "ignored_fields",
    "parse_request",
    "priority_rank",
    "prompt_ids",
    "request_slo",
    "resolve_slo",
]

_SLO_HEADERS = {
    "ttft_ms": "x-slo-ttft-ms",
    "tpot_ms": "x-slo-tpot-ms",
    "deadline_s": "x-slo-deadline-s",
}


_SLO_FORMS = SLO_FORMS  # what a request may give beside the absolute targets
#: Per target, its forms: a request setting one form of a target drops the class's others.
_TARGET_FORMS = (
    ("ttft_ms", "ttft_ms_per_1k_prompt", "ttft_x_isolated"),
    ("tpot_ms", "tpot_x_isolated"),
)


class RequestError(Exception):
    """A request the server answers with an HTTP error before it reaches the engine.

    Args:
        status: HTTP status code.
        message: one line naming the field.
        param: the offending field, if one.
        kind: OpenAI error ``type``.
        code: OpenAI error ``code`` (e.g. ``model_not_found``), if one.
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.code = code

    def response(self, code: str | None = None) -> JSONResponse:
        """The OpenAI-shaped error body (``code``: this error's own unless given)."""
        code = code if code is not None else self.code
        body = {"message": self.message, "type": self.kind, "param": self.param, "code": code}
        return JSONResponse({"error": body}, status_code=self.status)


# -- request fields ---------------------------------------------------------------------------


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(400, f"{where} must be a number, got {value!r}", where)
    if not (math.isfinite(value) and value > 0):
        raise RequestError(400, f"{where} must be > 0, got {value!r}", where)
    return float(value)


def _text(value: str, where: str) -> str:
    """``value`` if it encodes to UTF-8; a lone surrogate (``"\\ud800"`` is valid JSON but no
    text) raises a :class:`RequestError` naming ``where`` instead of failing in the tokenizer."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(
            400, f"{where}: not valid text (a lone surrogate at character {exc.start})", where
        ) from None
    return value


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
    if extra := sorted(set(overrides) - set(_SLO_HEADERS) - set(_SLO_FORMS)):
        raise RequestError(400, f"{where}: unknown field {extra[0]!r}", where)
    values: dict[str, Any] = {k: _positive(v, f"{where}.{k}") for k, v in overrides.items()}
    for forms in _TARGET_FORMS:
        if any(k in values for k in forms):
            values = {**dict.fromkeys(forms), **values}
            if values.get("ttft_ms_per_1k_prompt") and values.get("ttft_ms") is None:
                values["ttft_ms"] = config.slo_classes[name].ttft_ms  # the class's base
    try:
        return replace(config.slo_classes[name], **values)
    except ValueError as exc:  # forms that clash: named by the first form given
        field = next((k for k in _SLO_FORMS if k in values and k in str(exc)), "")
        param = f"{where}.{field}" if field else where
        raise RequestError(400, f"{param}: {str(exc).split(': ', 1)[-1]}", param) from None


def request_slo(slo: SLO, prompt_tokens: int, config: ServeConfig) -> SLO:
    """The absolute targets of one request of ``prompt_tokens`` tokens
    (``policy_core.slo_forms.for_request``; engine-relative forms use
    ``config.isolated_latency``).

    Raises:
        RequestError: an engine-relative target on a server without a step-time calibration.
    """
    if not has_forms(slo):
        return slo
    prefill = decode = None
    if engine_relative(slo):
        if config.isolated_latency is None:
            field = "ttft_x_isolated" if slo.ttft_x_isolated is not None else "tpot_x_isolated"
            raise RequestError(
                400, f"slo.{field}: this server has no step-time calibration", f"slo.{field}"
            )
        prefill, decode = config.isolated_latency(prompt_tokens)
    return for_request(slo, prompt_tokens, prefill_ms=prefill, decode_ms=decode)


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
    if custom is not None and not isinstance(custom, dict):
        raise RequestError(400, "custom_params must be an object", "custom_params")
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
class Params:
    """What a parsed request asks the engine for.

    Attributes:
        ignored: the body's top-level fields this server neither reads nor lists as accepted
            without effect (:func:`ignored_fields`), sorted: served anyway, and logged.
    """

    input_ids: list[int]
    max_tokens: int
    eos_token_ids: tuple[int, ...]
    stream: bool
    include_usage: bool
    ignored: tuple[str, ...] = ()


#: Fields the server refuses (HTTP 400) when they ask for what it does not serve, with the test
#: of a value that asks for it.
_UNSUPPORTED: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("n", lambda v: v not in (None, 1)),
    ("best_of", lambda v: v not in (None, 1)),
    ("stop", bool),
    ("logprobs", bool),
    ("top_logprobs", bool),
    ("echo", bool),
    ("suffix", bool),
    ("tools", bool),
)
#: Top-level body fields the server reads: :func:`parse_request` (and its refusals,
#: ``_UNSUPPORTED``) and :func:`resolve_slo`.
READ_FIELDS = frozenset(
    {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream",
     "stream_options", "ignore_eos", "min_tokens", "logit_bias", "slo", "custom_params",
     "priority"}
    | {key for key, _ in _UNSUPPORTED}
)  # fmt: skip
#: Fields of the OpenAI API (and vLLM's / SGLang's sampling extras) accepted and without effect:
#: decoding is greedy with one generation config, and bookkeeping fields are not stored
#: (docs/serve.md).
NO_EFFECT_FIELDS = frozenset(
    {"temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
     "frequency_penalty", "repetition_penalty", "user", "metadata", "store", "service_tier",
     "tool_choice", "parallel_tool_calls"}
)  # fmt: skip
_KNOWN_FIELDS = READ_FIELDS | NO_EFFECT_FIELDS


def ignored_fields(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The body's top-level fields in neither :data:`READ_FIELDS` nor :data:`NO_EFFECT_FIELDS`,
    sorted: a misspelt ``max_token`` or a feature this server lacks (``response_format``). Like
    vLLM (which logs them) the request is served without them; the server logs them and counts
    the request (``superinfer_requests_with_ignored_fields_total``)."""
    return tuple(sorted(str(k) for k in body if k not in _KNOWN_FIELDS))


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
        raise RequestError(
            400, f"min_tokens must be an integer >= 0, got {min_tokens!r}", "min_tokens"
        )
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
    for key, bad in _UNSUPPORTED:
        if key in body and bad(body[key]):
            raise RequestError(400, f"{key}={body[key]!r} is not supported by this server", key)


def prompt_ids(body: Mapping[str, Any], tokenizer: Any) -> list[int]:
    """Token ids of a completion request's ``prompt`` (a string, or one list of token ids).

    Raises:
        RequestError: a missing, empty or malformed prompt, or a token id outside the
            vocabulary.
    """
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = list(tokenizer(_text(prompt, "prompt"), add_special_tokens=False)["input_ids"])
    elif isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        vocab = len(tokenizer)
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


def chat_ids(body: Mapping[str, Any], tokenizer: Any) -> list[int]:
    """Token ids of a chat request's ``messages`` through the tokenizer's chat template (with
    the generation prompt); content parts must be text.

    Raises:
        RequestError: missing or malformed messages.
    """
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
        clean.append(
            {
                "role": _text(msg["role"], f"messages[{i}].role"),
                "content": _text(content, f"messages[{i}].content"),
            }
        )
    text = tokenizer.apply_chat_template(clean, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# -- requests ---------------------------------------------------------------------------


def parse_request(
    body: Any,
    *,
    chat: bool,
    tokenizer: Any,
    max_model_len_tokens: int,
    eos_token_ids: tuple[int, ...],
    model: str | None = None,
) -> Params:
    """The engine request of an OpenAI body: its token ids, output cap (OpenAI's defaults: to
    the end of the context for chat, 16 otherwise), active end-of-sequence tokens and stream
    settings.

    Args:
        model: the served model's id; a body naming another ``model`` is answered 404
            (``model_not_found``, as OpenAI and vLLM answer), one without ``model`` is served.

    Raises:
        RequestError: a malformed or unsupported field (HTTP 400), another model (HTTP 404).
    """
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise RequestError(400, f"model must be a string, got {name!r}", "model")
    if model is not None and name is not None and name != model:
        raise RequestError(
            404, f"the model {name!r} does not exist (this server serves {model!r})", "model",
            code="model_not_found",
        )  # fmt: skip
    _unsupported(body)
    ids = chat_ids(body, tokenizer) if chat else prompt_ids(body, tokenizer)
    room = max_model_len_tokens - len(ids)
    max_tokens = _max_tokens(body, chat, max(room, 1))
    eos = _eos_after_bans(body, eos_token_ids, max_tokens)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError(400, "stream_options must be an object", "stream_options")
    return Params(
        ids, max_tokens, eos, stream, bool(options.get("include_usage")), ignored_fields(body)
    )
