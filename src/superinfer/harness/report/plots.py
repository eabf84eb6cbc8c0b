"""PNG plots of a run (or of several runs side by side), drawn with matplotlib's Agg backend.

Every plot is read without the code: axes carry the quantity and its unit, each line or bar is
named in a legend, SLO targets are drawn where they apply, and the title says what is counted.
Inputs are the run directory's tables (``requests.parquet``, ``summary.csv``,
``timeline.parquet``, an optional ``sweep.csv``), each with a ``series`` column naming the line
or bar a row belongs to (``policy``, ``engine · policy`` or ``run · engine · policy``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from superinfer.harness.report.results import write_atomic

__all__ = [
    "PLOT_FILES",
    "add_series",
    "attainment_bars",
    "latency_cdf",
    "sweep_plot",
    "timeline_plot",
]

#: Plot files of a run directory and what each shows (the report's captions).
PLOT_FILES = {
    "ttft_cdf.png": "TTFT CDF per SLO class: fraction of the class's requests whose first token "
    "came within x ms (log scale). The grey dashed line is the class's TTFT target; curves end "
    "below 1 when requests were rejected or did not finish. Policies that decide alike draw "
    "one curve over the other (each has its own dash pattern).",
    "e2e_cdf.png": "End-to-end latency CDF per SLO class, counted like the TTFT plot; the dashed "
    "line is the class's deadline, where it has one.",
    "attainment.png": "SLO attainment per class, per policy (one panel per engine): the fraction "
    "of requests that finished and met every target of their class.",
    "kv_hbm.png": "KV cache in HBM over time, per replica (line: mean over replicas; band: "
    "least and most loaded replica), with the replica's KV capacity dashed.",
    "queue.png": "Requests waiting (solid) and running (dotted) over time, summed over replicas.",
    "sweep.png": "Load sweep: SLO attainment per class as the arrival rate is scaled.",
}

_DPI = 120
_PANEL_W, _PANEL_H = 5.2, 3.6
_CLASS_ORDER_LAST = "all"


def add_series(frame: pd.DataFrame, run: str | None = None) -> pd.DataFrame:
    """A copy of ``frame`` with a ``series`` label per row: the policy, with the engine when a
    frame holds several engines, and ``run`` in front when given."""
    out = frame.copy()
    several = out["engine"].nunique() > 1 if "engine" in out else False
    label = out["policy"].astype(str)
    if several:
        label = out["engine"].astype(str) + " · " + label
    if run is not None:
        label = f"{run} · " + label
    out["series"] = label
    return out


def _colors(series: Sequence[str]) -> dict[str, tuple[float, float, float, float]]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {name: cmap(i % 10) for i, name in enumerate(series)}


#: Dash patterns per series, so that series that coincide (two policies that decide alike)
#: still show as two lines.
_DASHES = ["solid", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (3, 3))]


def _dashes(series: Sequence[str]) -> dict[str, Any]:
    return {name: _DASHES[i % len(_DASHES)] for i, name in enumerate(series)}


def _classes(values: pd.Series) -> list[str]:
    names = sorted(str(v) for v in values.unique() if v != _CLASS_ORDER_LAST)
    return names + ([_CLASS_ORDER_LAST] if _CLASS_ORDER_LAST in set(values) else [])


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=_DPI))
    return path


def _panels(n: int, *, share_y: bool = True) -> tuple[Figure, list[Axes]]:
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(_PANEL_W * cols, _PANEL_H * rows + 0.4))
    grid = fig.subplots(rows, cols, squeeze=False, sharey=share_y)
    axes = [ax for row in grid for ax in row]
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def latency_cdf(
    requests: pd.DataFrame, column: str, path: Path, *, target: str | None, label: str
) -> Path:
    """Empirical CDF of ``column`` (ms) per SLO class, one line per series.

    The CDF is over every request of the class: requests without a value (rejected, failed)
    never arrive, so a curve's height at the right edge is the finished fraction.

    Args:
        requests: requests table with ``series``, ``slo_class``, ``status`` and ``column``.
        column: ``ttft_ms`` or ``e2e_ms``.
        path: PNG to write.
        target: column holding the class's target in ms (``slo_ttft_ms``), or
            ``"slo_deadline_s"`` (converted to ms), or ``None``.
        label: axis name of the quantity, e.g. ``"TTFT"``.
    """
    classes = _classes(requests["slo_class"])
    series = sorted(requests["series"].unique())
    colors, dashes = _colors(series), _dashes(series)
    fig, axes = _panels(len(classes))
    for ax, cls in zip(axes, classes, strict=True):
        part = requests[requests["slo_class"] == cls]
        for name in series:
            rows = part[part["series"] == name]
            if rows.empty:
                continue
            values = np.sort(rows[column].dropna().to_numpy(dtype=float))
            values = np.maximum(values, 1e-3)  # a log axis cannot show 0 ms
            frac = np.arange(1, values.size + 1) / len(rows)
            ax.step(
                values,
                frac,
                where="post",
                color=colors[name],
                linestyle=dashes[name],
                label=name,
                linewidth=1.4,
            )
        if target is not None and target in part:
            goal = part[target].dropna()
            if not goal.empty:
                value = float(goal.iloc[0])
                deadline = target.endswith("_s")
                ax.axvline(
                    value * 1e3 if deadline else value,
                    color="0.3",
                    linestyle="--",
                    linewidth=1.0,
                    label=f"deadline {value:,g} s" if deadline else f"target {value:,g} ms",
                )
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"class {cls} ({len(part) // max(part['series'].nunique(), 1):,} requests)")
        ax.set_xlabel(f"{label} (ms, log scale)")
        ax.set_ylabel("fraction of requests ≤ x")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{label}: cumulative distribution per SLO class")
    return _save(fig, path)


def attainment_bars(summary: pd.DataFrame, path: Path) -> Path:
    """SLO attainment bars: groups = SLO classes (``all`` last), one bar per series, one panel
    per engine; each bar is labelled with its value.

    Args:
        summary: summary rows with ``series`` (without the engine), ``engine``, ``slo_class``,
            ``slo_attainment``.
        path: PNG to write.
    """
    engines = list(dict.fromkeys(summary["engine"]))
    classes = _classes(summary["slo_class"])
    series = list(dict.fromkeys(summary["series"]))
    colors = _colors(series)
    fig, axes = _panels(len(engines))
    width = 0.8 / max(len(series), 1)
    for ax, engine in zip(axes, engines, strict=True):
        part = summary[summary["engine"] == engine]
        for i, name in enumerate(series):
            rows = part[part["series"] == name].set_index("slo_class")
            xs = [k + (i - (len(series) - 1) / 2) * width for k in range(len(classes))]
            ys = [float(rows.loc[c, "slo_attainment"]) if c in rows.index else 0.0 for c in classes]
            bars = ax.bar(xs, ys, width=width * 0.95, color=colors[name], label=name)
            ax.bar_label(bars, labels=[f"{y:.2f}" for y in ys], fontsize=7, padding=1)
        ax.set_xticks(range(len(classes)), classes)
        ax.set_ylim(0, 1.32)
        ax.set_yticks(np.linspace(0, 1, 6))
        ax.set_xlabel("SLO class")
        ax.set_ylabel("SLO attainment (fraction of requests)")
        ax.set_title(f"engine {engine}")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", ncol=min(len(series), 3), frameon=False)
    fig.suptitle("SLO attainment per class and policy")
    return _save(fig, path)


#: Bin widths of timeline plots, s: the smallest giving at most about 300 bins is used.
_BINS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)


def _bin_s(timeline: pd.DataFrame) -> float:
    span = float(timeline["time_s"].max() - timeline["time_s"].min()) if len(timeline) else 0.0
    return float(next((b for b in _BINS_S if span / b <= 300), _BINS_S[-1]))


def timeline_plot(
    timeline: pd.DataFrame,
    path: Path,
    *,
    kind: str,
    capacity_gb: dict[str, float] | None = None,
) -> Path:
    """KV use (``kind="kv"``) or queue lengths (``kind="queue"``) over time, one panel per
    engine, one color per series. Samples are averaged in bins of ``max(1 s, span / 300)``.

    Args:
        timeline: ``timeline.parquet`` rows with ``series``.
        path: PNG to write.
        kind: ``"kv"``: per-replica KV GB (mean line, min-max band, capacity dashed);
            ``"queue"``: waiting and running requests summed over replicas.
        capacity_gb: KV capacity of one replica per engine, for the dashed line.
    """
    engines = list(dict.fromkeys(timeline["engine"]))
    series = sorted(timeline["series"].unique())
    colors, dashes = _colors(series), _dashes(series)
    fig, axes = _panels(len(engines), share_y=False)
    width = _bin_s(timeline)
    for ax, engine in zip(axes, engines, strict=True):
        part = timeline[timeline["engine"] == engine].copy()
        part["bin"] = (part["time_s"] // width) * width
        for name in series:
            rows = part[part["series"] == name]
            if rows.empty:
                continue
            per_replica = rows.groupby(["bin", "replica"]).mean(numeric_only=True)
            if kind == "kv":
                kv = per_replica["kv_hbm_gb"].groupby(level="bin")
                mean, low, high = kv.mean(), kv.min(), kv.max()
                ax.plot(
                    mean.index,
                    mean.to_numpy(),
                    color=colors[name],
                    linestyle=dashes[name],
                    label=name,
                    linewidth=1.2,
                )
                ax.fill_between(
                    mean.index, low.to_numpy(), high.to_numpy(), color=colors[name], alpha=0.15
                )
            else:
                total = per_replica.groupby(level="bin").sum()
                ax.plot(
                    total.index,
                    total["num_waiting"].to_numpy(),
                    color=colors[name],
                    label=f"{name} waiting",
                    linewidth=1.2,
                )
                ax.plot(
                    total.index,
                    total["num_running"].to_numpy(),
                    color=colors[name],
                    linestyle=":",
                    label=f"{name} running",
                    linewidth=1.0,
                )
        if kind == "kv" and capacity_gb and engine in capacity_gb:
            ax.axhline(
                capacity_gb[engine],
                color="0.3",
                linestyle="--",
                linewidth=1.0,
                label=f"capacity {capacity_gb[engine]:.1f} GB",
            )
        ax.set_xlabel("time since first arrival (s)")
        ax.set_ylabel(
            "KV cache in HBM per replica (GB)" if kind == "kv" else "requests (all replicas)"
        )
        ax.set_title(f"engine {engine}")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    title = "KV cache in HBM over time" if kind == "kv" else "Queue length over time"
    fig.suptitle(f"{title} (means over {width:g} s bins)")
    return _save(fig, path)


def sweep_plot(sweep: pd.DataFrame, path: Path) -> Path:
    """SLO attainment against ``rate_scale``, one panel per SLO class, one line per series.

    Args:
        sweep: rows with ``rate_scale``, ``engine``, ``policy``, ``slo_class``,
            ``slo_attainment`` (as ``results/headline/sweep.csv``) and ``series``.
        path: PNG to write.
    """
    classes = _classes(sweep["slo_class"])
    series = sorted(sweep["series"].unique())
    colors, dashes = _colors(series), _dashes(series)
    fig, axes = _panels(len(classes))
    for ax, cls in zip(axes, classes, strict=True):
        part = sweep[sweep["slo_class"] == cls]
        for name in series:
            rows = part[part["series"] == name].groupby("rate_scale")["slo_attainment"].mean()
            if rows.empty:
                continue
            ax.plot(
                rows.index,
                rows.to_numpy(),
                marker="o",
                color=colors[name],
                linestyle=dashes[name],
                label=name,
            )
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("arrival-rate scale (× the workload's rate)")
        ax.set_ylabel("SLO attainment (fraction)")
        ax.set_title(f"class {cls}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    fig.suptitle("Load sweep: SLO attainment as load grows")
    return _save(fig, path)
