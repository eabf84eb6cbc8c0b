"""``superinfer fleet plan``: its option strings parsed into a :class:`FleetConfig`, the search run
(``grid.fleet.plan_fleet``) and the plan files written (``plan.csv``, ``plan_detail.csv``,
``search.csv``, ``plan.md``, ``manifest.json``)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.errors import UserError
from superinfer.harness.grid.cells import CellCache, load_workload
from superinfer.harness.grid.executors import CellRunner, ProgressFn
from superinfer.harness.grid.fleet import FleetConfig, FleetPlan, plan_fleet, render_plan
from superinfer.harness.policies import registered_policies
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, manifest, write_atomic
from superinfer.harness.workload.slo_options import parse_slo

__all__ = [
    "PLAN_FILES",
    "default_fleet_policies",
    "parse_targets",
    "parse_window",
    "run_fleet_plan",
]

#: Files a plan writes (``cells/`` beside them holds the cell cache).
PLAN_FILES = ("plan.csv", "plan_detail.csv", "search.csv", "plan.md", "manifest.json")


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    frame.to_csv(path, index=False, float_format=CSV_FLOAT_FORMAT)


def parse_targets(value: str | None) -> tuple[tuple[str, float], ...]:
    """``CLASS=FRACTION[,...]`` -> ``((class, attainment), ...)``.

    Raises:
        UserError: an item not of that form, or an attainment outside (0, 1].
    """
    if not value:
        return ()
    out = []
    for item in value.split(","):
        cls, eq, raw = item.partition("=")
        try:
            target = float(raw)
        except ValueError:
            target = math.nan
        if not eq or not cls.strip() or not 0 < target <= 1:
            raise UserError(
                f"--target {item!r}: expected CLASS=ATTAINMENT with 0 < ATTAINMENT <= 1"
            )
        out.append((cls.strip(), target))
    return tuple(out)


def parse_window(window_s: str) -> float | None:
    """``--window-s``: seconds, or ``full`` (``None``: the whole workload).

    Raises:
        UserError: neither a number nor ``full``.
    """
    if window_s.strip().lower() == "full":
        return None
    try:
        return float(window_s)
    except ValueError:
        raise UserError(
            f"--window-s must be a number of seconds or `full`, got {window_s!r}"
        ) from None


def default_fleet_policies() -> tuple[tuple[str, ...], list[str]]:
    """``native`` and ``superinfer`` (when registered), and the notes on what was skipped."""
    registered = registered_policies()
    names = tuple(p for p in ("native", "superinfer") if p == "native" or p in registered)
    notes = (
        []
        if "superinfer" in names
        else ["policy 'superinfer' is not registered: planned native only"]
    )
    return names, notes


def run_fleet_plan(
    options: Mapping[str, Any],
    *,
    executor: str = "local",
    address: str | None = None,
    workers: int | None = None,
    fresh: bool = False,
    out: str = "results/fleet",
    progress: Callable[[str], ProgressFn | None] | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> tuple[FleetPlan, FleetConfig, CellRunner, Path]:
    """Plan the fleet ``options`` describe and write the plan files (:data:`PLAN_FILES`).

    Args:
        options: ``fleet plan`` options by name: ``workload``, ``engines`` (tuple),
            ``policies`` (tuple, or ``None`` for :func:`default_fleet_policies`), ``slo``
            (``--slo`` strings), ``target`` (``--target`` string), ``window_s`` (string), and
            the :class:`FleetConfig` fields ``model``, ``gpu``, ``tp``, ``router``,
            ``cpu_kv_ratio``, ``rate_scale``, ``seed``, ``window_start_s``, ``warmup_s``,
            ``gpu_price``, ``min_replicas``, ``max_replicas``, ``confirm``, ``split``,
            ``check_full``.
        executor: ``local`` processes or ``ray`` tasks.
        address: Ray cluster address.
        workers: local processes or Ray CPUs (``None``: all).
        fresh: ignore cached cells.
        out: output directory.
        progress: per search, called with its label; returns its per-cell callback.
        log: called with each line of the search's log.

    Returns:
        ``(plan, config, the runner (cells run and cached), output directory)``.

    Raises:
        UserError: a bad option, workload, SLO class or target.
    """
    notes: list[str] = []
    if options["policies"] is None:
        names, notes = default_fleet_policies()
    else:
        names = tuple(options["policies"])
    window = parse_window(options["window_s"])
    workload = options["workload"]
    wl = load_workload(workload, options["rate_scale"])
    base = {r.slo.name: r.slo for r in wl.requests}
    overrides = []
    for cls, changes in parse_slo(options["slo"]).items():
        if cls not in base:
            raise UserError(f"--slo: workload {workload!r} has no SLO class {cls!r}")
        try:
            overrides.append(dataclasses.replace(base[cls], **changes))  # type: ignore[arg-type]
        except ValueError as exc:
            raise UserError(f"--slo {cls}: {exc}") from None
    fields = ("model", "gpu", "tp", "router", "cpu_kv_ratio", "rate_scale", "seed",
              "window_start_s", "warmup_s", "gpu_price", "min_replicas", "max_replicas",
              "confirm", "split", "check_full", "stack")  # fmt: skip
    config = FleetConfig(
        trace=workload,
        engines=tuple(options["engines"]),
        policies=names,
        slo=tuple(overrides),
        targets=parse_targets(options["target"]),
        window_s=window,
        **{f: options[f] for f in fields},
    )
    out_dir = Path(out)
    cache = CellCache(out_dir / "cells", read=not fresh)
    t0 = time.perf_counter()
    with CellRunner(executor, workers=workers, address=address, cache=cache) as runner:
        result = plan_fleet(config, wl, runner, progress=progress, log=log, notes=notes)
    for name, frame in (("plan", result.plan), ("plan_detail", result.detail),
                        ("search", result.search)):  # fmt: skip
        write_atomic(out_dir / f"{name}.csv", partial(_write_csv, frame))
    write_atomic(out_dir / "plan.md", lambda p: p.write_text(render_plan(result, config, wl)))
    meta = manifest(
        {
            "config": {**dataclasses.asdict(config), "executor": executor, "address": address},
            **result.info,
            "cells_run": runner.num_run,
            "cells_cached": runner.num_cached,
            "wall_s": round(time.perf_counter() - t0, 2),
        }
    )
    write_atomic(
        out_dir / "manifest.json",
        lambda p: p.write_text(json.dumps(meta, indent=2, default=str) + "\n"),
    )
    return result, config, runner, out_dir
