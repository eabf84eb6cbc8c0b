"""Workloads: trace sources tagged with SLO classes, mixed on one clock, scaled in time."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superinfer.harness.errors import UserError
from superinfer.harness.workload.data import trace_path
from superinfer.harness.workload.limits import MAX_TOKENS, check_rate_scale
from superinfer.harness.workload.traces import TraceRow, load_azure_csv
from superinfer.policy_core.types import SLO
from superinfer.sim.request import RequestSpec

__all__ = [
    "BATCH_SLO",
    "CHAT_SLO",
    "TRACES",
    "Source",
    "Workload",
    "build_workload",
    "scale_lengths",
]

#: Interactive chat: first token within 1 s, then at least 10 tokens/s per request.
CHAT_SLO = SLO("chat", ttft_ms=1000.0, tpot_ms=100.0, priority=0)
#: Offline batch (code completion jobs here): done within 10 minutes of arrival.
BATCH_SLO = SLO("batch", deadline_s=600.0, priority=1)


@dataclass(frozen=True, slots=True)
class Source:
    """One trace file with the SLO its requests carry.

    Attributes:
        name: short name, used as the request id prefix and in the ``source`` column.
        file: trace file name (found by
            :func:`superinfer.harness.workload.data.trace_path`) or a path.
        slo: SLO class of its requests.
        max_output_tokens: the ``max_tokens`` its requests declare; a request's true output
            length, if larger, is used instead. Azure conv outputs are capped at 1000 tokens in
            the trace itself (shared/data/traces/README.md); code outputs reach 1,899, so its cap
            is the next power of two.
    """

    name: str
    file: str
    slo: SLO
    max_output_tokens: int


AZURE_CONV = Source("conv", "AzureLLMInferenceTrace_conv.csv", CHAT_SLO, 1000)
AZURE_CODE = Source("code", "AzureLLMInferenceTrace_code.csv", BATCH_SLO, 2048)

#: ``--trace`` names and the sources each mixes.
TRACES: dict[str, tuple[Source, ...]] = {
    "azure": (AZURE_CONV, AZURE_CODE),
    "azure-conv": (AZURE_CONV,),
    "azure-code": (AZURE_CODE,),
}


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests of every source on one clock, sorted by arrival.

    Attributes:
        name: what was asked for (a ``--trace`` name or a path).
        requests: the requests; ``arrival_s`` counts from the earliest arrival of any source.
        sources: the sources mixed.
        rate_scale: arrival-rate multiplier applied (2.0 = twice as many requests per second).
        duration_s: window kept, in scaled seconds from the first arrival (``None``: all).
        prompts: prompt text by request id, for requests whose source has text (real engines
            send it; the simulator needs only the token counts).
        details: how the workload was made (spec file, formats, arrival processes, seed), for
            the manifest and the report; empty for ``--trace`` workloads.
        start_s: trace seconds skipped before the window (from the earliest arrival of any
            source).
        length_scale: factor applied to prompt and output lengths (:func:`scale_lengths`).
        max_prompt_tokens: cap on prompt lengths after scaling (``None``: none).
        max_output_tokens: cap on output lengths after scaling (``None``: none).
    """

    name: str
    requests: tuple[RequestSpec, ...]
    sources: tuple[Source, ...]
    rate_scale: float
    duration_s: float | None
    prompts: Mapping[str, str] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)
    start_s: float = 0.0
    length_scale: float = 1.0
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None

    def absent_sources(self) -> list[Source]:
        """The sources with no request in the window whose SLO class no other source's
        requests fill (e.g. the Azure mix's ``code`` source, whose first request arrives 77 s
        in, under ``--duration-s 60``): their class gets no row in the run's tables, which the
        CLI says rather than leave it silent."""
        present = {r.source for r in self.requests}
        classes = {r.slo.name for r in self.requests}
        return [s for s in self.sources if s.name not in present and s.slo.name not in classes]


def _load(source: Source) -> list[TraceRow]:
    path = Path(source.file)
    if not path.is_file():
        path = trace_path(source.file)
    return load_azure_csv(path)


