"""One benchmark run: a workload on engines under each policy (``superinfer bench``).

The workload is built once (:func:`build_bench_workload`), every engine x policy cell runs on
its family's runner (``engines.registry``), and the cells' tables are gathered into one
:class:`BenchResult`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.adapters.manager import available_policies
from superinfer.harness.engines.base import TIMELINE_COLUMNS, BenchConfig, CellResult
from superinfer.harness.engines.isolated import (
    engine_isolated_latency,
    engine_slos,
    feasibility_info,
    mark_feasible,
)
from superinfer.harness.engines.registry import (
    STACK_PARTS,
    EngineFamily,
    default_source,
    engine_family,
    parse_stack,
    run_dir,
    shaping_defaults,
    stack_parts,
)
from superinfer.harness.errors import SpecError, UserError
from superinfer.harness.policies import (
    ignored_field_warnings,
    merge_policy_opts,
    select_policies,
)
from superinfer.harness.report.metrics import summarize
from superinfer.harness.workload.limits import check_numbers, policy_names
from superinfer.harness.workload.resolve import resolve_workload
from superinfer.harness.workload.specs import WorkloadSpec, load_workload_spec
from superinfer.harness.workload.workload import Workload, scale_lengths
from superinfer.sim.hardware import get_gpu, get_model

__all__ = [
    "HEADLINE_POLICIES",
    "HEADLINE_RATE_SCALE",
    "ROTATION_DEFAULTS",
    "SUITES",
    "TIMELINE_COLUMNS",
    "BenchConfig",
    "BenchResult",
    "CellResult",
    "bench_config",
    "bench_out_dir",
    "build_bench_workload",
    "run_bench",
    "suite_defaults",
    "write_bench",
]

#: Fixed experiments ``bench --suite`` runs (``harness.suites``).
SUITES = ("headline", "rotation", "seed", "engines")
#: The seven headline policies (``bench --suite headline``).
HEADLINE_POLICIES = ("fcfs", "priority", "edf", "mlfq", "lpm", "superinfer", "oracle")
#: Load of the headline table: the Azure hour at 0.6x its rate, where every engine's native
#: policy misses chat SLOs noticeably (attainment in the 0.7-0.85 band issue 4 asks for:
#: 0.752 on sim:vllm, 0.766 on sim:sglang and sim:trtllm at git 364411e, before issue 19's
#: per-engine step costs; results/headline/report.md, to be rerun).
HEADLINE_RATE_SCALE = 0.6
#: ``bench --suite rotation`` defaults (each one a ``bench`` option the user may override).
#: Mooncake's long chat prompts on 6 of the spec's 11 H100 TP4 replicas: live KV exceeds HBM.
ROTATION_DEFAULTS: dict[str, object] = {
    "workload": "mooncake-chat",
    "replicas": 6,
    "duration_s": 600.0,
}


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
        policies = _family_policies(config, families)
        if config.policy_opts:
            merged = merge_policy_opts(config.policy_options, policies, config.policy_opts)
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
    feasibility: dict[str, dict[str, Any]] = {}
    stacks: dict[str, dict[str, Any]] = {}
    for engine, family in zip(config.engines, families, strict=True):
        runner = family.load_runner()
        latency = engine_isolated_latency(config, engine)
        ewl = engine_slos(wl, engine, latency)
        ecfg, stacks[engine] = engine_stack(config, family)
        for name in policies:
            if progress:
                progress(f"{engine} x {name}: {len(wl.requests)} requests")
            if on_cell:
                on_cell(len(cells), total, f"{engine} × {name}")
            cell = runner(ecfg, engine, name, ewl)
            cell = replace(cell, requests=mark_feasible(cell.requests, ewl.requests, latency))
            feasibility[engine] = feasibility_info(cell.requests, latency)
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
    warnings = [
        w
        for engine, family in zip(config.engines, families, strict=True)
        if not family.label_only
        for w in ignored_field_warnings(
            [p for p in policies if p not in family.engine_policies], engine, wl
        )
    ]
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
        "warnings": warnings,
        "feasibility": feasibility,
        **({"stack": stacks} if config.stack != "none" else {}),
    }
    return BenchResult(
        pd.DataFrame(summaries),
        pd.concat(frames, ignore_index=True),
        pd.concat(timelines, ignore_index=True),
        info,
        pd.concat(step_frames, ignore_index=True) if step_frames else pd.DataFrame(),
    )


def engine_stack(config: BenchConfig, family: EngineFamily) -> tuple[BenchConfig, dict[str, Any]]:
    """``config`` for one engine of ``family`` under ``config.stack``, and what was applied.

    ``--stack full`` turns on the parts of :data:`~superinfer.harness.engines.registry.STACK_PARTS`
    the engine supports (``EngineFamily.stack_parts``; ``--stack rotation,reuse``: those of the
    parts named): ``superinfer.rotation=true`` (unless the user set it; not with
    ``--cpu-kv-ratio 0``), ``--kv-policy reuse`` (unless another was given) and ``--kv-quant``;
    the others are switched off for this engine.

    Returns:
        ``(config, {"applied": [...], "not_applied": {part: why}})``; ``config`` itself and an
        empty dict for ``stack = "none"``.
    """
    if config.stack == "none":
        return config, {}
    asked = stack_parts(parse_stack(config.stack))
    parts = set(family.stack_parts) & set(asked)
    if config.cpu_kv_ratio == 0:
        parts.discard("rotation")
    missing = {p: why if p in asked else "not asked for (--stack)"
               for p, why in STACK_PARTS.items() if p not in parts}  # fmt: skip
    options = {k: dict(v) for k, v in config.policy_options.items()}
    if "rotation" in parts:
        options.setdefault("superinfer", {}).setdefault("rotation", "true")
    out = replace(
        config,
        kv_policy=(config.kv_policy or "reuse") if "reuse" in parts else None,
        kv_quant="quant" in parts,
        kv_quant_options=config.kv_quant_options if "quant" in parts else {},
        policy_options=options,
    )
    return out, {"applied": [p for p in STACK_PARTS if p in parts], "not_applied": missing}


def _family_policies(config: BenchConfig, families: Sequence[EngineFamily]) -> list[str]:
    """The policies a run of ``families`` selects: ``config.policies``, else the families'
    common default, else every registered policy all of them can run.

    Raises:
        UserError: an unknown name, or one a family cannot run
            (:attr:`~superinfer.harness.engines.registry.EngineFamily.unsupported_policies`).
    """
    own = tuple(dict.fromkeys(p for f in families for p in f.engine_policies))
    unsupported = {p: f.name for f in families for p in f.unsupported_policies}
    defaults = {f.default_policies for f in families}
    default = next(iter(defaults)) if len(defaults) == 1 else ()
    if not default and unsupported:
        default = tuple(p for p in sorted(available_policies()) if p not in unsupported)
    policies = select_policies(config.policies, engine_policies=own, default=default)
    for name in policies:
        if name in unsupported:
            raise UserError(
                f"policy {name!r} cannot run on engine {unsupported[name]!r} (it needs each "
                "request's true output length, which that engine's runner does not feed it); "
                "leave it out of --policies"
            )
    return policies


def _check_spec_bench(
    spec: WorkloadSpec, values: Mapping[str, Any], engines: Sequence[str]
) -> None:
    """Check the ``[bench]`` values of ``spec`` a run uses (``values``; the run's ``engines``):
    known engines, policies (registered, or run by one of ``engines`` itself), model, GPU and
    router.

    Raises:
        SpecError: the first unknown name, at the spec's file, line and ``bench.<key>``.
    """
    from superinfer.sim.hardware import get_gpu, get_model
    from superinfer.sim.routers import ROUTERS

    try:
        for engine in _split(values.get("engines")):
            engine_family(engine)
    except UserError as exc:
        raise _spec_error(spec, "engines", str(exc)) from None
    if "policies" in values:
        own = tuple(p for e in engines for p in _engine_policies(e))
        try:
            select_policies(policy_names(values["policies"]), engine_policies=own)
        except UserError as exc:
            raise _spec_error(spec, "policies", str(exc)) from None
    for key, lookup in (("model", get_model), ("gpu", get_gpu)):
        if key in values:
            try:
                lookup(values[key])
            except KeyError as exc:
                raise _spec_error(spec, key, str(exc.args[0])) from None
    if "router" in values and values["router"] not in ROUTERS:
        known = ", ".join(ROUTERS)
        raise _spec_error(spec, "router", f"unknown router {values['router']!r}; known: {known}")


def _canonical(name: str, lookup: Callable[[str], Any]) -> str:
    """The canonical name of a model or GPU given by name or alias to ``lookup``
    (``sim.hardware.get_gpu`` or ``get_model``: ``--gpu a100`` -> ``a100-80gb``), so the manifest
    and every table name it one way; an unknown name unchanged (the run reports it)."""
    try:
        return str(lookup(name).name)
    except KeyError:
        return name


def _spec_error(spec: WorkloadSpec, key: str, problem: str) -> SpecError:
    """A :class:`SpecError` at ``[bench]`` key ``key`` of ``spec`` (its file and line)."""
    return SpecError(spec.path, spec.line_of(f"bench.{key}"), f"bench.{key}", problem)


def _engine_policies(engine: str) -> tuple[str, ...]:
    """The policies engine id ``engine`` runs itself (none for an unknown id)."""
    try:
        return engine_family(engine).engine_policies
    except UserError:
        return ()


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


def suite_defaults(suite: str, *, workload_given: bool, given: Collection[str]) -> dict[str, Any]:
    """The suite's own defaults for the ``bench`` options the user did not give.

    headline: the Azure hour (conv = chat, code = batch) at the headline load with the seven
    headline policies. seed: the same hour and load on the three simulated GPU engines
    (``harness.suites_seed``). rotation: superinfer alone on Mooncake-length chat with fewer
    replicas than the spec's, so live KV exceeds HBM (:data:`ROTATION_DEFAULTS`).

    Args:
        suite: one of :data:`SUITES`.
        workload_given: the user named a ``--workload`` or ``--trace``.
        given: names of the options the user gave.
    """
    own: dict[str, Any] = {}
    if suite == "engines":  # harness/suites_engines.py sets every engine's settings itself
        return own
    if suite in ("headline", "seed"):
        own.update(rate_scale=HEADLINE_RATE_SCALE, policies=",".join(HEADLINE_POLICIES))
        if not workload_given:
            own["trace"] = "azure"
        if suite == "seed":
            own.update(engines="sim:vllm,sim:sglang,sim:trtllm", policies="superinfer")
    else:
        own.update(ROTATION_DEFAULTS)
        if workload_given:
            own.pop("workload", None)
    return {
        name: value
        for name, value in own.items()
        if name in ("trace", "workload") or name not in given
    }


def bench_config(params: Mapping[str, Any], *, given: Collection[str]) -> BenchConfig:
    """The run ``superinfer bench`` options describe, defaults merged once: the engine
    family's (``engines.registry``) < the suite's (:func:`suite_defaults`) and the workload
    spec's ``[bench]`` table < the options the user gave.

    Args:
        params: the ``bench`` options by parameter name (``workload``, ``trace``, ``engines``,
            ``model``, ``gpu``, ``tp``, ``replicas``, ``router``, ``cpu_kv_ratio``,
            ``kv_quant``, ``kv_quant_opts`` (a dict), ``kv_policy``, ``policies``,
            ``rate_scale``, ``duration_s``, ``start_s``, ``length_scale``,
            ``max_prompt_tokens``, ``max_output_tokens``, ``engine_options`` (a dict), ``url``,
            ``backend``, ``policy_opt``, ``seed``, ``suite``); unset shaping options are
            ``None``.
        given: names of the options the user gave (the rest hold their defaults).

    Raises:
        UserError: both ``--workload`` and ``--trace``, ``--kv-quant-opt`` without
            ``--kv-quant``, an unknown workload spec, a number out of bounds
            (``workload.limits.check_numbers``), or ``--policies`` empty or naming one twice.
        SpecError: a spec's ``[bench]`` value that is unknown (named by file, line and key).
    """
    p = dict(params)
    suite = p.get("suite")
    workload_given = p["workload"] is not None or p["trace"] is not None
    own = suite_defaults(suite, workload_given=workload_given, given=given) if suite else {}
    for key in ("trace", "workload", "rate_scale", "duration_s"):
        p[key] = own.get(key, p[key])
    if p["workload"] is not None and p["trace"] is not None:
        raise UserError("give --workload or --trace, not both")
    if p["kv_quant_opts"] and not p["kv_quant"]:
        raise UserError("--kv-quant-opt needs --kv-quant")
    check_numbers({k: p.get(k) for k in given if k != "policies"})
    policy_names(p["policies"] if "policies" in given else None)
    options = {k: p[k] for k in ("model", "gpu", "tp", "replicas", "router", "engines", "policies")}
    from_spec: dict[str, Any] = {}
    if p["workload"] is not None:
        spec = load_workload_spec(p["workload"])
        from_spec = {k: v for k, v in spec.bench.items() if k not in given and k not in own}
        options.update(from_spec)
    options.update({k: v for k, v in own.items() if k in options})
    if from_spec:
        _check_spec_bench(spec, from_spec, _split(options["engines"]))
    engine_ids = _split(options["engines"])
    if not engine_ids:
        where = "--engine" if "engines" in given or not from_spec else "the spec's bench.engines"
        raise UserError(f"{where} {options['engines']!r} names no engine")
    trace, workload = p["trace"], p["workload"]
    if trace is None and workload is None:
        # the real CPU engine replays a shaped slice of the Azure trace (engines.registry)
        kind, name = default_source(engine_ids)
        trace, workload = (name, None) if kind == "trace" else (None, name)
    shaping = shaping_defaults(engine_ids)
    if workload is not None:  # a spec sets its own window: the trace's default start is not it
        shaping["start_s"] = 0.0
    keys = ("rate_scale", "duration_s", "start_s", "length_scale")
    shaping.update({k: p[k] for k in (*keys, "max_prompt_tokens", "max_output_tokens")
                    if p[k] is not None})  # fmt: skip
    return BenchConfig(
        trace=trace or "azure",
        engines=engine_ids,
        model=_canonical(options["model"], get_model),
        gpu=_canonical(options["gpu"], get_gpu),
        tp=options["tp"],
        replicas=options["replicas"],
        router=options["router"],
        cpu_kv_ratio=p["cpu_kv_ratio"],
        kv_quant=p["kv_quant"],
        kv_quant_options=p["kv_quant_opts"],
        kv_policy=p["kv_policy"],
        policies=policy_names(options["policies"]),
        policy_opts=p["policy_opt"],
        seed=p["seed"],
        workload=workload,
        engine_options=p["engine_options"],
        url=p["url"],
        backend=p["backend"],
        stack=parse_stack(p.get("stack") or "none"),
        **shaping,
    )


def write_bench(
    result: BenchResult, config: BenchConfig, out: str | None
) -> tuple[Path, list[str], pd.DataFrame]:
    """Write ``result``'s run directory: the tables, ``manifest.json``, ``report.md`` and plots.

    Args:
        result: what :func:`run_bench` returned.
        config: its settings (the engines choose the default directory).
        out: the run directory; ``None``: the engines' (``engines.registry.run_dir``).

    Returns:
        ``(run directory, plot files, summary as written)``.

    The files are written into a temporary sibling directory renamed into place at the end
    (``report.results.staged_dir``): a failure leaves the previous run directory whole.

    Raises:
        UserError: ``out`` cannot hold a run directory (checked again: it may have changed).
    """
    from superinfer.harness.report.markdown import as_written, render_markdown, write_plots
    from superinfer.harness.report.results import manifest, staged_dir, write_run

    meta = manifest(result.info)
    out_dir = bench_out_dir(config, out)
    with staged_dir(out_dir) as stage:
        plots = write_plots(stage, result.summary, result.requests, result.timeline, meta)
        summary = as_written(result.summary)
        report = render_markdown(summary, meta, plots)
        write_run(
            stage, result.summary, result.requests, meta, report, result.timeline, result.steps
        )
    return out_dir, plots, summary


def bench_out_dir(config: BenchConfig, out: str | None, *, suite: str | None = None) -> Path:
    """The run directory of ``config``: ``out``, else ``results/<suite>`` for a suite
    (``results/engines-cpu`` for ``engines``), else
    the engines' default (``engines.registry.run_dir``), checked writable before any work.

    Raises:
        UserError: ``out`` exists and is not a directory, lies under a file, or cannot be
            written (``report.results.check_out_dir``).
    """
    from superinfer.harness.report.results import check_out_dir

    if out is not None:
        return check_out_dir(Path(out))
    folder = {"engines": "engines-cpu"}.get(suite or "", suite)
    return check_out_dir(Path(f"results/{folder}" if suite else run_dir(config.engines)))
