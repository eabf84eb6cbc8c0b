"""``superinfer bench --suite seed``: the seed article's headline table from the whole stack.

The article claims, for the whole system against the engine's own scheduler: chat P99 latency
-40%, batch throughput -4%, peak KV-cache memory -33%, SLO attainment (chat, P99 < 1 s) 78% ->
96%. This suite runs, per engine, the engine's ``native`` policy with nothing else against
``superinfer`` with ``--stack full`` (rotation, the reuse predictor's placement, the KV
quantization planner: :func:`~superinfer.harness.bench.engine_stack`), on the same workload in
the same run, and writes ``results/seed/``:

* ``summary.csv``: ``engine, policy, stack, metric, value, seed_article_value``; per engine the
  four metrics of each side (:data:`METRICS`), then their ratios / difference
  (:data:`COMPARISONS`) beside the article's, then the four metrics of the clairvoyant
  reference (:data:`REFERENCE`: ``oracle`` with the same stack, no article value);
* ``report.md``: the table and what each row means; ``manifest.json``.

"Chat P99 latency" is the chat class's TTFT p99 (the latency its 1 s target bounds); batch
throughput the batch class's output tokens/s; peak KV ``kv_peak_gb`` of the ``all`` row; chat
attainment ``slo_attainment`` of the chat class (docs/metrics.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.bench import BenchConfig, build_bench_workload, run_bench
from superinfer.harness.policies import FALLBACK_POLICY, merge_policy_opts, native_policy
from superinfer.harness.report.markdown import format_value
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, manifest, staged_dir, write_atomic

__all__ = [
    "COMPARISONS",
    "METRICS",
    "REFERENCE",
    "SEED_COLUMNS",
    "SEED_ENGINES",
    "run_seed",
    "run_seed_suite",
    "write_seed",
]

#: The simulated engines the suite runs by default.
SEED_ENGINES = ("sim:vllm", "sim:sglang", "sim:trtllm")
#: Columns of ``results/seed/summary.csv``.
SEED_COLUMNS = ("engine", "policy", "stack", "metric", "value", "seed_article_value")
#: metric -> (summary class, summary column, the article's native value, its stack value).
METRICS: dict[str, tuple[str, str, float | None, float | None]] = {
    "chat_ttft_p99_ms": ("chat", "ttft_p99_ms", None, None),
    "batch_output_tok_s": ("batch", "output_tok_s", None, None),
    "kv_peak_gb": ("all", "kv_peak_gb", None, None),
    "chat_slo_attainment": ("chat", "slo_attainment", 0.78, 0.96),
}
#: The reference run beside the two sides: ``(policy, stack)``. ``oracle`` is ``superinfer``
#: knowing every request's true output length (``policy_core.policies.oracle``), with the same
#: stack: what better length prediction could add to the whole stack on this workload, not a
#: bound on every scheduler (issue 18 asks for the oracle's attainment beside the policy's).
REFERENCE = ("oracle", "full")
#: comparison -> (metric, "ratio" (stack / native) or "points" (stack - native, x100), the
#: article's value, what the issue's target is).
COMPARISONS: dict[str, tuple[str, str, float, str]] = {
    "chat_p99_latency_ratio": ("chat_ttft_p99_ms", "ratio", 0.60, "<= 0.6"),
    "batch_throughput_ratio": ("batch_output_tok_s", "ratio", 0.96, ">= 0.96 (aim 0.99)"),
    "peak_kv_ratio": ("kv_peak_gb", "ratio", 0.67, "<= 0.67"),
    "chat_attainment_points": ("chat_slo_attainment", "points", 18.0, ">= +18"),
}


def _value(summary: pd.DataFrame, cls: str, column: str) -> float:
    row = summary[summary["slo_class"] == cls]
    return float(row[column].iloc[0]) if len(row) else float("nan")


def run_seed(
    config: BenchConfig, *, progress: Callable[[str], None] | None = None
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per engine of ``config``: ``native`` alone, then ``superinfer --stack full``, then the
    clairvoyant reference (:data:`REFERENCE`).

    ``--policy-opt`` strings (``config.policy_opts``) are options of the stack side's policies:
    ``superinfer.key=value`` sets one on ``superinfer`` only, ``key=value`` on ``superinfer``
    and the reference (the same scheduler); the native side runs its defaults.

    Returns:
        ``(summary.csv table, manifest info)``; the info keeps each side's bench info.

    Raises:
        UserError: a ``--policy-opt`` string that names another policy or an unknown option.
    """
    if config.policy_opts:
        stack_side = ("superinfer", REFERENCE[0])
        merged = merge_policy_opts(config.policy_options, stack_side, config.policy_opts)
        config = replace(config, policy_opts=(), policy_options={**config.policy_options, **merged})
    wl = build_bench_workload(config)
    rows: list[dict[str, Any]] = []
    info: dict[str, Any] = {"suite": "seed", "config": asdict(config), "runs": {}}
    for engine in config.engines:
        sides = {}
        native = native_policy(engine) or FALLBACK_POLICY
        for policy, stack in ((native, "none"), ("superinfer", "full"), REFERENCE):
            if progress:
                progress(f"{engine}: {policy} (stack {stack})")
            cfg = replace(
                config, engines=(engine,), policies=(policy,), stack=stack,
                kv_policy=None, kv_quant=False,
            )  # fmt: skip
            result = run_bench(cfg, workload=wl)
            side = sides[policy, stack] = {
                m: _value(result.summary, c, col) for m, (c, col, *_) in METRICS.items()
            }
            info["runs"][f"{engine}/{policy}/{stack}"] = {
                k: result.info[k] for k in ("cells", "feasibility", "stack") if k in result.info
            }
            if (policy, stack) == REFERENCE:
                continue  # its rows go after the comparisons
            for metric, (*_, native_ref, stack_ref) in METRICS.items():
                ref = native_ref if stack == "none" else stack_ref
                rows.append({"engine": engine, "policy": policy, "stack": stack, "metric": metric,
                             "value": side[metric], "seed_article_value": ref})  # fmt: skip
        for name, (metric, kind, ref, _) in COMPARISONS.items():
            base, full = sides[native, "none"][metric], sides["superinfer", "full"][metric]
            value = full / base if kind == "ratio" else (full - base) * 100
            rows.append({"engine": engine, "policy": f"superinfer/{native}", "stack": "full/none",
                         "metric": name, "value": value, "seed_article_value": ref})  # fmt: skip
        for metric, value in sides[REFERENCE].items():
            rows.append({"engine": engine, "policy": REFERENCE[0], "stack": REFERENCE[1],
                         "metric": metric, "value": value, "seed_article_value": None})  # fmt: skip
    return pd.DataFrame(rows, columns=list(SEED_COLUMNS)), info