def build_workload(
    trace: str = "azure",
    *,
    rate_scale: float = 1.0,
    duration_s: float | None = None,
    start_s: float = 0.0,
) -> Workload:
    """Build the workload named ``trace``, or from an Azure-format CSV path (tagged ``chat``).

    Sources are mixed on their shared wall clock: each keeps its real offset from the earliest
    request of any source. Requests in the first ``start_s`` trace seconds are skipped; then times
    count from ``start_s``, are divided by ``rate_scale`` and cut to ``duration_s``.

    Raises:
        UserError: unknown trace name, non-positive scale or duration, negative start, or an
            empty window.
        TraceFormatError: a malformed trace file.
    """
    check_rate_scale(rate_scale)
    if duration_s is not None and not duration_s > 0:
        raise UserError(f"--duration-s must be > 0, got {duration_s}")
    if not start_s >= 0:
        raise UserError(f"--start-s must be >= 0, got {start_s}")
    if trace in TRACES:
        sources = TRACES[trace]
    elif trace.endswith(".csv") and Path(trace).is_file():
        sources = (Source(Path(trace).stem, trace, CHAT_SLO, 1000),)
    else:
        known = ", ".join(TRACES)
        raise UserError(f"unknown trace {trace!r}; use one of {known} or a path to an Azure CSV")
    loaded = [(src, _load(src)) for src in sources]
    t0 = min(rows[0].arrival_s for _, rows in loaded)
    specs: list[tuple[float, str, int, RequestSpec]] = []
    for src, rows in loaded:
        for row in rows:
            if row.arrival_s - t0 < start_s:
                continue
            arrival = (row.arrival_s - t0 - start_s) / rate_scale
            if duration_s is not None and arrival >= duration_s:
                break  # rows are in time order
            spec = RequestSpec(
                request_id=f"{src.name}-{row.line}",
                arrival_s=arrival,
                prompt_tokens=row.prompt_tokens,
                output_tokens=row.output_tokens,
                max_output_tokens=max(src.max_output_tokens, row.output_tokens),
                slo=src.slo,
                source=src.name,
            )
            specs.append((arrival, src.name, row.line, spec))
    if not specs:
        raise UserError(f"trace {trace!r}: no requests in the first {duration_s} s")
    specs.sort(key=lambda item: item[:3])
    return Workload(
        trace, tuple(s for *_, s in specs), sources, rate_scale, duration_s, start_s=start_s
    )


def _scaled(tokens: int, scale: float, cap: int | None) -> int:
    out = max(1, round(tokens * scale))
    out = out if cap is None else min(out, cap)
    if out > MAX_TOKENS:
        raise UserError(
            f"--length-scale {scale:g} makes a {tokens}-token length {out:,} tokens, over the "
            f"limit of {MAX_TOKENS:,}"
        )
    return out


def scale_lengths(
    workload: Workload,
    *,
    length_scale: float = 1.0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
) -> Workload:
    """Shrink request lengths to what a small engine can serve, keeping their distribution's shape.

    Each prompt and output length ``L`` becomes ``min(cap, max(1, round(L * length_scale)))``;
    a request's declared cap (``max_output_tokens``) becomes ``ceil(cap * length_scale)``, or the
    new output length if larger (the output cap does not apply to it: it is a declaration).

    Raises:
        UserError: a non-finite or non-positive scale, a cap outside ``[1, MAX_TOKENS]``, or a
            scaled length over ``MAX_TOKENS`` (``workload.limits``).
    """
    if not (math.isfinite(length_scale) and length_scale > 0):
        raise UserError(f"--length-scale must be > 0 and finite, got {length_scale}")
    for flag, cap in (
        ("--max-prompt-tokens", max_prompt_tokens),
        ("--max-output-tokens", max_output_tokens),
    ):
        if cap is not None and cap < 1:
            raise UserError(f"{flag} must be >= 1, got {cap}")
        if cap is not None and cap > MAX_TOKENS:
            raise UserError(f"{flag} {cap} is over the limit of {MAX_TOKENS:,}")
    requests = []
    for spec in workload.requests:
        output = _scaled(spec.output_tokens, length_scale, max_output_tokens)
        requests.append(
            dataclasses.replace(
                spec,
                prompt_tokens=_scaled(spec.prompt_tokens, length_scale, max_prompt_tokens),
                output_tokens=output,
                max_output_tokens=max(math.ceil(spec.max_output_tokens * length_scale), output),
            )
        )
    return dataclasses.replace(
        workload,
        requests=tuple(requests),
        length_scale=length_scale,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
    )
