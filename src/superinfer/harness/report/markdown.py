"""Human-readable reports: ``report.md`` with its PNG plots, the terminal table, and the
comparison of several run directories (``superinfer report RUN_DIR [RUN_DIR ...]``)."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.engines.registry import family_kinds
from superinfer.harness.errors import UserError
from superinfer.harness.report.metrics import METRIC_COLUMNS, SUMMARY_COLUMNS, metrics_long
from superinfer.harness.report.notes import feasibility_lines, stack_lines
from superinfer.harness.report.plots import (
    PLOT_FILES,
    add_series,
    attainment_bars,
    latency_cdf,
    sweep_plot,
    timeline_plot,
)
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, write_atomic
from superinfer.harness.report.sweep_file import SWEEP_COLUMNS as SWEEP_COLUMNS
from superinfer.harness.report.sweep_file import load_sweep as load_sweep

__all__ = [
    "SWEEP_COLUMNS",
    "TABLE_COLUMNS",
    "RunData",
    "as_written",
    "compare_runs",
    "format_value",
    "load_run",
    "rebuild_report",
    "render_markdown",
    "write_plots",
]

#: Columns shown in tables (the CSV has them all), with their headers.
TABLE_COLUMNS = {
    "engine": "engine",
    "policy": "policy",
    "slo_class": "class",
    "n_requests": "req",
    "n_finished": "done",
    "n_rejected": "rej",
    "ttft_p50_ms": "TTFT p50 ms",
    "ttft_p99_ms": "TTFT p99 ms",
    "tpot_p50_ms": "TPOT p50 ms",
    "tpot_p99_ms": "TPOT p99 ms",
    "e2e_p99_ms": "E2E p99 ms",
    "slo_attainment": "SLO attain.",
    "slo_attainment_feasible": "attain. feasible",
    "goodput_rps": "goodput req/s",
    "output_tok_s": "output tok/s",
    "kv_peak_gb": "KV peak GB",
    "preemptions": "preempt.",
}


def format_value(value: Any, column: str, digits: int = 3) -> str:
    """Render one table cell: counts as integers, attainment to 3 places, other floats to 1
    decimal from 100 up and ``digits`` significant digits below; NaN as "–"."""
    if isinstance(value, float) and math.isnan(value):
        return "–"
    if column.startswith("n_") or column == "preemptions":
        return f"{int(value)}"
    if column in ("slo_attainment", "slo_attainment_feasible"):
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.{digits}g}"
    return str(value)


def _table(summary: pd.DataFrame, extra: Sequence[str] = ()) -> str:
    headers = {**{c: c for c in extra}, **TABLE_COLUMNS}
    cols = [c for c in headers if c in summary]
    lines = [
        "| " + " | ".join(headers[c] for c in cols) + " |",
        "|"
        + "|".join(
            "---" if c in ("engine", "policy", "slo_class", *extra) else "---:" for c in cols
        )
        + "|",
    ]
    for _, row in summary.iterrows():
        lines.append("| " + " | ".join(format_value(row[c], c) for c in cols) + " |")
    return "\n".join(lines)


def _capacities(meta: dict[str, Any]) -> dict[str, float]:
    seen: dict[str, float] = {}
    for key, cell in meta.get("cells", {}).items():
        if "kv_capacity_gb" in cell:
            seen.setdefault(key.split("/")[0], float(cell["kv_capacity_gb"]))
    return seen


def _target(slo: dict[str, Any], key: str, unit: str) -> str:
    value = slo.get(key)
    return "–" if value is None else f"≤ {value:,g} {unit}"


def _workload_lines(meta: dict[str, Any]) -> list[str]:
    wl = meta.get("workload", {})
    details = wl.get("details") or {}
    window = wl.get("duration_s")
    window_text = "whole trace" if window is None else f"{window:g} s"
    name = wl.get("name") or wl.get("trace")
    by_name = {s.get("name"): s for s in details.get("sources", [])}
    parts = []
    for src in wl.get("sources", []):
        how = by_name.get(src["name"])
        if how is None:
            parts.append(f"{src['name']} → `{src['slo']['name']}`")
            continue
        if how["arrivals"] == "trace":
            arrival = "recorded times" + (
                ", spread in their buckets" if how.get("spread") == "uniform" else ""
            )
        else:
            arrival = f"{how['arrivals']} at {how['rate_rps']:g} req/s" + (
                f", burstiness {how['burstiness']:g}" if how["arrivals"] == "gamma" else ""
            )
        parts.append(
            f"{src['name']} ({how['format']} `{how['file']}`, {arrival}) → `{src['slo']['name']}`"
        )
    shaping = ""
    if wl.get("start_s"):
        shaping += f"; from trace second {wl['start_s']}"
    if (
        wl.get("length_scale", 1.0) != 1.0
        or wl.get("max_prompt_tokens")
        or wl.get("max_output_tokens")
    ):
        shaping += (
            f"; lengths × {wl.get('length_scale')}, capped at {wl.get('max_prompt_tokens')} "
            f"prompt / {wl.get('max_output_tokens')} output tokens"
        )
    lines = [
        f"- Workload: `{name}`; sources: {'; '.join(parts)}; {wl.get('n_requests')} requests; "
        f"rate scale {wl.get('rate_scale')}; window {window_text}{shaping}.",
    ]
    if details.get("description"):
        lines.append(f"- About the workload: {details['description']}")
    return lines


def _slo_table(meta: dict[str, Any]) -> list[str]:
    classes: dict[str, dict[str, Any]] = {}
    for src in meta.get("workload", {}).get("sources", []):
        classes.setdefault(src["slo"]["name"], src["slo"])
    if not classes:
        return []
    lines = [
        "| SLO class | TTFT target | TPOT target | deadline | priority |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, slo in classes.items():
        lines.append(
            f"| {name} | {_target(slo, 'ttft_ms', 'ms')} | {_target(slo, 'tpot_ms', 'ms')} "
            f"| {_target(slo, 'deadline_s', 's')} | {slo.get('priority', 0)} |"
        )
    return ["", *lines]


def _capacity_text(meta: dict[str, Any]) -> str:
    caps = _capacities(meta)
    return ", ".join(f"{e} {gb:.1f} GB" for e, gb in caps.items()) or "n/a"


def _engine_kind(engine: str) -> str:
    return next(iter(family_kinds([engine])))


def _cell_of_kind(meta: dict[str, Any], kind: str) -> dict[str, Any]:
    """The manifest cell (``<engine>/<policy>``) of the first engine of report ``kind``."""
    cells = meta.get("cells", {}).items()
    return next((c for k, c in cells if _engine_kind(k.split("/", 1)[0]) == kind), {})


def _engines_line(cfg: dict[str, Any], meta: dict[str, Any]) -> str:
    engines = cfg.get("engines", [])
    kinds = {e: _engine_kind(e) for e in engines}
    if not engines or "sim-gpu" in kinds.values():
        return (
            f"- Engines: {', '.join('`' + e + '`' for e in engines)}, "
            f"model `{cfg.get('model')}`, "
            f"GPU `{cfg.get('gpu')}`, TP {cfg.get('tp')} × {cfg.get('replicas')} replicas "
            f"= {cfg.get('tp', 0) * cfg.get('replicas', 0)} GPUs; "
            f"KV capacity per replica: {_capacity_text(meta)}."
        )
    real = _cell_of_kind(meta, "real-cpu")
    live = _cell_of_kind(meta, "live")
    server = _cell_of_kind(meta, "real-server").get("sglang", {})
    cores = meta.get("host", {}).get("cpu_count")
    text = {
        "real-cpu": "(the real transformers continuous-batching engine running "
        f"SmolLM2-135M-Instruct in fp32, one replica on a {cores}-core CPU host, "
        f"{real.get('torch_threads', '?')} torch thread(s))",
        "sim-cpu": "(its simulator profile, step time fitted on it)",
        "real-server": f"(the real SGLang server started per policy on {cores} CPU cores, "
        f"{'CPU recipe' if server.get('cpu_recipe') else 'GPU'}, replayed over HTTP; latencies "
        "measured at the client)",
        "live": f"(a live server at {live.get('url', '?')}, backend "
        f"`{live.get('backend', '?')}`, model `{live.get('model', '?')}`; latencies measured "
        "at the client, KV not observable)",
    }
    parts = [
        f"`{e}` {text[kind]}"
        for kind in ("real-cpu", "sim-cpu", "real-server", "live")
        for e in dict.fromkeys(engines)
        if kinds[e] == kind
    ]
    return f"- Engines: {'; '.join(parts)}; KV capacity: {_capacity_text(meta)}."


def _step_profile_lines(meta: dict[str, Any]) -> list[str]:
    rows = []
    for key, cell in meta.get("cells", {}).items():
        prof = cell.get("step_profile")
        if not prof or not prof.get("num_steps"):
            continue
        ph = prof["phases"]
        rows.append(
            f"| {key} | {prof['num_steps']} | {prof['step_time_s']:.1f} | "
            + " | ".join(
                f"{100 * ph[p]['share']:.1f}%"
                for p in ("schedule", "policy", "prepare", "forward", "finish")
            )
            + " |"
        )
    if not rows:
        return []
    return [
        "## Where the real engine's time went",
        "",
        "Share of all step time per phase (`steps.parquet` has every step): scheduling (views, "
        "policy, checks), of which the policy itself; input preparation; the model's forward "
        "pass; sampling and output handling.",
        "",
        "| engine/policy | steps | step time s | schedule | policy | prepare | forward | finish |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]


def _warning_lines(meta: dict[str, Any]) -> list[str]:
    """``## Warnings``: the run's ``warnings`` (a policy that ignores a field the workload sets,
    ``harness.bench.run_bench``), one bullet each; nothing when there are none."""
    warnings = meta.get("warnings") or []
    if not warnings:
        return []
    return ["", "## Warnings", "", *(f"- {w}." for w in warnings)]


def render_markdown(summary: pd.DataFrame, meta: dict[str, Any], plots: Sequence[str] = ()) -> str:
    """The ``report.md`` of a run: setup, SLO classes, the summary table, then the plots.

    Args:
        summary: ``summary.csv`` rows.
        meta: the manifest.
        plots: PNG file names (in the run directory) to show, keys of :data:`PLOT_FILES`.
    """
    cfg = meta.get("config", {})
    lines = [
        "# superinfer benchmark",
        "",
        "## Setup",
        "",
        *_workload_lines(meta),
        _engines_line(cfg, meta),
        f"- Policies: {', '.join('`' + p + '`' for p in cfg.get('policies', []))}; "
        f"seed {meta.get('seed')}; git `{meta.get('git_sha')}`.",
        *_slo_table(meta),
        *_warning_lines(meta),
        "",
        *stack_lines(meta),
        "## Results",
        "",
        "One row per engine × policy × SLO class (`all` = every request). Latencies are over "
        "finished requests; attainment counts rejected and failed requests as misses. "
        "Every column is defined in `docs/metrics.md`; `metrics.csv` has the same numbers in "
        "long format.",
        "",
        _table(summary),
        "",
        *feasibility_lines(meta),
        *_step_profile_lines(meta),
    ]
    if plots:
        lines += ["## Plots", ""]
        for name in plots:
            lines += [f"![{name}]({name})", "", PLOT_FILES.get(name, ""), ""]
    return "\n".join(lines)


# -- run directories --------------------------------------------------------------------------


_KEY_COLUMNS = ("engine", "policy", "slo_class")


def _numbers_as_floats(summary: pd.DataFrame) -> pd.DataFrame:
    """CSV drops the fraction of whole numbers; read every number back as a float."""
    out = summary.copy()
    numeric = [c for c in out.columns if c not in _KEY_COLUMNS]
    out[numeric] = out[numeric].astype(float)
    return out


def as_written(summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` with its numbers rounded as ``summary.csv`` stores them.

    Reports render this, so ``report.md``, the terminal table and a report rebuilt later from
    ``summary.csv`` show the same digits (rounding the full-precision numbers for display
    could differ from rounding the stored ones in the last digit).
    """
    text = summary.to_csv(index=False, float_format=CSV_FLOAT_FORMAT)
    return _numbers_as_floats(pd.read_csv(io.StringIO(text)))


