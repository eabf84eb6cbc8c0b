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
from superinfer.harness.report.metrics import REQUEST_COLUMNS, add_latency_columns, summarize
from superinfer.harness.workload.specs import build_from_spec, load_spec
from superinfer.harness.workload.workload import Workload, build_workload, scale_lengths
from superinfer.sim.engine import SimConfig, SimResult, Simulator
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.profiles import get_profile

__all__ = [
    "LABEL_ONLY_FAMILIES",
    "RUNNERS",
    "TIMELINE_COLUMNS",
    "BenchConfig",
    "BenchResult",
    "CellResult",
    "build_bench_workload",
    "build_policy",
    "resolve_policy_opts",
    "run_bench",
    "run_http_cell",
    "run_sim_cell",
    "sim_requests_frame",
]


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark: a workload on engines, under several policies.

    Attributes:
        trace: ``--trace`` name or path (see ``harness.workload.TRACES``); ignored when
            ``workload`` is set.
        engines: engine ids (``sim:vllm``); each runs every policy.
        model: model name.
        gpu: GPU name.
        tp: tensor-parallel degree per replica.
        replicas: replicas behind the router.
        router: how arrivals are spread over replicas (``sim.engine.ROUTERS``).
        cpu_kv_ratio: CPU-tier KV capacity per replica as a multiple of its HBM KV capacity;
            ``None`` takes each engine profile's own, 0 disables the tier.
        policies: policy names; empty means every registered policy.
        policy_options: per policy name, constructor options.
        policy_opts: ``--policy-opt`` strings, ``key=value`` (every selected policy that has
            the option) or ``policy.key=value`` (that policy); resolved by
            :func:`resolve_policy_opts` and applied over ``policy_options``.
        rate_scale: arrival-rate multiplier.
        duration_s: workload window in scaled seconds (``None``: the whole trace).
        seed: seed of every random choice (synthetic arrivals, sampling, timestamp spreading
            of spec workloads; a plain trace replay draws none).
        workload: workload spec, a built-in name or a TOML path (``harness.specs``); ``None``
            uses ``trace``.
        kv_quant: store each request's KV at the precision the quantization planner chooses
            (``policy_core.quant_planner``), instead of FP16 for all.
        kv_policy: prefix-cache placement policy (``superinfer.kv_policies``: ``lru``, ``lfu``,
            ``reuse``); ``None``: the engine's own eviction order.
        horizon_s: stop simulating at this instant; requests still live then fail with reason
            ``"simulation_horizon"`` (``None``: run until every request ends).
        start_s: trace seconds skipped before the window.
        length_scale: factor on prompt and output lengths (``workload.scale_lengths``).
        max_prompt_tokens: cap on prompt lengths after scaling.
        max_output_tokens: cap on output lengths after scaling.
        engine_options: ``key -> value`` settings of the engines (``--engine-option``); the
            ``hf`` and ``sim:hf-cpu`` keys are ``harness.hf_runner.HFOptions``, the ``http``
            keys ``harness.http_runner.HTTPOptions``.
        url: base URL of the server the ``http`` engine benchmarks (``--url``).
        backend: how the ``http`` engine sends SLO, priority and length fields: ``sglang``,
            ``vllm``, ``trtllm`` or ``openai`` (``--backend``).
    """

    trace: str = "azure"
    engines: tuple[str, ...] = ("sim:vllm",)
    model: str = "llama-3.1-70b"
    gpu: str = "a100-80gb"
    tp: int = 4
    replicas: int = 4
    router: str = "round_robin"
    cpu_kv_ratio: float | None = None
    policies: tuple[str, ...] = ()
    policy_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    policy_opts: tuple[str, ...] = ()
    rate_scale: float = 1.0
    duration_s: float | None = None
    seed: int = 0
    workload: str | None = None
    kv_quant: bool = False
    kv_quant_options: Mapping[str, str] = field(default_factory=dict)
    kv_policy: str | None = None
    horizon_s: float | None = None
    start_s: float = 0.0
    length_scale: float = 1.0
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    engine_options: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    backend: str = "openai"


@dataclass(frozen=True)
class CellResult:
    """One engine x policy run.

    Attributes:
        requests: its ``requests.parquet`` rows (columns :data:`REQUEST_COLUMNS`).
        kv_peak_bytes: peak KV bytes in HBM per SLO class, for ``"all"`` (cached prefixes
            included) and ``"all_active"`` (cached prefixes nobody uses excluded).
        timeline: samples with :data:`TIMELINE_COLUMNS`.
        info: facts for the manifest (capacity, steps, wall time).
        steps: per-step profile of a real engine (``hf_runner.STEP_COLUMNS``), or ``None``.
    """

    requests: pd.DataFrame
    kv_peak_bytes: dict[str, float]
    timeline: pd.DataFrame
    info: dict[str, Any]
    steps: pd.DataFrame | None = None


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
    """The requests table of one simulation (columns :data:`REQUEST_COLUMNS`, then
    ``cached_tokens``)."""
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
    out = add_latency_columns(df)[list(REQUEST_COLUMNS)]
    # prompt tokens served from the prefix cache at the request's (last) admission
    out["cached_tokens"] = [req.cached_tokens for req in result.requests]
    return out


def run_sim_cell(
    config: BenchConfig,
    engine: str,
    policy: str,
    workload: Workload,
    *,
    plugins: Sequence[object] = (),
) -> CellResult:
    """Simulate ``workload`` on ``engine`` (a ``sim:*`` id) under ``policy``.

    Args:
        config: the run's settings (its ``engines`` and ``policies`` are not read).
        engine: a ``sim:*`` engine id.
        policy: a registered policy name.
        workload: the requests.
        plugins: extra pluggy plugins registered beside the policy (observers: step and
            request hooks); an exception one raises ends the simulation and propagates.

    Raises:
        UserError: unknown engine, model or GPU, or a bad TP degree or replica count.
    """
    if engine == "sim:hf-cpu":  # the real CPU engine's profile: its own model, host and step time
        from superinfer.harness.engines.hf import run_sim_hf_cpu_cell

        return run_sim_hf_cpu_cell(config, engine, policy, workload)
    try:
        profile = get_profile(engine)
        model, gpu = get_model(config.model), get_gpu(config.gpu)
    except KeyError as exc:
        raise UserError(exc.args[0]) from None
    if config.replicas < 1:
        raise UserError(f"--replicas must be >= 1, got {config.replicas}")
    if config.tp < 1 or model.num_kv_heads % config.tp:
        raise UserError(f"--tp must divide {model.name}'s {model.num_kv_heads} KV heads")
    from superinfer.sim.engine import ROUTERS

    if config.router not in ROUTERS:
        raise UserError(f"unknown router {config.router!r}; known: {', '.join(ROUTERS)}")
    sim_config = SimConfig(
        profile,
        model,
        gpu,
        tp=config.tp,
        replicas=config.replicas,
        router=config.router,
        cpu_kv_ratio=config.cpu_kv_ratio,
        horizon_s=config.horizon_s,
    )
    options = dict(config.policy_options.get(policy, {}))
    built = build_policy(policy, options, workload)
    pm = build_plugin_manager(
        built, None if built is not policy else options, kv_policy=config.kv_policy
    )
    if config.kv_quant:
        from superinfer.adapters.kv_precision import register_quant_planner

        register_quant_planner(pm, make_quant_planner(config.kv_quant_options))
    for plugin in plugins:
        pm.register(plugin)
    pm.check_pending()
    t0 = time.perf_counter()
    result = Simulator(sim_config, pm.hook).run(workload.requests)
    wall = time.perf_counter() - t0
    policy_stats: dict[str, int] = {}
    # list_name_plugin, not get_plugins: that builds a set, and dataclass plugins (the KV
    # placement policies) are unhashable
    for _, plugin in pm.list_name_plugin():
        stats = getattr(getattr(plugin, "policy", plugin), "stats", None)
        if callable(stats):  # the scheduling policy's counters (superinfer, oracle)
            policy_stats = dict(stats())
    df = sim_requests_frame(result, engine=engine, policy=policy)
    peaks: dict[str, float] = {
        "all": max(result.peak_kv_blocks) * result.kv_block_bytes,
        "all_active": max(result.peak_active_kv_blocks) * result.kv_block_bytes,
    }
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
        "counters": result.counters,
    }
    if policy_stats:
        info["policy_stats"] = policy_stats
    return CellResult(df, peaks, timeline, info)


def run_hf_cell(config: BenchConfig, engine: str, policy: str, workload: Workload) -> CellResult:
    """Replay ``workload`` on the real CPU engine (``hf``); see ``harness.hf_runner``."""
    from superinfer.harness.engines.hf import run_hf_cell as run

    return run(config, engine, policy, workload)


def run_http_cell(config: BenchConfig, engine: str, policy: str, workload: Workload) -> CellResult:
    """Replay ``workload`` against the OpenAI-compatible server at ``config.url`` (``http``);
    see ``harness.http_runner``."""
    from superinfer.harness.engines.http import run_http_cell as run

    return run(config, engine, policy, workload)


#: Runner per engine family (the part of the engine id before ``:``).
RUNNERS: dict[str, Callable[[BenchConfig, str, str, Workload], CellResult]] = {
    "sim": run_sim_cell,
    "hf": run_hf_cell,
    "http": run_http_cell,
}

#: Engine families whose policy runs on a server the harness does not control: ``--policies``
#: only labels their rows (one label; ``server`` when none is given).
LABEL_ONLY_FAMILIES = ("http",)


def make_quant_planner(options: Mapping[str, str]) -> Any:
    """The KV quantization planner with ``--kv-quant-opt`` options (``QuantPlanner`` fields:
    ``floors``, ``default_floor``, ``int8_pressure``, ``int4_pressure``, ``hysteresis``,
    ``count_waiting``), converted to each field's type.

    Raises:
        UserError: an unknown option, a value of the wrong type, or values the planner refuses.
    """
    from superinfer.adapters.manager import UnknownPolicyError
    from superinfer.policy_core.quant_planner import QuantPlanner

    try:
        return make_policy(QuantPlanner, dict(options), "quant")
    except (UnknownPolicyError, ValueError) as exc:
        raise UserError(f"--kv-quant-opt: {exc}") from None


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


def build_bench_workload(config: BenchConfig) -> Workload:
    """The workload ``config`` names: its spec (``workload``) or its trace (``trace``), then its
    length shaping (``length_scale``, ``max_prompt_tokens``, ``max_output_tokens``).

    Raises:
        UserError: unknown name, bad scale or window, an invalid spec, or ``start_s`` with a
            spec (a spec sets its own window).
        TraceFormatError: a malformed trace file.
    """
    if config.workload is not None:
        if config.start_s:
            raise UserError("--start-s applies to --trace workloads; a spec sets its own window")
        wl = build_from_spec(
            load_spec(config.workload),
            seed=config.seed,
            rate_scale=config.rate_scale,
            duration_s=config.duration_s,
        )
    else:
        wl = build_workload(
            config.trace,
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
    for engine in config.engines:
        if engine.split(":")[0] not in RUNNERS:
            raise UserError(f"unknown engine {engine!r}; engine families: {', '.join(RUNNERS)}")
    families = {e.split(":")[0] for e in config.engines}
    if families <= set(LABEL_ONLY_FAMILIES):
        if len(config.policies) > 1:
            raise UserError(
                "engine http measures the server's own policy: give at most one --policies "
                "label (it names the rows)"
            )
        policies = list(config.policies) or ["server"]
    else:
        policies = _resolve_policies(config.policies)
        if config.policy_opts:
            resolved = resolve_policy_opts(policies, config.policy_opts)
            merged = {
                name: {**config.policy_options.get(name, {}), **resolved[name]} for name in policies
            }
            config = replace(config, policy_options=merged)
        if families & set(LABEL_ONLY_FAMILIES) and len(policies) > 1:
            raise UserError(
                "engine http measures the server's own policy once: with http among the "
                "engines give one --policies name"
            )
    wl = workload or build_bench_workload(config)
    total = len(config.engines) * len(policies)
    summaries: list[dict[str, object]] = []
    frames, timelines, step_frames = [], [], []
    cells: dict[str, dict[str, Any]] = {}
    for engine in config.engines:
        runner = RUNNERS[engine.split(":")[0]]
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
