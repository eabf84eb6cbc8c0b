"""Building a workload from a parsed spec: each source's rows or synthetic lengths, its arrivals
and its SLO."""

from __future__ import annotations

import math
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from superinfer.harness.errors import DataError, SpecError, UserError
from superinfer.harness.workload.arrivals import gamma_arrivals, spread_buckets
from superinfer.harness.workload.data import trace_path
from superinfer.harness.workload.limits import MAX_REQUESTS, check_rate_scale
from superinfer.harness.workload.specs import SourceSpec, WorkloadSpec
from superinfer.harness.workload.traces import (
    MOONCAKE_BLOCK_TOKENS,
    LengthRow,
    TraceRow,
    load_azure_csv,
    load_mooncake_jsonl,
    load_sharegpt_lengths_csv,
    load_sharegpt_prompts_json,
    load_table,
)
from superinfer.harness.workload.workload import Source, Workload
from superinfer.sim.request import RequestSpec

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - Python 3.10
    pass

__all__ = ["build_from_spec", "resolve_source_file"]


# -- building -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Row:
    arrival_s: float | None
    prompt_tokens: int
    output_tokens: int
    line: int
    block_hashes: tuple[int, ...]
    prompt: str | None


def resolve_source_file(spec: WorkloadSpec, index: int, src: SourceSpec) -> Path:
    """The data file of ``spec``'s source number ``index``.

    Raises:
        SpecError: naming the spec's line, when the file cannot be found.
    """
    raw = Path(src.file).expanduser()
    candidates = (
        [raw] if raw.is_absolute() else [*([spec.folder / raw] if spec.folder else []), raw]
    )
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    key = f"source[{index}].file"
    line = spec.line_of(key)
    if len(raw.parts) > 1:
        raise SpecError(spec.path, line, key, f"{src.file}: no such file")
    try:
        return trace_path(src.file)
    except DataError as exc:
        raise SpecError(spec.path, line, key, str(exc)) from None


def _load_rows(path: Path, src: SourceSpec) -> tuple[list[_Row], int]:
    """The source's rows and its hashed block size (0: none)."""
    block = 0
    rows: list[TraceRow] | list[LengthRow]
    if src.format == "azure":
        rows = load_azure_csv(path)
    elif src.format == "mooncake":
        rows, block = load_mooncake_jsonl(path), MOONCAKE_BLOCK_TOKENS
    elif src.format == "sharegpt-lengths":
        rows = load_sharegpt_lengths_csv(path)
    elif src.format == "sharegpt-prompts":
        rows = load_sharegpt_prompts_json(path)
    else:
        assert src.columns is not None
        rows = load_table(path, src.columns, fmt=src.format)
        block = src.columns.hash_block_tokens
    out: list[_Row] = []
    for row in rows:
        arrival = row.arrival_s if isinstance(row, TraceRow) else None
        output = row.output_tokens if row.output_tokens is not None else src.output_tokens
        assert output is not None  # parse_spec requires output_tokens for prompt sets
        out.append(_Row(arrival, row.prompt_tokens, output, row.line, row.block_hashes, row.prompt))
    return out, block


