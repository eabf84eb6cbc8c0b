"""The requests of ``bench --suite engines`` (issue 24): one workload design for every engine.

:func:`mix_workload` draws Poisson chat (short prompts) and batch (long prompts, up to SGLang's
1,024-token context with their output) streams with the same absolute SLOs on every engine;
:func:`lone_workload` spaces requests far apart (the engine's unloaded TTFT and TPOT);
:func:`batched_workload` sends groups of identical chats at once (the decode step at 2, 4, 8, ...
sequences). Each is seeded: the same arguments give the same requests.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from superinfer.harness.errors import UserError
from superinfer.harness.suites_engines_options import (
    BATCH_OUTPUT,
    BATCH_PROMPT,
    CHAT_OUTPUT,
    CHAT_PROMPT,
    MIN_EXPECTED,
    SuiteOptions,
)
from superinfer.harness.workload.workload import Source, Workload
from superinfer.policy_core.types import SLO
from superinfer.sim.request import RequestSpec

__all__ = [
    "BATCHED_OUTPUT",
    "BATCHED_PROMPT",
    "batched_concurrency",
    "batched_sizes",
    "batched_workload",
    "lone_workload",
    "mix_workload",
]


def _spec(i: int, slo: SLO, t: float, prompt: int, out: int) -> RequestSpec:
    return RequestSpec(
        request_id=f"{slo.name}-{i}",
        arrival_s=round(t, 3),
        prompt_tokens=prompt,
        output_tokens=out,
        max_output_tokens=out,
        slo=slo,
        source=slo.name,
    )


def _workload(name: str, specs: list[RequestSpec], opts: SuiteOptions, **details: Any) -> Workload:
    chat, batch = opts.slos()
    specs.sort(key=lambda s: (s.arrival_s, s.request_id))
    sources = (
        Source("chat", "synthetic", chat, CHAT_OUTPUT[1]),
        Source("batch", "synthetic", batch, BATCH_OUTPUT[1]),
    )
    duration = max((s.arrival_s for s in specs), default=0.0)
    details = {
        "generator": f"harness/suites_engines_workload.py::{name}",
        "chat_prompt": CHAT_PROMPT,
        "chat_output": CHAT_OUTPUT,
        "batch_prompt": BATCH_PROMPT,
        "batch_output": BATCH_OUTPUT,
        **details,
    }
    return Workload(name, tuple(specs), sources, 1.0, duration, details=details)


def mix_workload(opts: SuiteOptions, load: float, seed: int) -> Workload:
    """The suite's requests at ``load`` total req/s: two Poisson streams on one clock over
    ``opts.duration_s`` (or ``MIN_EXPECTED / load`` if longer): chat at ``(1 - batch_share) *
    load``, batch at ``batch_share * load``, lengths uniform in the class ranges; ids
    ``chat-I`` / ``batch-I``, in arrival order.

    Raises:
        UserError: no request falls in the window.
    """
    specs: list[RequestSpec] = []
    window = max(opts.duration_s, MIN_EXPECTED / load)
    for k, (slo, share, prompt, output) in enumerate(
        zip(
            opts.slos(),
            (1 - opts.batch_share, opts.batch_share),
            (CHAT_PROMPT, BATCH_PROMPT),
            (CHAT_OUTPUT, BATCH_OUTPUT),
            strict=True,
        )
    ):
        rng = np.random.default_rng([seed, k])
        t, i = 0.0, 0
        while True:
            t += float(rng.exponential(1.0 / (share * load)))
            if t >= window:
                break
            out = int(rng.integers(output[0], output[1] + 1))
            specs.append(_spec(i, slo, t, int(rng.integers(prompt[0], prompt[1] + 1)), out))
            i += 1
    if not specs:
        raise UserError(f"load {load:g} req/s over {window:g} s draws no request")
    return _workload(
        "engines-mix", specs, opts, load_rps=load, seed=seed, batch_share=opts.batch_share
    )


def lone_workload(opts: SuiteOptions, gap_s: float) -> Workload:
    """``opts.lone`` chat then ``opts.lone`` batch requests, ``gap_s`` apart, each of the longest
    prompt of its class (the worst unloaded case) and the middle output length. Under
    ``opts.chat_ttft_x`` the chats' TTFT target comes from this pass, so their SLO here is their
    TPOT alone."""
    chat, batch = opts.slos()
    if opts.chat_ttft_x:
        chat = replace(chat, ttft_ms=None)
    specs = []
    for n in range(opts.lone):
        specs.append(_spec(n, chat, 1.0 + n * gap_s, CHAT_PROMPT[1], sum(CHAT_OUTPUT) // 2))
    for n in range(opts.lone):
        t = 1.0 + (opts.lone + n) * gap_s
        specs.append(_spec(n, batch, t, BATCH_PROMPT[1], sum(BATCH_OUTPUT) // 2))
    return _workload("engines-lone", specs, opts, gap_s=gap_s)


#: Prompt and output tokens of every request of the batched pass.
BATCHED_PROMPT, BATCHED_OUTPUT = 64, 32


def batched_sizes(opts: SuiteOptions) -> tuple[int, ...]:
    """Group sizes of the batched pass: 2, 4, 8, ... up to ``opts.batched_max``."""
    sizes, k = [], 2
    while k <= opts.batched_max:
        sizes.append(k)
        k *= 2
    return tuple(sizes)


def batched_workload(opts: SuiteOptions, gap_s: float) -> Workload:
    """Per size ``k`` of :func:`batched_sizes`: ``k`` chat requests arriving at once
    (``BATCHED_PROMPT`` prompt, ``BATCHED_OUTPUT`` output tokens, ids ``chat-b{k}-{j}``), the
    groups ``gap_s`` apart, so that each group decodes ``k`` sequences per step."""
    chat = opts.slos()[0]
    specs = []
    for g, k in enumerate(batched_sizes(opts)):
        for j in range(k):
            spec = _spec(0, chat, 1.0 + g * gap_s, BATCHED_PROMPT, BATCHED_OUTPUT)
            specs.append(replace(spec, request_id=f"chat-b{k}-{j}"))
    return _workload("engines-batched", specs, opts, gap_s=gap_s, sizes=batched_sizes(opts))


def batched_concurrency(request_ids: pd.Series) -> pd.Series:
    """The group size ``k`` of each :func:`batched_workload` id ``chat-b{k}-{j}``."""
    return request_ids.str.extract(r"^chat-b(\d+)-")[0].astype(int)
