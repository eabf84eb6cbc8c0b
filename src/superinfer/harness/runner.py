"""Runs a workload on an engine under each policy and collects per-request records."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd

from superinfer.adapters.manager import (
    available_policies,
    build_plugin_manager,
    make_policy,
    policy_options,
)
from superinfer.harness.errors import UserError
from superinfer.harness.metrics import REQUEST_COLUMNS, add_latency_columns, summarize
from superinfer.harness.workload import Workload, build_workload
from superinfer.sim.engine import SimConfig, SimResult, Simulator
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.profiles import get_profile

__all__ = [
    "RUNNERS",
    "TIMELINE_COLUMNS",
    "BenchConfig",
    "BenchResult",
    "CellResult",
    "build_policy",
    "resolve_policy_opts",
    "run_bench",
    "run_sim_cell",
    "sim_requests_frame",
]


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark: a workload on engines, under several policies.

    Attributes:
        trace: ``--trace`` name or path (see ``harness.workload.TRACES``).
        engines: engine ids (``sim:vllm``); each runs every policy.
        model: model name.
        gpu: GPU name.
        tp: tensor-parallel degree per replica.
        replicas: replicas behind the router.
        policies: policy names; empty means every registered policy.
        policy_options: per policy name, constructor options.
        policy_opts: ``--policy-opt`` strings, ``key=value`` (every selected policy that has
            the option) or ``policy.key=value`` (that policy); resolved by
            :func:`resolve_policy_opts` and applied over ``policy_options``.
        rate_scale: arrival-rate multiplier.
        duration_s: workload window in scaled seconds (``None``: the whole trace).
        seed: seed of every random choice (recorded; the trace replay itself draws none).
    """

    trace: str = "azure"
    engines: tuple[str, ...] = ("sim:vllm",)
    model: str = "llama-3.1-70b"
    gpu: str = "a100-80gb"
    tp: int = 4
    replicas: int = 4
    policies: tuple[str, ...] = ()
    policy_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    policy_opts: tuple[str, ...] = ()
    rate_scale: float = 1.0
    duration_s: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class CellResult:
    """One engine x policy run.

    Attributes:
        requests: its ``requests.parquet`` rows (columns :data:`REQUEST_COLUMNS`).
        kv_peak_bytes: peak KV bytes in HBM per SLO class and for ``"all"``.
        timeline: samples with :data:`TIMELINE_COLUMNS`.
        info: facts for the manifest (capacity, steps, wall time).
    """

    requests: pd.DataFrame
    kv_peak_bytes: dict[str, float]
    timeline: pd.DataFrame
    info: dict[str, Any]


@dataclass(frozen=True)
class BenchResult:
    """What :func:`run_bench` produced.

    Attributes:
        summary: ``summary.csv`` rows.
        requests: ``requests.parquet`` rows.
        timeline: ``timeline.parquet`` rows (KV use and queue lengths over time).
        info: facts for the manifest and report.
    """

    summary: pd.DataFrame
    requests: pd.DataFrame
    timeline: pd.DataFrame
    info: dict[str, Any]


#: Columns of ``timeline.parquet``: per replica, sampled at step ends about once a second.
TIMELINE_COLUMNS = (
    "engine",
    "policy",
    "replica",
    "time_s",
    "kv_hbm_gb",
    "num_waiting",
    "num_running",
)


def sim_requests_frame(result: SimResult, *, engine: str, policy: str) -> pd.DataFrame:
    """The requests table of one simulation (columns :data:`REQUEST_COLUMNS`)."""
    rows = []
    for req in result.requests:
        s = req.spec
        rows.append(
            (
                engine,
                policy,
                s.request_id,
                s.source,
                s.slo.name,
                s.arrival_s,
                s.prompt_tokens,
                s.output_tokens,
                req.generated_tokens,
                req.first_token_s,
                req.finish_s,
                req.status.value,
                req.reason,
                req.num_preemptions,
                req.replica,
                req.max_itl_s * 1e3,
                s.slo.ttft_ms,
                s.slo.tpot_ms,
                s.slo.deadline_s,
            )
        )
    cols = [c for c in REQUEST_COLUMNS if c not in ("ttft_ms", "tpot_ms", "e2e_ms", "met_slo")]
    df = pd.DataFrame(rows, columns=cols)
    for col in ("first_token_s", "finish_s", "slo_ttft_ms", "slo_tpot_ms", "slo_deadline_s"):
        df[col] = df[col].astype(float)
    return add_latency_columns(df)[list(REQUEST_COLUMNS)]


