"""What the command line prints: summary and plan tables, and progress bars (rich)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "bench_progress",
    "print_plan",
    "print_summary",
    "print_wide",
    "progress_bar",
    "progress_task",
]


def print_summary(summary: pd.DataFrame) -> None:
    """Print a run's summary table (``summary.csv`` rows, as written) on stdout."""
    from rich.table import Table

    from superinfer.harness.report.markdown import TABLE_COLUMNS, format_value

    cols = [c for c in TABLE_COLUMNS if c in summary and c != "e2e_p99_ms"]
    if summary["engine"].nunique() == 1:
        cols.remove("engine")
    table = Table(title=f"engine {summary['engine'].iloc[0]}" if "engine" not in cols else None)
    for c in cols:
        left = c in ("engine", "policy", "slo_class")
        table.add_column(TABLE_COLUMNS[c], justify="left" if left else "right", no_wrap=left)
    for _, row in summary.iterrows():
        table.add_row(*(format_value(row[c], c) for c in cols))
    print_wide(table)


def print_wide(table: Any) -> None:
    """Print a rich table on stdout, 160 columns wide when not a terminal."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=160)
    console.print(table)


@contextlib.contextmanager
def progress_bar(console: Any, *, runs: bool = False) -> Iterator[Any]:
    """A progress display that shows once its first task is added, and stops on exit; with
    ``runs``, bench's transient ``done/total runs`` bar."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if runs:
        columns: tuple[Any, ...] = (TextColumn("{task.description}"), BarColumn(),
                                    TextColumn("{task.completed}/{task.total} runs"),
                                    TimeElapsedColumn())  # fmt: skip
        with Progress(*columns, console=console, transient=True) as bar:
            yield bar
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=console)  # fmt: skip
    try:
        yield bar
    finally:
        if bar.live.is_started:
            bar.stop()


def progress_task(bar: Any, label: str) -> Callable[[int, int, bool], None]:
    """Start ``bar`` and add a task ``label``; returns the per-cell callback
    ``(done, total, cached)`` of the executors."""
    bar.start()  # on the first task, so errors found before any cell runs print alone
    task = bar.add_task(label, total=None)

    def update(done: int, total: int, cached: bool) -> None:
        bar.update(task, completed=done, total=total)

    return update


def print_plan(detail: pd.DataFrame) -> None:
    """Print a fleet plan's ``plan_detail.csv`` rows as a table on stdout."""
    from rich.table import Table

    table = Table()
    cols = ["engine", "policy", "layout", "replicas", "gpus", "meets_slo", "chat_attainment",
            "batch_attainment", "busy_fraction", "mfu", "cost_per_mtok"]  # fmt: skip
    for c in cols:
        table.add_column(c, justify="left" if c in ("engine", "policy", "layout") else "right")
    for row in detail.itertuples():
        values = [getattr(row, c) for c in cols]
        table.add_row(*(("n/a" if math.isnan(v) else f"{v:.4g}") if isinstance(v, float)
                        else str(v) for v in values))  # fmt: skip
    print_wide(table)


@contextlib.contextmanager
def bench_progress(
    console: Any, num_requests: int
) -> Iterator[Callable[[int, int, str], None] | None]:
    """``bench``'s transient ``done/total runs`` bar on a terminal: yields the ``on_cell``
    callback of ``bench.run_bench``, or ``None`` when piped or captured (no bar)."""
    if not console.is_terminal:
        yield None
        return
    with progress_bar(console, runs=True) as bar:
        task = bar.add_task("simulating", total=None)

        def on_cell(done: int, total: int, label: str) -> None:
            text = f"{label}: {num_requests} requests"
            bar.update(task, completed=done, total=total, description=text)

        yield on_cell
