"""Human-readable reports of a run: a Markdown report and the terminal table."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

__all__ = ["TABLE_COLUMNS", "format_value", "render_markdown"]

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
    "goodput_rps": "goodput req/s",
    "output_tok_s": "output tok/s",
    "kv_peak_gb": "KV peak GB",
    "preemptions": "preempt.",
}


def format_value(value: Any, column: str) -> str:
    """Render one table cell: counts as integers, attainment to 3 places, the rest to 4 digits."""
    if isinstance(value, float) and math.isnan(value):
        return "–"
    if column.startswith("n_") or column == "preemptions":
        return f"{int(value)}"
    if column == "slo_attainment":
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def _table(summary: pd.DataFrame) -> str:
    cols = [c for c in TABLE_COLUMNS if c in summary]
    lines = [
        "| " + " | ".join(TABLE_COLUMNS[c] for c in cols) + " |",
        "|"
        + "|".join("---" if c in ("engine", "policy", "slo_class") else "---:" for c in cols)
        + "|",
    ]
    for _, row in summary.iterrows():
        lines.append("| " + " | ".join(format_value(row[c], c) for c in cols) + " |")
    return "\n".join(lines)


def _capacities(meta: dict[str, Any]) -> str:
    seen: dict[str, float] = {}
    for key, cell in meta.get("cells", {}).items():
        if "kv_capacity_gb" in cell:
            seen.setdefault(key.split("/")[0], cell["kv_capacity_gb"])
    return ", ".join(f"{engine} {gb:.1f} GB" for engine, gb in seen.items()) or "n/a"


#: Engines that are not simulated GPUs: the real CPU engine and its simulator profile.
_CPU_ENGINES = ("hf", "sim:hf-cpu")


def _engines_line(cfg: dict[str, Any], meta: dict[str, Any]) -> str:
    engines = cfg.get("engines", [])
    if not engines or not all(e in _CPU_ENGINES for e in engines):
        return (
            f"- Engines: {', '.join('`' + e + '`' for e in engines)}, "
            f"model `{cfg.get('model')}`, "
            f"GPU `{cfg.get('gpu')}`, TP {cfg.get('tp')} × {cfg.get('replicas')} replicas "
            f"= {cfg.get('tp', 0) * cfg.get('replicas', 0)} GPUs; "
            f"KV capacity per replica: {_capacities(meta)}."
        )
    cells = meta.get("cells", {}).items()
    real: dict[str, Any] = next((c for k, c in cells if k.startswith("hf/")), {})
    parts = []
    if "hf" in engines:
        cores = meta.get("host", {}).get("cpu_count")
        parts.append(
            "`hf` (the real transformers continuous-batching engine running "
            f"SmolLM2-135M-Instruct in fp32, one replica on a {cores}-core CPU host, "
            f"{real.get('torch_threads', '?')} torch thread(s))"
        )
    if "sim:hf-cpu" in engines:
        parts.append("`sim:hf-cpu` (its simulator profile, step time fitted on it)")
    return f"- Engines: {'; '.join(parts)}; KV capacity: {_capacities(meta)}."


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


def render_markdown(summary: pd.DataFrame, meta: dict[str, Any]) -> str:
    """The ``report.md`` of a run: setup, then the summary table."""
    cfg = meta.get("config", {})
    wl = meta.get("workload", {})
    sources = ", ".join(f"{s['name']} → `{s['slo']['name']}`" for s in wl.get("sources", []))
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
        "# superinfer benchmark",
        "",
        "## Setup",
        "",
        f"- Workload: trace `{wl.get('trace')}` ({sources}); {wl.get('n_requests')} requests; "
        f"rate scale {wl.get('rate_scale')}; window "
        f"{'whole trace' if wl.get('duration_s') is None else str(wl.get('duration_s')) + ' s'}"
        f"{shaping}.",
        _engines_line(cfg, meta),
        f"- Policies: {', '.join('`' + p + '`' for p in cfg.get('policies', []))}; "
        f"seed {meta.get('seed')}; git `{meta.get('git_sha')}`.",
        "",
        "## Results",
        "",
        "One row per engine × policy × SLO class (`all` = every request). Latencies are over "
        "finished requests; attainment counts rejected and failed requests as misses. "
        "Every column is defined in `docs/metrics.md`.",
        "",
        _table(summary),
        "",
        *_step_profile_lines(meta),
    ]
    return "\n".join(lines)