def run_sim_cell(config: BenchConfig, engine: str, policy: str, workload: Workload) -> CellResult:
    """Simulate ``workload`` on ``engine`` (a ``sim:*`` id) under ``policy``.

    Raises:
        UserError: unknown engine, model or GPU, or a bad TP degree or replica count.
    """
    try:
        profile = get_profile(engine)
        model, gpu = get_model(config.model), get_gpu(config.gpu)
    except KeyError as exc:
        raise UserError(exc.args[0]) from None
    if config.replicas < 1:
        raise UserError(f"--replicas must be >= 1, got {config.replicas}")
    if config.tp < 1 or model.num_kv_heads % config.tp:
        raise UserError(f"--tp must divide {model.name}'s {model.num_kv_heads} KV heads")
    sim_config = SimConfig(profile, model, gpu, tp=config.tp, replicas=config.replicas)
    options = dict(config.policy_options.get(policy, {}))
    built = build_policy(policy, options, workload)
    pm = build_plugin_manager(built, None if built is not policy else options)
    t0 = time.perf_counter()
    result = Simulator(sim_config, pm.hook).run(workload.requests)
    wall = time.perf_counter() - t0
    policy_stats: dict[str, int] = {}
    for plugin in pm.get_plugins():
        stats = getattr(getattr(plugin, "policy", plugin), "stats", None)
        if callable(stats):
            policy_stats = dict(stats())
    df = sim_requests_frame(result, engine=engine, policy=policy)
    peaks: dict[str, float] = {"all": max(result.peak_kv_blocks) * result.kv_block_bytes}
    for per_replica in result.peak_class_kv_blocks:
        for cls, blocks in per_replica.items():
            peaks[cls] = max(peaks.get(cls, 0.0), blocks * result.kv_block_bytes)
    timeline = pd.DataFrame(
        [
            (engine, policy, rep, t, used * result.kv_block_bytes / 1e9, waiting, running)
            for rep, t, used, waiting, running in result.timeline
        ],
        columns=list(TIMELINE_COLUMNS),
    )
    info: dict[str, Any] = {
        "wall_s": round(wall, 3),
        "num_steps": result.num_steps,
        "num_schedule_calls": result.num_schedule_calls,
        "simulated_s": result.end_s,
        "kv_capacity_blocks": result.kv_capacity_blocks,
        "kv_capacity_gb": result.kv_capacity_blocks * result.kv_block_bytes / 1e9,
    }
    if policy_stats:
        info["policy_stats"] = policy_stats
    return CellResult(df, peaks, timeline, info)


#: Runner per engine family (the part of the engine id before ``:``).
RUNNERS: dict[str, Callable[[BenchConfig, str, str, Workload], CellResult]] = {
    "sim": run_sim_cell,
}


def build_policy(name: str, options: Mapping[str, str], workload: Workload) -> str | object:
    """What to hand :func:`build_plugin_manager` for policy ``name``: the name itself, or, for a
    policy that declares ``needs_output_lengths`` (the clairvoyant ``oracle``), an instance built
    with ``output_tokens`` = every request's true output length from ``workload``.

    Raises:
        UnknownPolicyError: a bad option.
    """
    entry = available_policies().get(name)
    cls = entry.load() if entry is not None else None
    if isinstance(cls, type) and getattr(cls, "needs_output_lengths", False):
        lengths = {s.request_id: s.output_tokens for s in workload.requests}
        built: object = make_policy(cls, options, name, extra={"output_tokens": lengths})
        return built
    return name