@dataclass(frozen=True)
class RunData:
    """The tables of one run directory.

    Attributes:
        path: the directory.
        summary: ``summary.csv``.
        requests: ``requests.parquet``.
        timeline: ``timeline.parquet``, or ``None`` when the run has none.
        meta: ``manifest.json``.
        sweep: ``sweep.csv`` (columns :data:`SWEEP_COLUMNS`), or ``None``.
    """

    path: Path
    summary: pd.DataFrame
    requests: pd.DataFrame
    timeline: pd.DataFrame | None
    meta: dict[str, Any]
    sweep: pd.DataFrame | None = None


def load_run(path: Path) -> RunData:
    """Read the run directory ``path`` (as ``superinfer bench`` writes it).

    Raises:
        UserError: not a directory, or ``summary.csv``, ``requests.parquet`` or
            ``manifest.json`` missing or unreadable.
    """
    if not path.is_dir():
        raise UserError(f"{path}: not a run directory")
    name = "summary.csv"
    try:  # each file named in its error
        summary = pd.read_csv(path / name)
        requests = pd.read_parquet(path / (name := "requests.parquet"))
        meta = json.loads((path / (name := "manifest.json")).read_text(encoding="utf-8"))
        name = "timeline.parquet"
        timeline = pd.read_parquet(path / name) if (path / name).is_file() else None
    except (OSError, ValueError) as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path / name}: not a complete run directory ({why})") from None
    missing = [c for c in SUMMARY_COLUMNS if c not in summary]
    if missing:
        raise UserError(f"{path / 'summary.csv'}:1: field {missing[0]!r}: missing column")
    if summary.empty:
        raise UserError(f"{path / 'summary.csv'}: no rows (a run writes one per policy and class)")
    try:
        summary = _numbers_as_floats(summary)
    except ValueError as exc:
        raise UserError(f"{path / 'summary.csv'}: a non-numeric value ({exc})") from None
    sweep = load_sweep(path / "sweep.csv") if (path / "sweep.csv").is_file() else None
    return RunData(path, summary, requests, timeline, meta, sweep)


