"""The ``http`` engine: replay a workload against any OpenAI-compatible server, open loop.

One asyncio task per request, started at the request's arrival instant whatever the server is
doing (open loop), streams ``/v1/completions`` (or ``/v1/chat/completions``) as server-sent
events with ``httpx`` and ``httpx-sse``, and stamps every event that carries output text on the
client's monotonic clock. The requests table is built by the same code as the real CPU engine's
(``engines.hf.trace_requests_frame``), and the summary by ``metrics.summarize``: TTFT, TPOT, ITL
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
  (``superinfer serve``: the policy or the engine's limits), with the server's code as reason,
  or ended its stream with an error of code 503 before any token (SGLang, when a scheduler
  aborts a request with 503: our plugin's rejections), with the server's message as reason;
* ``failed``, with a reason: ``http_<status>: <message>``, ``timeout: ...``, ``stream_cut: ...``
  (the connection closed before ``[DONE]``), ``malformed_sse: ...`` (a ``data:`` line that is
  not an OpenAI chunk), ``stream_error: ...`` (an ``error`` object in the stream),
  ``not_event_stream: ...``, ``token_count_mismatch: ...``, ``no_tokens``, or
  ``not_sent: connect_error: ...`` when the request never reached the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from superinfer.harness.engines.base import TIMELINE_COLUMNS, BenchConfig, CellResult
from superinfer.harness.engines.hf import trace_requests_frame
from superinfer.harness.engines.http_client import (
    BACKENDS,
    HTTP_ENGINE,
    HTTPOptions,
    build_request,
    eos_ids,
    http_options,
    normalize_url,
)
from superinfer.harness.engines.http_stream import HTTPRun, StreamAccount, StreamError, replay_http
from superinfer.harness.errors import UserError
from superinfer.harness.workload.prompts import (
    PromptBuilder,
    hashed_prompt_ids,
    load_sharegpt_prompts,
)
from superinfer.harness.workload.workload import Workload
from superinfer.sim.request import RequestSpec

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
        vocab = len(tokenizer)
        prompts = [
            hashed_prompt_ids(s.block_hashes, s.hash_block_tokens, s.prompt_tokens,
                              vocab_size=vocab, seed=config.seed, index=i)
            if s.block_hashes and s.hash_block_tokens
            else builder.build(i, s.prompt_tokens)
            for i, s in enumerate(specs)
        ]  # fmt: skip
        counts = [s.prompt_tokens for s in specs]
    else:
        texts, counts = text_prompts(tokenizer, builder, specs)
        prompts = list(texts)
    eos = eos_ids(opts)
    if eos is None:
        eos = tuple(sorted({int(tokenizer.eos_token_id), int(tokenizer.convert_tokens_to_ids(
            "<|endoftext|>"))}))  # fmt: skip
    model = opts.model or _discover_model(base, opts)
    run = replay_http(
        base, specs, prompts, backend=config.backend, opts=opts, model=model,
        eos_token_ids=eos if config.backend == "openai" else (),
    )  # fmt: skip
    df = trace_requests_frame(run.records, {}, engine=engine, policy=policy)
    reported = [c for c in run.server_cached_tokens if c is not None]
    if reported:  # the server's prefix-cache hits (summary: prompt_tokens_cached, prefix_hit_rate)
        df["cached_tokens"] = [np.nan if c is None else c for c in run.server_cached_tokens]
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
        "cached_tokens_reported": len(reported),
    }
    timeline = pd.DataFrame(columns=list(TIMELINE_COLUMNS))
    return CellResult(df, peaks, timeline, info)