def _rng(seed: int, name: str, stream: int) -> np.random.Generator:
    """Generator for one source and purpose: independent of every other source's."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode()), stream]))


def _synthetic(
    src: SourceSpec, rows: list[_Row], scale: float, until_s: float | None, seed: int
) -> list[tuple[float, str, int, _Row]]:
    arr = src.arrivals
    assert arr.rate_rps is not None
    rate = arr.rate_rps * scale
    expected = math.inf if until_s is None else rate * until_s
    if src.num_requests is not None:
        expected = min(expected, src.num_requests)
    if not expected <= MAX_REQUESTS:
        raise UserError(
            f"source {src.name!r}: {arr.process} arrivals at {rate:g} req/s over {until_s:g} s "
            f"are about {expected:.3g} requests, over the limit of {MAX_REQUESTS:,} per source; "
            "lower rate_rps, --rate-scale or the window, or set num_requests"
        )
    times = gamma_arrivals(
        _rng(seed, src.name, 0),
        arr.rate_rps * scale,
        burstiness=arr.burstiness,
        num_requests=src.num_requests,
        until_s=until_s,
    )
    picker = _rng(seed, src.name, 1)
    order: list[int] = []
    while len(order) < len(times):
        order.extend(picker.permutation(len(rows)) if src.order == "shuffle" else range(len(rows)))
    return [(float(t), src.name, i, rows[order[i]]) for i, t in enumerate(times)]


def build_from_spec(
    spec: WorkloadSpec,
    *,
    seed: int = 0,
    rate_scale: float = 1.0,
    duration_s: float | None = None,
) -> Workload:
    """Build the requests of ``spec``.

    Trace sources replay their rows at ``(t - t0) / scale`` where ``t0`` is the earliest
    arrival of any trace source (``clock = "shared"``) or of the source itself, and ``scale`` is
    the workload's rate scale times the source's. Synthetic sources draw their own arrivals from
    0. All sources are merged on one clock (superposition), the window
    ``[start_s, start_s + duration_s)`` is kept and shifted to 0, and requests are sorted by
    ``(arrival, source, line or index)``.

    Args:
        spec: the spec.
        seed: seed of every random draw (synthetic arrivals, row sampling, bucket spreading).
        rate_scale: extra multiplier on top of the spec's (``--rate-scale``).
        duration_s: window length replacing the spec's (``--duration-s``).

    Raises:
        UserError: a non-positive scale or duration, a synthetic source without a bound, or an
            empty window.
        SpecError: a source's file cannot be found.
        TraceFormatError: a malformed trace file.
    """
    check_rate_scale(rate_scale)
    if duration_s is not None and not duration_s > 0:
        raise UserError(f"--duration-s must be > 0, got {duration_s}")
    window = duration_s if duration_s is not None else spec.duration_s
    start = spec.start_s
    until = start + window if window is not None else None
    loaded: list[tuple[SourceSpec, list[_Row], int]] = []
    for index, src in enumerate(spec.sources):
        rows, block = _load_rows(resolve_source_file(spec, index, src), src)
        if src.arrivals.process == "trace" and src.arrivals.spread == "uniform":
            spread = spread_buckets(np.array([r.arrival_s for r in rows]), _rng(seed, src.name, 2))
            rows = [
                _Row(float(t), r.prompt_tokens, r.output_tokens, r.line, r.block_hashes, r.prompt)
                for t, r in zip(spread, rows, strict=True)
            ]
        loaded.append((src, rows, block))
    trace_starts = [rows[0].arrival_s for src, rows, _ in loaded if src.arrivals.process == "trace"]
    shared_t0 = min((t for t in trace_starts if t is not None), default=0.0)
    specs: list[tuple[float, str, int, RequestSpec]] = []
    prompts: dict[str, str] = {}
    caps: dict[str, int] = {}
    for src, rows, block in loaded:
        scale = spec.rate_scale * rate_scale * src.rate_scale
        if src.arrivals.process == "trace":
            t0 = shared_t0 if spec.clock == "shared" else (rows[0].arrival_s or 0.0)
            timed = [((r.arrival_s or 0.0) - t0) / scale for r in rows]
            picked = [(t, src.name, r.line, r) for t, r in zip(timed, rows, strict=True)]
            if src.num_requests is not None:
                picked = picked[: src.num_requests]
        else:
            if src.num_requests is None and until is None:
                raise UserError(
                    f"{spec.path}: source {src.name!r} has {src.arrivals.process} arrivals but "
                    "neither num_requests nor a window (duration_s) bounds them"
                )
            picked = _synthetic(src, rows, scale, until, seed)
        cap = src.max_output_tokens or max(r.output_tokens for r in rows)
        caps[src.name] = cap
        for t, name, key, row in picked:
            if t < start or (until is not None and t >= until):
                continue
            request_id = f"{name}-{key}"
            specs.append(
                (
                    t - start,
                    name,
                    key,
                    RequestSpec(
                        request_id=request_id,
                        arrival_s=t - start,
                        prompt_tokens=row.prompt_tokens,
                        output_tokens=row.output_tokens,
                        max_output_tokens=max(cap, row.output_tokens),
                        slo=src.slo,
                        source=name,
                        block_hashes=row.block_hashes,
                        hash_block_tokens=block if row.block_hashes else 0,
                    ),
                )
            )
            if row.prompt is not None:
                prompts[request_id] = row.prompt
    if not specs:
        raise UserError(f"workload {spec.name!r}: no requests in the window")
    specs.sort(key=lambda item: item[:3])
    sources = tuple(Source(s.name, s.file, s.slo, caps[s.name]) for s in spec.sources)
    return Workload(
        spec.name,
        tuple(s for *_, s in specs),
        sources,
        spec.rate_scale * rate_scale,
        window,
        prompts=prompts,
        details=_describe(spec, seed),
    )


def _describe(spec: WorkloadSpec, seed: int) -> dict[str, Any]:
    """The spec as plain data, for the manifest and the report."""
    return {
        "spec": spec.path,
        "description": spec.description,
        "seed": seed,
        "start_s": spec.start_s,
        "clock": spec.clock,
        "sources": [
            {
                "name": s.name,
                "format": s.format,
                "file": s.file,
                "slo": s.slo.name,
                "arrivals": s.arrivals.process,
                "rate_rps": s.arrivals.rate_rps,
                "burstiness": s.arrivals.burstiness,
                "spread": s.arrivals.spread,
                "rate_scale": s.rate_scale,
                "num_requests": s.num_requests,
            }
            for s in spec.sources
        ],
    }
