"""Shared pieces of the live-server tests: one real SGLang server per test module (CPU recipe)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from superinfer.adapters.sglang.server import SGLangServer

#: Server flags of the live tests: a KV pool small enough that 8 requests of 300 tokens retract,
#: 4 running requests so that later arrivals queue, metrics for the per-request timestamps.
LIVE_ARGS = ("--enable-metrics", "--max-total-tokens", "1024", "--max-running-requests", "4")
#: SGLang reserves this many new tokens per admitted request (default 256): small, so admission is
#: optimistic and decode runs into the KV limit (retraction) as in ../shared/engines/sglang-cpu.md.
LIVE_ENV = {"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": "16"}
START_TIMEOUT_S = 400.0

_WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
    "tau"
).split()


def live_server(policy: str, **kwargs: Any) -> Iterator[SGLangServer]:
    """Start the module's server (a failed start raises: the test errors, never skips)."""
    server = SGLangServer(
        policy, LIVE_ARGS, env=LIVE_ENV, start_timeout_s=START_TIMEOUT_S, **kwargs
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def prompt(seed: int, words: int) -> str:
    """A deterministic prompt of ``words`` words (about 3 tokens each)."""
    return " ".join(
        f"{_WORDS[(seed * 7 + k) % len(_WORDS)]}{(seed * 31 + k) % 97}" for k in range(words)
    )


def generate(
    server: SGLangServer, text: str, tokens: int, slo: Any = None, priority: int | None = None
) -> dict[str, Any]:
    """``/generate`` of exactly ``tokens`` tokens; SGLang's ``meta_info``."""
    params: dict[str, Any] = {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0}
    if slo is not None:
        params["custom_params"] = {"slo": slo}
    body: dict[str, Any] = {"text": text, "sampling_params": params}
    if priority is not None:
        body["priority"] = priority
    return server.post("/generate", body)["meta_info"]


def first_token_ts(meta: dict[str, Any]) -> float:
    """When the server produced the request's first token (``--enable-metrics`` fields)."""
    return float(meta["request_received_ts"]) + float(meta["first_token_latency"])


def concurrently(jobs: dict[str, Callable[[], Any]], gaps: dict[str, float]) -> dict[str, Any]:
    """Run ``jobs`` on threads, started in order with ``gaps[name]`` seconds before each."""
    out: dict[str, Any] = {}
    errors: list[BaseException] = []
    threads = []
    for name, job in jobs.items():
        time.sleep(gaps.get(name, 0.0))

        def run(name: str = name, job: Callable[[], Any] = job) -> None:
            try:
                out[name] = job()
            except BaseException as exc:  # re-raised in the test's thread
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return out


def chat_behind_batch(server: SGLangServer) -> tuple[float, float, dict[str, float]]:
    """8 batch requests (200 tokens each, 4 run at once, sent 50 ms apart), then 0.25 s after the
    last one a chat request.

    200 decode steps of the first four take 0.8 s on 2 quiet cores (4 ms a step) and 3-12 s on
    loaded ones, so the last 4 batch requests are still queued when chat arrives (the caller
    checks: a run where none is queued proves nothing).

    Returns:
        ``(chat received ts, chat first-token ts, {batch name: first-token ts})``.
    """
    jobs: dict[str, Callable[[], Any]] = {
        f"b{i}": (lambda i=i: generate(server, prompt(i, 5), 200, "batch", -1)) for i in range(8)
    }
    jobs["chat"] = lambda: generate(server, prompt(99, 5), 8, "chat", 0)
    gaps = {f"b{i}": 0.05 for i in range(8)} | {"chat": 0.25}
    metas = concurrently(jobs, gaps)
    chat = metas.pop("chat")
    batch = {name: first_token_ts(meta) for name, meta in metas.items()}
    return float(chat["request_received_ts"]), first_token_ts(chat), batch


def wait_stats(
    server: SGLangServer, ready: Callable[[dict[str, Any]], bool], timeout_s: float = 20.0
) -> dict[str, Any]:
    """The plugin's stats once ``ready(stats)`` holds (or the last ones after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = server.stats() or {}
        if (stats and ready(stats)) or time.monotonic() > deadline:
            return stats
        time.sleep(0.25)
