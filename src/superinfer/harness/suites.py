"""Benchmark suites: fixed experiments with their own result directories.

``headline`` (``superinfer bench --suite headline``) runs every policy on every engine over a
load sweep and writes ``results/headline/``:

* ``summary.csv``: the run schema (:data:`SUMMARY_COLUMNS`) at the headline load, one row per
  engine x policy x SLO class (and ``all``), plus ``native`` (true on each engine's native
  policy's rows) and ``rate_scale``;
* ``sweep.csv``: ``rate_scale, engine, policy, slo_class, slo_attainment`` at every load;
* ``starvation.csv``: per load, engine and policy, the longest wait of any batch request
  (``max_batch_wait_s``: arrival to first token, or to the end of the run for one that never got
  it) and how many batch requests did not finish;
* ``sweep.png`` and ``starvation.png``; ``report.md`` (setup, the table, the targets checked
  against each engine's native policy, both figures); ``manifest.json``.

``rotation`` (``--suite rotation``) compares ``superinfer`` with rotation through HBM on and off
on a workload whose live KV exceeds HBM; it needs an engine with a CPU KV tier.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.bench import (
    HEADLINE_POLICIES,
    HEADLINE_RATE_SCALE,
    ROTATION_DEFAULTS,
    BenchConfig,
    build_bench_workload,
    run_bench,
)
from superinfer.harness.errors import UserError
from superinfer.harness.grid.processes import run_in_processes
from superinfer.harness.policies import native_policy
from superinfer.harness.report.markdown import format_value
from superinfer.harness.report.metrics import SUMMARY_COLUMNS
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, manifest, staged_dir, write_atomic
from superinfer.harness.suites_engines import run_engines_suite
from superinfer.harness.suites_seed import run_seed_suite

__all__ = [
    "HEADLINE_POLICIES",
    "HEADLINE_RATE_SCALE",
    "ROTATION_DEFAULTS",
    "SWEEP_RATE_SCALES",
    "HeadlineResult",
    "native_policy",
    "run_headline",
    "run_suite",
    "write_headline",
]

#: Loads of the sweep (arrival-rate multipliers of the trace); the headline load is one of them.
SWEEP_RATE_SCALES = (0.3, 0.6, 0.8, 1.0, 1.3, 1.6)

SWEEP_COLUMNS = ("rate_scale", "engine", "policy", "slo_class", "slo_attainment")
STARVATION_COLUMNS = (
    "rate_scale",
    "engine",
    "policy",
    "max_batch_wait_s",
    "n_batch",
    "n_batch_unfinished",
)


@dataclass(frozen=True)
class HeadlineResult:
    """What :func:`run_headline` measured.

    Attributes:
        summary: ``summary.csv`` rows (headline load).
        sweep: ``sweep.csv`` rows.
        starvation: ``starvation.csv`` rows.
        info: facts for the manifest and report.
    """

    summary: pd.DataFrame
    sweep: pd.DataFrame
    starvation: pd.DataFrame
    info: dict[str, Any]


def _batch_waits(requests: pd.DataFrame, rate: float) -> list[dict[str, object]]:
    """Per engine x policy: the longest wait of a batch request (arrival to first token)."""
    rows = []
    for (engine, policy), part in requests.groupby(["engine", "policy"], sort=False):
        batch = part[part["slo_class"] == "batch"]
        end = float(part["finish_s"].max()) if part["finish_s"].notna().any() else math.nan
        first = batch["first_token_s"].fillna(end)  # never served: waited to the end of the run
        wait = (first - batch["arrival_s"]).max() if len(batch) else math.nan
        rows.append(
            {
                "rate_scale": rate,
                "engine": engine,
                "policy": policy,
                "max_batch_wait_s": float(wait),
                "n_batch": len(batch),
                "n_batch_unfinished": int((batch["status"] != "finished").sum()),
            }
        )
    return rows


def _prefixed(progress: Callable[[str], None] | None, rate: float) -> Callable[[str], None] | None:
    if progress is None:
        return None
    report = progress

    def tell(msg: str) -> None:
        report(f"rate x{rate:g}: {msg}")

    return tell


def _run_one(cfg: BenchConfig) -> tuple[pd.DataFrame, list[dict[str, object]], dict[str, Any]]:
    """One load x engine of the headline suite: its summary, batch waits and run info (a
    module-level function so a process pool can run it)."""
    result = run_bench(cfg, workload=build_bench_workload(cfg))
    return result.summary, _batch_waits(result.requests, cfg.rate_scale), result.info


def run_headline(
    config: BenchConfig,
    *,
    rate_scales: Sequence[float] = SWEEP_RATE_SCALES,
    progress: Callable[[str], None] | None = None,
    workers: int = 1,
) -> HeadlineResult:
    """Run every policy of ``config`` on every engine at each load of ``rate_scales`` (and at
    ``config.rate_scale``, the headline load).

    Each load x engine is an independent run; ``workers`` > 1 runs them in that many
    processes. Every run is deterministic, so the tables do not depend on ``workers``.

    Raises:
        UserError: a non-positive rate scale or worker count, or anything :func:`run_bench`
            refuses.
        BaseException: a run's error (or the SystemExit of SIGTERM, or Ctrl-C), with
            ``workers`` > 1 once the other runs in progress end; the runs not yet started are
            dropped (:func:`~superinfer.harness.grid.processes.run_in_processes`).
    """
    rates = sorted({*rate_scales, config.rate_scale})
    if any(not r > 0 for r in rates):
        raise UserError(f"--rate-scales must all be > 0, got {rates}")
    if workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    jobs = [
        replace(config, rate_scale=rate, engines=(engine,))
        for rate in rates
        for engine in config.engines
    ]
    if workers == 1:
        done = []
        for cfg in jobs:
            if progress:
                progress(f"rate x{cfg.rate_scale:g}: {cfg.engines[0]}")
            done.append(_run_one(cfg))
    else:
        done = run_in_processes(_run_one, jobs, workers, progress)
    summaries, sweep, starvation = [], [], []
    infos: dict[str, Any] = {}
    for cfg, (table, waits, info) in zip(jobs, done, strict=True):
        rate = cfg.rate_scale
        for _, row in table.iterrows():
            sweep.append({"rate_scale": rate, **{c: row[c] for c in SWEEP_COLUMNS[1:]}})
        starvation.extend(waits)
        run = infos.setdefault(f"x{rate:g}", {"cells": {}, "workload": info["workload"]})
        run["cells"].update(info["cells"])
        if rate == config.rate_scale:
            headline = table.copy()
            headline["native"] = [
                native_policy(str(e)) == str(p)
                for e, p in zip(headline["engine"], headline["policy"], strict=True)
            ]
            headline["rate_scale"] = rate
            summaries.append(headline)
            merged = infos.setdefault("headline", {**info, "cells": {}})
            merged["cells"].update(info["cells"])
    head = infos.pop("headline")
    head["config"] = {**head["config"], "engines": list(config.engines)}
    info = {
        **head,
        "suite": "headline",
        "rate_scales": rates,
        "headline_rate_scale": config.rate_scale,
        "runs": infos,
    }
    return HeadlineResult(
        pd.concat(summaries, ignore_index=True),
        pd.DataFrame(sweep, columns=list(SWEEP_COLUMNS)),
        pd.DataFrame(starvation, columns=list(STARVATION_COLUMNS)),
        info,
    )


# -- report ---------------------------------------------------------------------------------------


def _row(summary: pd.DataFrame, engine: str, policy: str, cls: str) -> pd.Series | None:
    rows = summary[
        (summary.engine == engine) & (summary.policy == policy) & (summary.slo_class == cls)
    ]
    return None if rows.empty else rows.iloc[0]


def _targets(summary: pd.DataFrame) -> list[str]:
    """The issue's targets for ``superinfer`` on each engine, checked with measured numbers."""
    lines = []
    for engine in summary.engine.unique():
        native = native_policy(str(engine))
        si_chat = _row(summary, engine, "superinfer", "chat")
        si_batch = _row(summary, engine, "superinfer", "batch")
        if native is None or si_chat is None or si_batch is None:
            continue
        nat_chat = _row(summary, engine, native, "chat")
        nat_batch = _row(summary, engine, native, "batch")
        lines.append(f"**{engine}** (native policy `{native}`):")
        lines.append("")
        checks: list[tuple[str, str, bool]] = []
        if nat_chat is not None and nat_batch is not None:
            ratio = si_chat.ttft_p99_ms / nat_chat.ttft_p99_ms
            checks.append(
                (
                    "chat `ttft_p99_ms` ≤ 0.5 × native",
                    f"{si_chat.ttft_p99_ms:,.0f} vs {nat_chat.ttft_p99_ms:,.0f} ms = {ratio:.2f}×",
                    ratio <= 0.5,
                )
            )
            ratio = si_batch.output_tok_s / nat_batch.output_tok_s
            checks.append(
                (
                    "batch `output_tok_s` ≥ 0.99 × native",
                    f"{si_batch.output_tok_s:,.1f} vs {nat_batch.output_tok_s:,.1f} = {ratio:.4f}×",
                    ratio >= 0.99,
                )
            )
        checks.append(
            (
                "chat `slo_attainment` ≥ 0.98",
                f"{si_chat.slo_attainment:.3f}",
                si_chat.slo_attainment >= 0.98,
            )
        )
        for rival in ("priority", "edf", "mlfq"):
            other = _row(summary, engine, rival, "chat")
            if other is not None:
                checks.append(
                    (
                        f"chat attainment above `{rival}`",
                        f"{si_chat.slo_attainment:.3f} vs {other.slo_attainment:.3f}",
                        si_chat.slo_attainment > other.slo_attainment,
                    )
                )
        oracle = _row(summary, engine, "oracle", "chat")
        if oracle is not None:
            gap = oracle.slo_attainment - si_chat.slo_attainment
            checks.append(
                (
                    "chat attainment within 0.02 of `oracle`",
                    f"{si_chat.slo_attainment:.3f} vs {oracle.slo_attainment:.3f} (gap {gap:+.3f})",
                    gap <= 0.02,
                )
            )
        lines.append("| target | measured | met |")
        lines.append("|---|---|:---:|")
        for name, measured, ok in checks:
            lines.append(f"| {name} | {measured} | {'yes' if ok else '**no**'} |")
        lines.append("")
    return lines


