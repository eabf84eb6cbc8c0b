"""One benchmark run: a workload on engines under each policy (``superinfer bench``).

The workload is built once (:func:`build_bench_workload`), every engine x policy cell runs on
its family's runner (``engines.registry``), and the cells' tables are gathered into one
:class:`BenchResult`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd

from superinfer.harness.engines.base import TIMELINE_COLUMNS, BenchConfig, CellResult
from superinfer.harness.engines.registry import engine_family
from superinfer.harness.errors import UserError
from superinfer.harness.policies import resolve_policy_opts, select_policies
from superinfer.harness.report.metrics import summarize
from superinfer.harness.workload.resolve import resolve_workload
from superinfer.harness.workload.workload import Workload, scale_lengths

__all__ = [
    "TIMELINE_COLUMNS",
    "BenchConfig",
    "BenchResult",
    "CellResult",
    "build_bench_workload",
    "run_bench",
]


@dataclass(frozen=True)
class BenchResult:
    """What :func:`run_bench` produced.

    Attributes:
        summary: ``summary.csv`` rows.
        requests: ``requests.parquet`` rows.
        timeline: ``timeline.parquet`` rows (KV use and queue lengths over time).
        info: facts for the manifest and report.
        steps: ``steps.parquet`` rows of the real engines' steps (empty for simulations).
    """

    summary: pd.DataFrame
    requests: pd.DataFrame
    timeline: pd.DataFrame
    info: dict[str, Any]
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)


def build_bench_workload(config: BenchConfig) -> Workload:
    """The workload ``config`` names: its spec (``workload``) or its trace (``trace``), then its
    length shaping (``length_scale``, ``max_prompt_tokens``, ``max_output_tokens``).

    Raises:
        UserError: unknown name, bad scale or window, an invalid spec, or ``start_s`` with a
            spec (a spec sets its own window).
        TraceFormatError: a malformed trace file.
    """
    wl = resolve_workload(
        config.workload if config.workload is not None else config.trace,
        spec=config.workload is not None,
        seed=config.seed,
        rate_scale=config.rate_scale,
        duration_s=config.duration_s,
        start_s=config.start_s,
    )
    if (
        config.length_scale != 1.0
        or config.max_prompt_tokens is not None
        or config.max_output_tokens is not None
    ):
        wl = scale_lengths(
            wl,
            length_scale=config.length_scale,
            max_prompt_tokens=config.max_prompt_tokens,
            max_output_tokens=config.max_output_tokens,
        )
    return wl


def run_bench(
    config: BenchConfig,
    *,
    progress: Callable[[str], None] | None = None,
    workload: Workload | None = None,
    on_cell: Callable[[int, int, str], None] | None = None,
) -> BenchResult:
    """Run ``config``: the workload once per engine x policy.

    Args:
        config: what to run.
        progress: called with a message before each engine x policy cell.
        workload: the workload, if already built (else :func:`build_bench_workload`).
        on_cell: called as ``on_cell(done, total, label)`` before each cell (``done`` cells
            finished so far) and once more after the last, for progress bars.

    Raises:
        UserError: unknown engine, model, GPU or policy, or a bad option.
    """
    families = [engine_family(e) for e in config.engines]
    label_only = [f.label_only for f in families]
    if all(label_only):
        if len(config.policies) > 1:
            raise UserError(
                "engine http measures the server's own policy: give at most one --policies "
                "label (it names the rows)"
            )
        policies = list(config.policies) or ["server"]
    else:
        policies = select_policies(config.policies)
        if config.policy_opts:
            resolved = resolve_policy_opts(policies, config.policy_opts)
            merged = {
                name: {**config.policy_options.get(name, {}), **resolved[name]} for name in policies
            }
            config = replace(config, policy_options=merged)
        if any(label_only) and len(policies) > 1:
            raise UserError(
                "engine http measures the server's own policy once: with http among the "
                "engines give one --policies name"
            )
    wl = workload or build_bench_workload(config)
    total = len(config.engines) * len(policies)
    summaries: list[dict[str, object]] = []
    frames, timelines, step_frames = [], [], []
    cells: dict[str, dict[str, Any]] = {}
    for engine, family in zip(config.engines, families, strict=True):
        runner = family.load_runner()
        for name in policies:
            if progress:
                progress(f"{engine} x {name}: {len(wl.requests)} requests")
            if on_cell:
                on_cell(len(cells), total, f"{engine} × {name}")
            cell = runner(config, engine, name, wl)
            summaries.extend(
                summarize(
                    cell.requests, engine=engine, policy=name, kv_peak_bytes=cell.kv_peak_bytes
                )
            )
            frames.append(cell.requests)
            timelines.append(cell.timeline)
            if cell.steps is not None:
                step_frames.append(cell.steps)
            cells[f"{engine}/{name}"] = cell.info
    if on_cell:
        on_cell(len(cells), total, "done")
    info: dict[str, Any] = {
        "config": {**asdict(config), "policies": policies},
        "workload": {
            "name": wl.name,
            "trace": wl.name,
            "sources": [
                {
                    "name": s.name,
                    "file": s.file,
                    "slo": asdict(s.slo),
                    "max_output_tokens": s.max_output_tokens,
                }
                for s in wl.sources
            ],
            "rate_scale": wl.rate_scale,
            "duration_s": wl.duration_s,
            "start_s": wl.start_s,
            "length_scale": wl.length_scale,
            "max_prompt_tokens": wl.max_prompt_tokens,
            "max_output_tokens": wl.max_output_tokens,
            "n_requests": len(wl.requests),
            "details": dict(wl.details),
        },
        "cells": cells,
    }
    return BenchResult(
        pd.DataFrame(summaries),
        pd.concat(frames, ignore_index=True),
        pd.concat(timelines, ignore_index=True),
        info,
        pd.concat(step_frames, ignore_index=True) if step_frames else pd.DataFrame(),
    )