def write_plots(
    out_dir: Path,
    summary: pd.DataFrame,
    requests: pd.DataFrame,
    timeline: pd.DataFrame | None,
    meta: dict[str, Any],
    sweep: pd.DataFrame | None = None,
) -> list[str]:
    """Draw a run's plots into ``out_dir``; returns the file names written, in report order.

    The frames may hold several runs when their ``engine``/``policy`` are distinct or they
    already carry a ``series`` column (as :func:`compare_runs` makes).
    """

    def label(frame: pd.DataFrame) -> pd.DataFrame:
        return frame if "series" in frame else add_series(frame)

    requests, summary = label(requests), label(summary)
    written = [
        latency_cdf(
            requests, "ttft_ms", out_dir / "ttft_cdf.png", target="slo_ttft_ms", label="TTFT"
        ),
        latency_cdf(
            requests,
            "e2e_ms",
            out_dir / "e2e_cdf.png",
            target="slo_deadline_s",
            label="End-to-end latency",
        ),
        attainment_bars(summary, out_dir / "attainment.png"),
    ]
    if timeline is not None and not timeline.empty:
        timeline = label(timeline)
        caps = _capacities(meta)
        written.append(timeline_plot(timeline, out_dir / "kv_hbm.png", kind="kv", capacity_gb=caps))
        written.append(timeline_plot(timeline, out_dir / "queue.png", kind="queue"))
    if sweep is not None and not sweep.empty:
        written.append(sweep_plot(add_series(sweep), out_dir / "sweep.png"))
    return [p.name for p in written]