def render_seed_report(table: pd.DataFrame, meta: dict[str, Any]) -> str:
    """``results/seed/report.md``: the comparison table per engine and what each row means."""
    cfg = meta.get("config", {})
    lines = [
        "# The seed article's table from the whole stack",
        "",
        f"`superinfer bench --suite seed`: {cfg.get('model')} on {cfg.get('replicas')} x "
        f"{cfg.get('gpu')} TP{cfg.get('tp')} replicas, trace `{cfg.get('trace')}` at "
        f"x{cfg.get('rate_scale')} its rate"
        + (f", first {cfg.get('duration_s'):g} s" if cfg.get("duration_s") else "")
        + f"; seed {meta.get('seed')}, git `{meta.get('git_sha')}`. Per engine: its `native` "
        "policy alone vs `superinfer` with `--stack full` (rotation, reuse-predictor placement, "
        "KV quantization planner; the parts each engine applied are below), and beside them "
        "`oracle` with the same stack: the same scheduler knowing every true output length.",
        "",
        *_settings_lines(cfg),
        "| engine | row | native | whole stack | ratio / points | article | target "
        "| oracle + stack |",
        "|---|---|---|---|---|---|---|---|",
    ]
    missing = False
    for engine, part in table.groupby("engine", sort=False):
        values = {
            (r.stack, r.metric): r.value for r in part.itertuples() if r.policy != REFERENCE[0]
        }
        oracle = {r.metric: r.value for r in part.itertuples() if (r.policy, r.stack) == REFERENCE}
        for name, (metric, kind, ref, target) in COMPARISONS.items():
            cmp = values.get(("full/none", name), float("nan"))
            shown = f"{cmp:.3f}x" if kind == "ratio" else f"{cmp:+.1f} pts"
            if math.isnan(cmp):
                shown, missing = "–", True
            article = f"{ref:g}x" if kind == "ratio" else "+18 pts (78% -> 96%)"
            native, best = values.get(("none", metric), float("nan")), oracle.get(metric)
            if best is None:
                ref_shown = "-"
            else:
                gain = best / native if kind == "ratio" else (best - native) * 100
                unit = f"{gain:.3f}x" if kind == "ratio" else f"{gain:+.1f} pts"
                unit = "–" if math.isnan(gain) else unit
                ref_shown = f"{format_value(best, metric)} ({unit})"
            lines.append(
                f"| `{engine}` | {name} | {format_value(native, metric)} | "
                f"{format_value(values.get(('full', metric)), metric)} | {shown} | {article} | "
                f"{target} | {ref_shown} |"
            )
    if missing:
        lines += [
            "",
            "–: no value: a class had no finished request in the window on one side (a window "
            "shorter than the class's first arrival, or every request of it still running).",
        ]
    lines += [
        "",
        "Rows: `chat_p99_latency_ratio` is the chat class's TTFT p99, whole stack over native; "
        "`batch_throughput_ratio` the batch class's output tokens/s; `peak_kv_ratio` the peak "
        "KV-cache bytes in HBM on one replica (`kv_peak_gb`, cached prefixes included); "
        "`chat_attainment_points` the chat class's SLO attainment (TTFT <= 1 s and TPOT <= "
        "100 ms), difference in points; `oracle + stack` the oracle's value and its ratio / "
        "points against native. Definitions: docs/metrics.md.",
        "",
    ]
    for key, run in meta.get("runs", {}).items():
        for stack in run.get("stack", {}).values():
            absent = ", ".join(stack.get("not_applied", {})) or "none"
            lines.append(
                f"- `{key}`: applied {', '.join(stack['applied'])}; not applied: {absent}."
            )
    return "\n".join(lines) + "\n"


