"""Sweeps: a TOML spec of a grid of cells, expanded, and their outcomes as one tidy table.

A spec has two tables. ``[cell]`` sets what every cell shares; ``[grid]`` gives, per field, a
list of values; the sweep is the cross product of the lists, in the order the file gives them::

    out = "results/sweeps/example"    # optional; `superinfer sweep --out` wins

    [cell]                            # any CellSpec field: trace, model, gpu, tp, router, ...
    trace = "azure"
    model = "llama-3.1-70b"
    gpu = "h100-80gb"
    duration_s = 300

    [grid]                            # the axes: engines x policies x replicas x loads x seeds
    engine = ["sim:vllm", "sim:trtllm"]
    policy = ["native", "priority"]
    replicas = [2, 4]
    rate_scale = [1.0, 1.5]
    seed = [0]
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.errors import UserError
from superinfer.harness.grid.cells import (
    CELL_FIELDS,
    CellCache,
    CellSpec,
    cell_key,
    check_cell,
    load_workload,
)
from superinfer.harness.grid.executors import CellRunner, ProgressFn
from superinfer.harness.policies import resolve_policy
from superinfer.harness.report.metrics import SUMMARY_COLUMNS
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, manifest, write_atomic

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "SWEEP_CELL_COLUMNS",
    "SweepRun",
    "SweepSpec",
    "load_sweep_spec",
    "run_sweep",
    "sweep_table",
]

#: Leading columns of ``sweep.csv``: the cell's settings; then ``SUMMARY_COLUMNS`` (less engine
#: and policy), then ``TRAILING``. One row per cell x SLO class (and ``all``).
SWEEP_CELL_COLUMNS = (
    "trace",
    "engine",
    "policy",
    "model",
    "gpu",
    "tp",
    "replicas",
    "gpus",
    "router",
    "cpu_kv_ratio",
    "rate_scale",
    "seed",
    "start_s",
    "duration_s",
    "warmup_s",
)

#: Last columns of ``sweep.csv``.
TRAILING = ("busy_fraction", "mfu", "cell_key")


@dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep spec.

    Attributes:
        path: the file.
        base: the fields every cell shares (``[cell]``).
        grid: ``(field, values)`` per axis, in file order (``[grid]``).
        out: output directory the spec asks for, or ``None``.
    """

    path: Path
    base: CellSpec
    grid: tuple[tuple[str, tuple[Any, ...]], ...]
    out: Path | None = None

    def cells(self) -> tuple[list[CellSpec], list[str]]:
        """The cells of the grid, in cross-product order, and notes on how ``native`` resolved.

        ``policy = "native"`` becomes each engine's native policy. Cells that come out equal
        (``native`` and the policy it resolves to) are kept once.

        Raises:
            UserError: a cell that cannot run (the message names the spec file).
        """
        names = [name for name, _ in self.grid]
        out: list[CellSpec] = []
        seen: set[CellSpec] = set()
        notes: list[str] = []
        for values in itertools.product(*(vals for _, vals in self.grid)):
            cell = replace(self.base, **dict(zip(names, values, strict=True)))
            try:
                policy, note = resolve_policy(cell.policy, cell.engine)
                cell = replace(cell, policy=policy)
                check_cell(cell)
            except UserError as exc:
                raise UserError(f"{self.path}: {exc}") from None
            if note and note not in notes:
                notes.append(note)
            if cell not in seen:
                seen.add(cell)
                out.append(cell)
        return out, notes


def _check_value(path: Path, table: str, name: str, value: Any) -> Any:
    hint = str(CELL_FIELDS[name])
    where = f"{path}: [{table}] {name}"
    if value is None:
        raise UserError(f"{where}: no value")
    if isinstance(value, float) and math.isnan(value):
        raise UserError(f"{where}: nan is not a value")
    if hint.startswith("int") and (isinstance(value, bool) or not isinstance(value, int)):
        raise UserError(f"{where}: expected an integer, got {value!r}")
    if hint.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint.startswith("str") and not isinstance(value, str):
        raise UserError(f"{where}: expected a string, got {value!r}")
    return value


def _check_keys(path: Path, table: str, items: Mapping[str, Any]) -> None:
    for name in items:
        if name not in CELL_FIELDS:
            known = ", ".join(CELL_FIELDS)
            raise UserError(f"{path}: [{table}] unknown field {name!r}; fields: {known}")