def rebuild_report(
    run_dir: Path, *, out_dir: Path | None = None, sweep: Path | None = None
) -> Path:
    """Redraw one run's plots and rewrite its ``report.md`` and ``metrics.csv``.

    Args:
        run_dir: the run directory.
        out_dir: where to write (default: ``run_dir`` itself).
        sweep: a load-sweep CSV to plot (default: ``run_dir/sweep.csv`` when present).

    Returns:
        The ``report.md`` written.

    A directory that holds only a ``sweep.csv`` (a load sweep's output) gets a report of the
    sweep alone: its plot and its table.

    Raises:
        UserError: an incomplete run directory or an unreadable sweep file.
    """
    if not (run_dir / "summary.csv").is_file() and (sweep or run_dir / "sweep.csv").is_file():
        return _sweep_report(run_dir, out_dir or run_dir, sweep or run_dir / "sweep.csv")
    run = load_run(run_dir)
    out = out_dir or run_dir
    sweep_frame = load_sweep(sweep) if sweep is not None else run.sweep
    plots = write_plots(out, run.summary, run.requests, run.timeline, run.meta, sweep_frame)
    metrics = metrics_long(run.summary, run.requests)
    write_atomic(
        out / "metrics.csv",
        lambda p: metrics.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT),
    )
    report = out / "report.md"
    text = render_markdown(run.summary, run.meta, plots)
    write_atomic(report, lambda p: _write_text(p, text))
    return report