def _settings_lines(cfg: dict[str, Any]) -> list[str]:
    """The report's line naming the run's non-default policy and engine options, if any."""
    parts = [
        f"`{name}`: " + ", ".join(f"`{k}={v}`" for k, v in sorted(opts.items()))
        for name, opts in sorted((cfg.get("policy_options") or {}).items())
        if opts
    ]
    engine = ", ".join(f"`{k}={v}`" for k, v in sorted((cfg.get("engine_options") or {}).items()))
    if engine:
        parts.append(f"engine options (both sides): {engine}")
    return [f"Settings other than the defaults: {'; '.join(parts)}.", ""] if parts else []


def write_seed(out_dir: Path, table: pd.DataFrame, info: dict[str, Any], command: list[str]) -> str:
    """Write ``summary.csv``, ``report.md`` and ``manifest.json`` into ``out_dir`` (staged);
    the files written, as text."""
    meta = manifest(info, command=command)
    owned = ("summary.csv", "report.md", "manifest.json")
    with staged_dir(out_dir, owned=owned) as stage:
        write_atomic(
            stage / "summary.csv",
            lambda p: table.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT),
        )
        (stage / "report.md").write_text(render_seed_report(table, meta), encoding="utf-8")
        text = json.dumps(meta, indent=2, default=str) + "\n"
        (stage / "manifest.json").write_text(text, encoding="utf-8")
    return ", ".join(owned)


def run_seed_suite(
    config: BenchConfig,
    out_dir: Path,
    *,
    progress: Callable[[str], None] | None = None,
    command: list[str] | None = None,
) -> tuple[pd.DataFrame, str]:
    """Run the suite and write ``out_dir``; ``(summary table, the files written)``."""
    table, info = run_seed(config, progress=progress)
    return table, write_seed(out_dir, table, info, command or [])
