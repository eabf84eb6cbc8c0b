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
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.errors import UserError
from superinfer.harness.grid.cells import (
    CELL_FIELDS,
    CellSpec,
    cell_key,
    check_cell,
)
from superinfer.harness.policies import resolve_policy
from superinfer.harness.report.metrics import SUMMARY_COLUMNS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["SWEEP_CELL_COLUMNS", "SweepSpec", "load_sweep_spec", "sweep_table"]

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
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise UserError(f"{where}: no value")
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
            value of the wrong type, or an empty grid axis.
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
