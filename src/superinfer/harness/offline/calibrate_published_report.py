"""``published_report.md``: the fitted engine costs, and their error on the published rows.

Companion of ``calibrate_published.py`` (which fits and simulates); this module only renders.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["TARGETS", "render_report"]

#: Targets on the scored rows (issue 19): metric family -> (median, p90) |rel_err| bounds.
TARGETS = {
    "throughput (max load)": (0.10, 0.20),
    "ttft_ms:mean": (0.15, None),
    "ttft_ms:p50": (0.15, None),
    "itl_ms:mean": (0.15, None),
    "itl_ms:p50": (0.15, None),
}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _verdict(family: str, median: float, p90: float) -> str:
    if family not in TARGETS:
        return "-"
    med_t, p90_t = TARGETS[family]
    ok = median <= med_t and (p90_t is None or p90 <= p90_t)
    bound = f"median <= {_pct(med_t)}" + (f", p90 <= {_pct(p90_t)}" if p90_t else "")
    return ("met" if ok else "MISSED") + f" ({bound})"


def render_report(
    rows: list[Any],
    unsupported: list[tuple[dict[str, str], str]],
    costs: dict[str, Any],
    tables: dict[str, list[dict[str, Any]]],
) -> str:
    """The report: parameters, error per engine and metric on scored and fit rows (``tables``:
    ``calibrate_published.summary_table`` per split), misses."""

    n_fit = sum(r.split == "fit" for r in rows)
    n_score = sum(r.split == "score" for r in rows)
    lines = [
        "# Engine models against published measurements",
        "",
        "`superinfer calibrate --engine published --out results/fidelity` "
        "(`harness/offline/calibrate_published.py`): every row of "
        "`shared/data/published/engine_perf.csv` the simulator can reproduce is simulated with "
        "its release's profile (`sim/versions.py`) under the native policy (`fcfs`), with the "
        "same model, dtypes, GPU, TP, ISL/OSL or ShareGPT lengths, arrival rate and (shortened) "
        "request count. Per-row values are in `published.csv`.",
        "",
        f"Rows: {len(rows) + len(unsupported)} published, {len(rows)} simulated "
        f"({n_fit} fit, {n_score} scored), {len(unsupported)} unsupported.",
        "",
        "**Split (deterministic).** Rows that feed a fit (max-load output throughput, "
        "per-iteration forward and schedule times, all-at-once runs) are grouped by (kernel "
        "family, weight dtype, metric), or (release, metric) for schedule times, sorted by "
        "`row_id`; even positions are `fit`, odd ones `score`. Of the online runs, the TTFT "
        "rows at the lowest published rate of each (release, model, GPU, TP, lengths) run at "
        "two rates or more are `fit` (the request-path latency), and so are SGLang 0.3.0's "
        "TPOT rows at that rate (its kernel scale; its max-load fit row fits its CPU per "
        "running request). Every other simulated row (online latencies and throughput at the "
        "higher rates, request throughput, total-token throughput, schedule shares, and the "
        "lowest-rate ITL rows, whose setup's TPOT or TTFT is fitted) is `score`.",
        "",
        "## Fitted parameters (`sim/engine_costs.json`)",
        "",
        "| kernel family | dtype | kernel scale (x calibrated GPU time) |",
        "|---|---|---|",
    ]
    for key, by_dtype in sorted(costs.get("kernel_scale", {}).items()):
        for dtype, scale in sorted(by_dtype.items()):
            lines.append(f"| {key} | {dtype} | {scale:.3f} |")
    lines += ["", "| release | CPU per step: intercept | per running request | fit rows |",
              "|---|---|---|---|"]  # fmt: skip
    for release, p in sorted(costs.get("cpu", {}).items()):
        rows_ = ", ".join(str(x) for x in p.get("fit_rows", []))
        lines.append(f"| {release} | {1e3 * p['intercept_s']:.3f} ms | "
                     f"{1e6 * p['per_seq_s']:.2f} us | {rows_} |")  # fmt: skip
    latency = costs.get("request_latency_s", {})
    if latency:
        lines += ["", "| release | request-path latency (TTFT and E2E) | fit rows |",
                  "|---|---|---|"]  # fmt: skip
        for release, p in sorted(latency.items()):
            rows_ = ", ".join(str(x) for x in p.get("fit_rows", []))
            lines.append(f"| {release} | {1e3 * p['s']:.2f} ms | {rows_} |")
    for split, title in (("score", "Scored rows"), ("fit", "Fit rows (for reference)")):
        lines += [
            "",
            f"## {title}: |rel_err| per engine and metric",
            "",
            "| engine | metric | n | median | p90 | target |",
            "|---|---|---|---|---|---|",
        ]
        for t in tables[split]:
            verdict = _verdict(t["metric"], t["median"], t["p90"]) if split == "score" else "-"
            lines.append(f"| {t['engine']} | {t['metric']} | {t['n']} | {_pct(t['median'])} | "
                         f"{_pct(t['p90'])} | {verdict} |")  # fmt: skip
    worst = sorted((r for r in rows if r.split == "score"),
                   key=lambda r: -abs(r.simulated / r.published - 1))[:15]  # fmt: skip
    lines += ["", "## Largest errors on scored rows", "",
              "| row | setup | metric | published | simulated | rel_err |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for r in worst:
        lines.append(f"| {r.row['row_id']} | {r.setup.label} | {r.metric} | {r.published:g} | "
                     f"{r.simulated:.4g} | {_pct(r.simulated / r.published - 1)} |")  # fmt: skip
    reasons = Counter(why for _, why in unsupported)
    lines += ["", "## Unsupported rows", "", "| reason | rows |", "|---|---|"]
    for why, n in reasons.most_common():
        lines.append(f"| {why} | {n} |")
    return "\n".join(lines) + "\n"