def resolve_policy_opts(policies: Sequence[str], opts: Sequence[str]) -> dict[str, dict[str, str]]:
    """Per-policy options from ``--policy-opt`` strings.

    ``key=value`` sets the option on every policy in ``policies`` that has it; ``policy.key=value``
    sets it on that policy only. Later strings win.

    Raises:
        UserError: a string without ``=``, a policy that is not selected, or an option that no
            selected policy (or not the named one) has; the message lists the options.
    """
    known = {name: policy_options(_policy_class(name)) for name in policies}
    out: dict[str, dict[str, str]] = {name: {} for name in policies}
    for opt in opts:
        key, sep, value = opt.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--policy-opt {opt!r}: expected key=value or policy.key=value")
        target, dot, option = key.rpartition(".")
        if dot:
            if target not in known:
                raise UserError(
                    f"--policy-opt {opt!r}: policy {target!r} is not among the selected "
                    f"({', '.join(policies)})"
                )
            if option not in known[target]:
                names = ", ".join(sorted(known[target])) or "none"
                raise UserError(
                    f"--policy-opt {opt!r}: policy {target!r} has no option {option!r} "
                    f"(options: {names})"
                )
            out[target][option] = value
            continue
        having = [name for name in policies if option in known[name]]
        if not having:
            raise UserError(
                f"--policy-opt {opt!r}: no selected policy has option {option!r} "
                "(see `superinfer policies --options`)"
            )
        for name in having:
            out[name][option] = value
    return out


def _policy_class(name: str) -> type:
    loaded = available_policies()[name].load()
    return loaded if isinstance(loaded, type) else type(loaded)


def _resolve_policies(names: Sequence[str]) -> list[str]:
    registered = available_policies()
    if not names:
        return sorted(registered)
    unknown = [n for n in names if n not in registered]
    if unknown:
        known = ", ".join(sorted(registered))
        raise UserError(f"unknown policy {unknown[0]!r}; registered: {known}")
    return list(names)


def run_bench(
    config: BenchConfig,
    *,
    progress: Callable[[str], None] | None = None,
    workload: Workload | None = None,
) -> BenchResult:
    """Run ``config``: the workload once per engine x policy.

    Raises:
        UserError: unknown engine, model, GPU or policy, or a bad option.
    """
    for engine in config.engines:
        if engine.split(":")[0] not in RUNNERS:
            raise UserError(f"unknown engine {engine!r}; engine families: {', '.join(RUNNERS)}")
    policies = _resolve_policies(config.policies)
    if config.policy_opts:
        resolved = resolve_policy_opts(policies, config.policy_opts)
        merged = {
            name: {**config.policy_options.get(name, {}), **resolved[name]} for name in policies
        }
        config = replace(config, policy_options=merged)
    wl = workload or build_workload(
        config.trace, rate_scale=config.rate_scale, duration_s=config.duration_s
    )
    summaries: list[dict[str, object]] = []
    frames, timelines = [], []
    cells: dict[str, dict[str, Any]] = {}
    for engine in config.engines:
        runner = RUNNERS[engine.split(":")[0]]
        for name in policies:
            if progress:
                progress(f"{engine} x {name}: {len(wl.requests)} requests")
            cell = runner(config, engine, name, wl)
            summaries.extend(
                summarize(
                    cell.requests, engine=engine, policy=name, kv_peak_bytes=cell.kv_peak_bytes
                )
            )
            frames.append(cell.requests)
            timelines.append(cell.timeline)
            cells[f"{engine}/{name}"] = cell.info
    info: dict[str, Any] = {
        "config": {**asdict(config), "policies": policies},
        "workload": {
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
            "n_requests": len(wl.requests),
        },
        "cells": cells,
    }
    return BenchResult(
        pd.DataFrame(summaries),
        pd.concat(frames, ignore_index=True),
        pd.concat(timelines, ignore_index=True),
        info,
    )