def _sweep_report(run_dir: Path, out: Path, sweep_path: Path) -> Path:
    sweep = load_sweep(sweep_path)
    plot = sweep_plot(add_series(sweep), out / "sweep.png")
    table = sweep.sort_values(["engine", "policy", "slo_class", "rate_scale"])
    lines = [
        "# superinfer load sweep",
        "",
        f"From `{sweep_path}`: SLO attainment per engine × policy × SLO class as the arrival "
        "rate is scaled (1 = the workload's own rate).",
        "",
        f"![{plot.name}]({plot.name})",
        "",
        PLOT_FILES["sweep.png"],
        "",
        "| engine | policy | class | rate scale | SLO attain. |",
        "|---|---|---|---:|---:|",
    ]
    for _, row in table.iterrows():
        attained = format_value(float(row["slo_attainment"]), "slo_attainment")
        lines.append(
            f"| {row['engine']} | {row['policy']} | {row['slo_class']} | "
            f"{row['rate_scale']:g} | {attained} |"
        )
    report = out / "report.md"
    text = "\n".join([*lines, ""])
    write_atomic(report, lambda p: _write_text(p, text))
    return report


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _run_labels(paths: Sequence[Path]) -> list[str]:
    names = [p.resolve().name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [f"{i + 1}:{n}" for i, n in enumerate(names)]


def compare_runs(run_dirs: Sequence[Path], out_dir: Path, *, sweep: Path | None = None) -> Path:
    """Compare several runs: one table with a ``run`` column, and every plot with one line or bar
    per run × engine × policy, written to ``out_dir`` (``report.md``, ``summary.csv``,
    ``metrics.csv``, PNGs).

    Returns:
        The ``report.md`` written.

    Raises:
        UserError: fewer than two runs, or an incomplete run directory.
    """
    if len(run_dirs) < 2:
        raise UserError("compare needs at least two run directories")
    runs = [load_run(p) for p in run_dirs]
    labels = _run_labels(run_dirs)
    summaries, requests, timelines, metrics = [], [], [], []
    caps: dict[str, Any] = {"cells": {}}
    for label, run in zip(labels, runs, strict=True):
        summaries.append(add_series(run.summary, label).assign(run=label))
        requests.append(add_series(run.requests, label).assign(run=label))
        metrics.append(metrics_long(run.summary, run.requests).assign(run=label))
        if run.timeline is not None and not run.timeline.empty:
            timelines.append(add_series(run.timeline, label))
        for key, cell in run.meta.get("cells", {}).items():
            caps["cells"].setdefault(key, cell)
    summary = pd.concat(summaries, ignore_index=True)
    sweep_frame = load_sweep(sweep) if sweep is not None else None
    plots = write_plots(
        out_dir,
        summary,
        pd.concat(requests, ignore_index=True),
        pd.concat(timelines, ignore_index=True) if timelines else None,
        caps,
        sweep_frame,
    )
    table = summary[["run", *SUMMARY_COLUMNS]]
    write_atomic(
        out_dir / "summary.csv",
        lambda p: table.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT),
    )
    long = pd.concat(metrics, ignore_index=True)[["run", *METRIC_COLUMNS]]
    write_atomic(
        out_dir / "metrics.csv",
        lambda p: long.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT),
    )
    lines = ["# superinfer comparison", "", "## Runs", ""]
    lines += [
        "| run | directory | workload | requests | engines | cluster | git |",
        "|---|---|---|---:|---|---|---|",
    ]
    for label, run, path in zip(labels, runs, run_dirs, strict=True):
        cfg, wl = run.meta.get("config", {}), run.meta.get("workload", {})
        cluster = (
            f"{cfg.get('model')} on {cfg.get('gpu')}, TP {cfg.get('tp')} × {cfg.get('replicas')}"
        )
        live = _cell_of_kind(run.meta, "live")
        if cfg.get("engines") and family_kinds(cfg["engines"]) == {"live"} and live:
            cluster = f"live server `{live.get('model')}` at {live.get('url')}"
        name = wl.get("name") or wl.get("trace")
        engines = ", ".join(cfg.get("engines", []))
        sha = str(run.meta.get("git_sha"))[:12]
        lines.append(
            f"| {label} | `{path}` | `{name}` | {wl.get('n_requests')} | {engines} | {cluster} "
            f"| `{sha}` |"
        )
    lines += [
        "",
        "## Results",
        "",
        "One row per run × engine × policy × SLO class; columns as in `docs/metrics.md`.",
        "",
        _table(table, extra=("run",)),
        "",
        "## Plots",
        "",
    ]
    for name in plots:
        lines += [f"![{name}]({name})", "", PLOT_FILES.get(name, ""), ""]
    report = out_dir / "report.md"
    text = "\n".join(lines)
    write_atomic(report, lambda p: _write_text(p, text))
    return report