def load_sweep_spec(path: str | Path) -> SweepSpec:
    """Parse a sweep spec (module docstring).

    Raises:
        UserError: unreadable file, bad TOML (with its line), an unknown table or field, a
            value of the wrong type, an empty grid axis, a field in both tables, or a spec that
            sets nothing.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: {exc}") from None
    unknown = sorted(set(data) - {"out", "cell", "grid"})
    if unknown:
        raise UserError(f"{path}: unknown key {unknown[0]!r}; a spec has out, [cell], [grid]")
    if not data.get("cell") and not data.get("grid"):  # would run one default cell, unasked
        raise UserError(f"{path}: no [cell] or [grid] settings; a spec sets what its cells run")
    base_items = data.get("cell", {})
    grid_items = data.get("grid", {})
    for table, items in (("cell", base_items), ("grid", grid_items)):
        if not isinstance(items, dict):
            raise UserError(f"{path}: {table} must be a table ([{table}])")
        _check_keys(path, table, items)
    base = CellSpec(**{k: _check_value(path, "cell", k, v) for k, v in base_items.items()})
    grid = []
    for name, values in grid_items.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"{path}: [grid] {name}: expected a non-empty list of values")
        if name in base_items:  # the axis would silently override the [cell] value
            raise UserError(f"{path}: {name} is set in both [cell] and [grid]; keep one")
        grid.append((name, tuple(_check_value(path, "grid", name, v) for v in values)))
    out = data.get("out")
    if out is not None and not isinstance(out, str):
        raise UserError(f"{path}: out: expected a string, got {out!r}")
    return SweepSpec(path, base, tuple(grid), Path(out) if out else None)


def sweep_table(cells: Sequence[CellSpec], outcomes: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The tidy table of a sweep: one row per cell x SLO class, cells in the given order.

    Columns: :data:`SWEEP_CELL_COLUMNS`, ``SUMMARY_COLUMNS`` (less engine, policy), the extra
    summary columns, ``busy_fraction`` and ``mfu`` (``cells.run_cell``), and ``cell_key``.
    Wall times are left out (they are in the cache files), so equal sweeps give equal tables
    whichever executor ran them.
    """
    rows = []
    for cell, outcome in zip(cells, outcomes, strict=True):
        settings = {k: v for k, v in asdict(cell).items() if k in SWEEP_CELL_COLUMNS}
        settings["gpus"] = cell.gpus
        for summary in outcome["summary"]:
            row = {**settings, **summary}
            for name in TRAILING[:-1]:
                row[name] = outcome.get(name, math.nan)
            row["cell_key"] = cell_key(cell)
            rows.append(row)
    summary_cols = [c for c in SUMMARY_COLUMNS if c not in ("engine", "policy")]
    leading = [*SWEEP_CELL_COLUMNS, *summary_cols]
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=[*leading, *TRAILING])
    extra = [c for c in df.columns if c not in leading and c not in TRAILING]
    return df[[*leading, *extra, *TRAILING]]


@dataclass(frozen=True)
class SweepRun:
    """What :func:`run_sweep` did.

    Attributes:
        out_dir: the directory written (``sweep.csv``, ``manifest.json``, ``cells/``).
        notes: the spec's notes (policy fallbacks).
        num_cells: cells in the grid.
        num_run: cells computed.
        num_cached: cells read from the cache.
    """

    out_dir: Path
    notes: list[str]
    num_cells: int
    num_run: int
    num_cached: int


def run_sweep(
    spec: str,
    *,
    executor: str = "local",
    address: str | None = None,
    workers: int | None = None,
    fresh: bool = False,
    out: str | None = None,
    progress: Callable[[str], ProgressFn] | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> SweepRun:
    """Run the grid of sweep spec ``spec`` and write ``sweep.csv`` and ``manifest.json``.

    Cells are cached by a hash of their settings, the workload's files and the code under
    ``OUT/cells/``, so an interrupted sweep resumes where it stopped.

    Args:
        spec: path of the sweep TOML.
        executor: ``local`` processes or ``ray`` tasks.
        address: Ray cluster address.
        workers: local processes or CPUs of the local Ray instance (``None``: all).
        fresh: ignore cached cells (they are still rewritten).
        out: output directory (``None``: the spec's ``out``, else ``results/sweeps/<name>``).
        progress: called with a label once the cells start; returns the per-cell callback.
        log: called with each note before any cell runs.

    Raises:
        UserError: an invalid spec or cell, or a bad trace.
    """
    parsed = load_sweep_spec(spec)
    cells, notes = parsed.cells()
    for note in notes:
        log(f"note: {note}")
    for trace, scale in sorted({(c.trace, c.rate_scale) for c in cells}):
        load_workload(trace, scale)  # a bad trace fails here, once, before any worker starts
    out_dir = Path(out) if out else parsed.out or Path("results/sweeps") / Path(spec).stem
    cache = CellCache(out_dir / "cells", read=not fresh)
    t0 = time.perf_counter()
    with CellRunner(executor, workers=workers, address=address, cache=cache) as runner:
        update = progress(f"sweep {len(cells)} cells") if progress else None
        outcomes = runner.run(cells, update)
    table = sweep_table(cells, outcomes)
    write_atomic(
        out_dir / "sweep.csv",
        lambda p: table.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT),
    )
    meta = manifest(
        {
            "config": {"spec": str(spec), "executor": executor, "address": address},
            "notes": notes,
            "cells": len(cells),
            "cells_run": runner.num_run,
            "cells_cached": runner.num_cached,
            "wall_s": round(time.perf_counter() - t0, 2),
        }
    )
    write_atomic(
        out_dir / "manifest.json", lambda p: p.write_text(json.dumps(meta, indent=2) + "\n")
    )
    return SweepRun(out_dir, notes, len(cells), runner.num_run, runner.num_cached)
