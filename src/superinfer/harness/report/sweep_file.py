"""Load-sweep files (``sweep.csv``: attainment per load, engine, policy and class), read for the
report's sweep plot and table, each bad value named with its file and line."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from superinfer.harness.errors import UserError

__all__ = ["SWEEP_COLUMNS", "load_sweep"]

#: Columns a load-sweep file (``sweep.csv``) must have to be plotted.
SWEEP_COLUMNS = ("rate_scale", "engine", "policy", "slo_class", "slo_attainment")


def load_sweep(path: Path) -> pd.DataFrame:
    """Read a load-sweep CSV.

    Raises:
        UserError: unreadable, a column of :data:`SWEEP_COLUMNS` missing, no rows, or a
            ``rate_scale`` or ``slo_attainment`` that is not a number (named with its line).
    """
    try:
        sweep = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None
    missing = [c for c in SWEEP_COLUMNS if c not in sweep]
    if missing:
        raise UserError(f"{path}:1: field {missing[0]!r}: missing column of a load sweep")
    if sweep.empty:
        raise UserError(f"{path}: no rows (a load sweep has one per load, engine, policy, class)")
    for col in ("rate_scale", "slo_attainment"):
        num = pd.to_numeric(sweep[col], errors="coerce")
        if (bad := (num.isna() & sweep[col].notna()).to_numpy()).any():
            i = int(bad.argmax())
            raise UserError(
                f"{path}:{i + 2}: field {col!r}: {sweep[col].iloc[i]!r} is not a number"
            )
        sweep[col] = num
    return sweep