def _markdown_table(frame: pd.DataFrame, columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for _, row in frame.iterrows():
        cells = []
        for c in columns:
            value = row[c]
            if isinstance(value, float):
                cells.append(format_value(value, c))
            else:
                cells.append(str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_headline_report(result: HeadlineResult, meta: dict[str, Any]) -> str:
    """``results/headline/report.md``."""
    cfg = meta.get("config", {})
    wl = meta.get("workload", {})
    gpus = cfg.get("tp", 0) * cfg.get("replicas", 0)
    summary = result.summary
    cols = [
        "engine",
        "policy",
        "slo_class",
        "n_requests",
        "n_rejected",
        "ttft_p99_ms",
        "tpot_p99_ms",
        "slo_attainment",
        "goodput_rps",
        "output_tok_s",
        "preemptions",
        "native",
    ]
    sweep_chat = result.sweep[result.sweep.slo_class == "chat"].pivot_table(
        index=["engine", "policy"], columns="rate_scale", values="slo_attainment"
    )
    sweep_lines = [
        "| engine | policy | " + " | ".join(f"×{r:g}" for r in sweep_chat.columns) + " |"
    ]
    sweep_lines.append("|---|---|" + "|".join("---:" for _ in sweep_chat.columns) + "|")
    for (engine, policy), row in sweep_chat.iterrows():
        cells = " | ".join(f"{v:.3f}" for v in row.to_numpy())
        sweep_lines.append(f"| {engine} | {policy} | {cells} |")
    starve = result.starvation.pivot_table(
        index=["engine", "policy"], columns="rate_scale", values="max_batch_wait_s"
    )
    starve_lines = ["| engine | policy | " + " | ".join(f"×{r:g}" for r in starve.columns) + " |"]
    starve_lines.append("|---|---|" + "|".join("---:" for _ in starve.columns) + "|")
    for (engine, policy), row in starve.iterrows():
        cells = " | ".join(f"{v:,.1f}" for v in row.to_numpy())
        starve_lines.append(f"| {engine} | {policy} | {cells} |")
    sources = ", ".join(f"{s['name']} → `{s['slo']['name']}`" for s in wl.get("sources", []))
    lines = [
        "# superinfer headline benchmark",
        "",
        "## Setup",
        "",
        f"- Hardware (simulated): `{cfg.get('gpu')}`, {cfg.get('replicas')} replica(s) × TP "
        f"{cfg.get('tp')} = **{gpus} GPUs**; model `{cfg.get('model')}`; engines "
        f"{', '.join('`' + e + '`' for e in cfg.get('engines', []))} (discrete-event simulator "
        "with a roofline step-time model; round-robin routing).",
        f"- Trace: `{wl.get('trace')}` ({sources}); "
        f"{'whole trace (one hour)' if wl.get('duration_s') is None else str(wl.get('duration_s')) + ' s window'}; "  # noqa: E501
        f"{wl.get('n_requests')} requests at the headline load.",
        f"- Load: headline at **×{meta.get('headline_rate_scale')}** the trace's arrival rate; "
        f"sweep at ×{', ×'.join(f'{r:g}' for r in meta.get('rate_scales', []))}.",
        "- SLOs: chat TTFT ≤ 1 s and TPOT ≤ 100 ms; batch done within 600 s of arrival.",
        f"- Policies: {', '.join('`' + p + '`' for p in cfg.get('policies', []))}; "
        f"seed {meta.get('seed')}; git `{meta.get('git_sha')}`. `oracle` knows every true "
        "output length (a clairvoyant reference, not deployable; not a bound on every schedule).",
        "",
        "## Headline table",
        "",
        "Every column is defined in `docs/metrics.md`; `native` marks each engine's own policy.",
        "",
        _markdown_table(summary, cols),
        "",
        "## Targets (superinfer vs each engine's native policy)",
        "",
        *_targets(summary),
        "## Load sweep: chat SLO attainment",
        "",
        "![sweep](sweep.png)",
        "",
        *sweep_lines,
        "",
        "## Starvation: longest wait of any batch request (arrival to first token, s)",
        "",
        "![starvation](starvation.png)",
        "",
        *starve_lines,
        "",
    ]
    return "\n".join(lines)


def _plot(result: HeadlineResult, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = list(dict.fromkeys(result.sweep.engine))
    for name, frame, value, ylabel in (
        ("sweep.png", result.sweep, "slo_attainment", "SLO attainment"),
        ("starvation.png", result.starvation, "max_batch_wait_s", "longest batch wait (s)"),
    ):
        classes = ["chat", "batch"] if name == "sweep.png" else [None]
        fig, axes = plt.subplots(
            len(classes),
            len(engines),
            figsize=(5 * len(engines), 3.6 * len(classes)),
            squeeze=False,
            sharex=True,
        )
        for i, cls in enumerate(classes):
            for j, engine in enumerate(engines):
                ax = axes[i][j]
                part = frame[frame.engine == engine]
                if cls is not None:
                    part = part[part.slo_class == cls]
                for policy, rows in part.groupby("policy", sort=False):
                    rows = rows.sort_values("rate_scale")
                    style = "-" if policy == "superinfer" else "--"
                    ax.plot(rows.rate_scale, rows[value], style, marker="o", label=policy)
                ax.set_title(f"{engine}" + (f" — {cls}" if cls else ""))
                ax.set_xlabel("arrival-rate scale (× trace)")
                ax.set_ylabel(ylabel)
                ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize="small")
        fig.tight_layout()

        def save(path: Path, fig: Any = fig) -> None:
            fig.savefig(path, dpi=110, format="png")

        write_atomic(out_dir / name, save)
        plt.close(fig)


def write_headline(out_dir: Path, result: HeadlineResult, *, command: list[str] | None) -> None:
    """Write ``results/headline/`` (each file atomically)."""
    import json

    meta = manifest(result.info, command=command)
    summary = result.summary[
        [*SUMMARY_COLUMNS, *[c for c in result.summary if c not in SUMMARY_COLUMNS]]
    ]
    for name, frame in (
        ("summary.csv", summary),
        ("sweep.csv", result.sweep),
        ("starvation.csv", result.starvation),
    ):
        write_csv(out_dir / name, frame)
    write_text(out_dir / "manifest.json", json.dumps(meta, indent=2, default=str) + "\n")
    _plot(result, out_dir)
    write_text(out_dir / "report.md", render_headline_report(result, meta))


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    """Write ``frame`` to ``path`` atomically, in the results' float format."""

    def write(tmp: Path) -> None:
        frame.to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT)

    write_atomic(path, write)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""

    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    write_atomic(path, write)


def headline_config(config: BenchConfig) -> BenchConfig:
    """``config`` with the headline policies when none were chosen."""
    return config if config.policies else replace(config, policies=HEADLINE_POLICIES)


# -- rotation on / off --------------------------------------------------------------------------

ROTATION_COLUMNS = (
    "engine",
    "rotation",
    "chat_class",
    "chat_ttft_attainment",
    "chat_slo_attainment",
    "chat_tbt_p99_ms",
    "chat_tpot_p99_ms",
    "swap_out_bytes",
    "swap_in_bytes",
    "prefetch_bytes",
    "preemptions",
)


def _interactive_class(requests: pd.DataFrame) -> str:
    """The SLO class the rotation table reports: ``chat`` if the workload has it, else the
    first class with a TTFT target (Mooncake's ``long-chat``)."""
    classes = list(dict.fromkeys(requests["slo_class"]))
    if "chat" in classes:
        return "chat"
    with_ttft = requests[requests["slo_ttft_ms"].notna()]["slo_class"]
    if with_ttft.empty:
        raise UserError("--suite rotation needs a workload with a TTFT SLO class")
    return str(with_ttft.iloc[0])


def run_rotation(
    config: BenchConfig, *, progress: Callable[[str], None] | None = None
) -> pd.DataFrame:
    """``superinfer`` with rotation through HBM on and off, on ``config``'s workload.

    Meant for a workload whose live KV exceeds HBM (long chat prompts on few replicas). Bytes
    moved each way are what the policy decided (``SuperInferPolicy.stats``): KV blocks swapped
    out, resumed and prefetched, times the block size. ``chat_tbt_p99_ms`` is the 99th
    percentile over chat requests of each one's longest gap between two tokens.

    Raises:
        UserError: the engine showed the policy no CPU KV tier, so rotation cannot happen.
    """
    rows = []
    for engine in config.engines:
        for rotation in (True, False):
            opts = {**config.policy_options.get("superinfer", {}), "rotation": str(rotation)}
            cfg = replace(
                config,
                engines=(engine,),
                policies=("superinfer",),
                policy_options={"superinfer": opts},
            )
            if progress:
                progress(f"{engine}: rotation {'on' if rotation else 'off'}")
            result = run_bench(cfg)
            stats = result.info["cells"][f"{engine}/superinfer"].get("policy_stats", {})
            if not stats.get("saw_cpu_tier"):
                raise UserError(
                    f"--suite rotation needs an engine with a CPU KV tier; {engine} showed the "
                    "policy none (total_cpu_blocks == 0)"
                )
            req = result.requests
            cls = _interactive_class(req)
            chat = req[req.slo_class == cls]
            ttft_ok = (chat.status == "finished") & (chat.ttft_ms <= chat.slo_ttft_ms)
            row = result.summary
            chat_row = row[row.slo_class == cls].iloc[0]
            rows.append(
                {
                    "engine": engine,
                    "rotation": rotation,
                    "chat_class": cls,
                    "chat_ttft_attainment": float(ttft_ok.mean()) if len(chat) else math.nan,
                    "chat_slo_attainment": float(chat_row.slo_attainment),
                    "chat_tbt_p99_ms": float(chat.max_itl_ms.dropna().quantile(0.99)),
                    "chat_tpot_p99_ms": float(chat_row.tpot_p99_ms),
                    "swap_out_bytes": stats.get("swap_out_bytes", 0),
                    "swap_in_bytes": stats.get("swap_in_bytes", 0),
                    "prefetch_bytes": stats.get("prefetch_bytes", 0),
                    "preemptions": int(row[row.slo_class == "all"].iloc[0].preemptions),
                }
            )
    return pd.DataFrame(rows, columns=list(ROTATION_COLUMNS))


def run_suite(
    suite: str,
    config: BenchConfig,
    out_dir: Path,
    *,
    rate_scales: str | Sequence[float] | None = None,
    workers: int = 1,
    progress: Callable[[str], None] | None = None,
    command: list[str] | None = None,
) -> tuple[pd.DataFrame, str]:
    """Run ``bench --suite SUITE`` and write its directory.

    Args:
        suite: ``headline`` (a load sweep), ``rotation``, ``seed`` or ``engines``.
        config: the bench settings, suite defaults merged (``bench.bench_config``).
        out_dir: the directory to write (staged and renamed into place, ``results.staged_dir``).
        rate_scales: headline: the loads of the sweep, or ``--rate-scales`` text (comma-
            separated; empty or ``None``: :data:`SWEEP_RATE_SCALES`).
        workers: headline: processes running loads x engines in parallel.
        progress: called with a message as the suite advances.
        command: the command line recorded in the manifest.

    Returns:
        ``(table to print, the files written, as text)``; headline's is a summary (print it so).

    Raises:  UserError: ``rate_scales`` text that is not numbers; a bad suite option.
    """
    if suite in ("seed", "engines"):  # harness/suites_seed.py, harness/suites_engines.py
        run = run_seed_suite if suite == "seed" else run_engines_suite
        return run(config, out_dir, progress=progress, command=command)
    if suite == "headline":
        if isinstance(rate_scales, str):
            try:
                rate_scales = [float(r) for r in rate_scales.split(",") if r.strip()]
            except ValueError:
                raise UserError(
                    f"--rate-scales {rate_scales!r}: expected numbers like 0.5,1"
                ) from None
        rates = tuple(rate_scales or ()) or SWEEP_RATE_SCALES
        result = run_headline(config, rate_scales=rates, progress=progress, workers=workers)
        files = "summary.csv, sweep.csv, starvation.csv, sweep.png, starvation.png, report.md, "
        with staged_dir(out_dir, owned=(files + "manifest.json").split(", ")) as stage:
            write_headline(stage, result, command=command)
        return result.summary, files + "manifest.json"
    table = run_rotation(config, progress=progress)
    meta = manifest({"suite": "rotation", "config": asdict(config)}, command=command)
    with staged_dir(out_dir, owned=("summary.csv", "manifest.json")) as stage:
        write_csv(stage / "summary.csv", table)
        write_text(stage / "manifest.json", json.dumps(meta, indent=2, default=str) + "\n")
    return table, "summary.csv, manifest.json"
