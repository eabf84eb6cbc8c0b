"""Per-request records into per-SLO-class summary rows. Every metric is defined in docs/metrics.md.

One code path for every engine: runners produce a requests table with the columns of
:data:`REQUEST_COLUMNS`; :func:`summarize` turns it into ``summary.csv`` rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

__all__ = [
    "METRIC_COLUMNS",
    "METRIC_UNITS",
    "FEASIBILITY_COLUMNS",
    "REQUEST_COLUMNS",
    "SUMMARY_COLUMNS",
    "add_latency_columns",
    "metrics_long",
    "summarize",
]

#: Columns of ``requests.parquet`` (one row per request). Times are seconds on the run's clock.
REQUEST_COLUMNS = (
    "engine",
    "policy",
    "request_id",
    "source",
    "slo_class",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "generated_tokens",
    "first_token_s",
    "finish_s",
    "status",
    "reason",
    "num_preemptions",
    "replica",
    "max_itl_ms",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "met_slo",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "slo_deadline_s",
)

#: Optional columns of ``requests.parquet`` after :data:`REQUEST_COLUMNS`, where the engine has
#: an isolated-latency model (``harness.engines.isolated``): ``feasible`` (an idle replica meets
#: the request's SLO) and ``infeasible_reason`` (the first target it misses there, else "").
FEASIBILITY_COLUMNS = ("feasible", "infeasible_reason")

#: Columns of ``summary.csv``, in order. Later columns are only ever appended.
SUMMARY_COLUMNS = (
    "engine",
    "policy",
    "slo_class",
    "n_requests",
    "n_finished",
    "n_rejected",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "slo_attainment",
    "goodput_rps",
    "throughput_rps",
    "output_tok_s",
    "kv_peak_gb",
    "preemptions",
    "n_failed",
    "window_s",
)


def add_latency_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``ttft_ms``, ``tpot_ms``, ``e2e_ms`` and ``met_slo`` to a requests table.

    ``tpot_ms = (e2e - ttft) / (generated_tokens - 1)``, undefined (NaN) for one-token outputs.
    A request meets its SLO only if it finished and met every target its class sets
    (``slo_ttft_ms``, ``slo_tpot_ms``, ``slo_deadline_s``; NaN = no target). Input is not modified.
    """
    out = df.copy()
    finished = out["status"] == "finished"
    ttft = (out["first_token_s"] - out["arrival_s"]) * 1e3
    e2e = (out["finish_s"] - out["arrival_s"]) * 1e3
    out["ttft_ms"] = ttft.where(finished)
    out["e2e_ms"] = e2e.where(finished)
    decode = out["generated_tokens"] - 1
    out["tpot_ms"] = ((e2e - ttft) / decode.where(decode > 0)).where(finished)
    met = finished.copy()
    met &= out["slo_ttft_ms"].isna() | (out["ttft_ms"] <= out["slo_ttft_ms"])
    met &= (
        out["slo_tpot_ms"].isna() | out["tpot_ms"].isna() | (out["tpot_ms"] <= out["slo_tpot_ms"])
    )
    met &= out["slo_deadline_s"].isna() | (out["e2e_ms"] <= out["slo_deadline_s"] * 1e3)
    out["met_slo"] = met
    return out


def _pct(values: pd.Series, q: float) -> float:
    clean = values.dropna().to_numpy(dtype=float)
    return float(np.percentile(clean, q)) if clean.size else float("nan")


def _prefix_hits(finished: pd.DataFrame) -> dict[str, float]:
    """Prompt tokens served from a prefix cache, over finished requests (engines that report
    ``cached_tokens``; NaN otherwise)."""
    if "cached_tokens" not in finished:
        return {"prompt_tokens_cached": float("nan"), "prefix_hit_rate": float("nan")}
    cached = float(finished["cached_tokens"].sum())
    prompt = float(finished["prompt_tokens"].sum())
    return {
        "prompt_tokens_cached": cached,
        "prefix_hit_rate": cached / prompt if prompt else float("nan"),
    }


def summarize(
    df: pd.DataFrame,
    *,
    engine: str,
    policy: str,
    kv_peak_bytes: Mapping[str, float],
) -> list[dict[str, object]]:
    """Summary rows of one engine x policy run: one per SLO class, then class ``all``.

    Args:
        df: requests table with :data:`REQUEST_COLUMNS` (as :func:`add_latency_columns` makes).
        engine: engine id for the rows.
        policy: policy name for the rows.
        kv_peak_bytes: peak KV bytes in HBM per class name, for ``"all"`` (cached prefixes
            included) and, optionally, ``"all_active"`` (requests' KV only).

    Returns:
        Dicts keyed by :data:`SUMMARY_COLUMNS`. Rates use one window for every class: from the
        first arrival to the last finish of any request of the run.
    """
    if df.empty:
        return []
    ends = df["finish_s"].dropna()
    start = float(df["arrival_s"].min())
    end = float(ends.max()) if not ends.empty else start
    window = max(end - start, 0.0)

    def rate(count: float) -> float:
        return count / window if window > 0 else float("nan")

    rows = []
    classes = sorted(df["slo_class"].unique())
    for name, part in [(c, df[df["slo_class"] == c]) for c in classes] + [("all", df)]:
        finished = part[part["status"] == "finished"]
        n_met = int(part["met_slo"].sum())
        rows.append(
            {
                "engine": engine,
                "policy": policy,
                "slo_class": name,
                "n_requests": len(part),
                "n_finished": len(finished),
                "n_rejected": int((part["status"] == "rejected").sum()),
                "ttft_p50_ms": _pct(finished["ttft_ms"], 50),
                "ttft_p99_ms": _pct(finished["ttft_ms"], 99),
                "tpot_p50_ms": _pct(finished["tpot_ms"], 50),
                "tpot_p99_ms": _pct(finished["tpot_ms"], 99),
                "e2e_p50_ms": _pct(finished["e2e_ms"], 50),
                "e2e_p99_ms": _pct(finished["e2e_ms"], 99),
                "slo_attainment": n_met / len(part),
                "goodput_rps": rate(n_met),
                "throughput_rps": rate(len(finished)),
                "output_tok_s": rate(float(finished["generated_tokens"].sum())),
                "kv_peak_gb": kv_peak_bytes.get(name, 0.0) / 1e9,
                "preemptions": int(part["num_preemptions"].sum()),
                "n_failed": int((part["status"] == "failed").sum()),
                "window_s": window,
                "kv_peak_active_gb": kv_peak_bytes.get(
                    "all_active" if name == "all" else name, kv_peak_bytes.get(name, 0.0)
                )
                / 1e9,
                **_prefix_hits(finished),
                **_feasible(part),
            }
        )
    return rows


def _feasible(part: pd.DataFrame) -> dict[str, float]:
    """``n_feasible`` (requests an idle replica of the engine serves within their SLO) and
    ``slo_attainment_feasible`` (the attainment among them); NaN where the engine has no step-time
    model (the ``feasible`` column is missing or empty, docs/metrics.md)."""
    if "feasible" not in part or part["feasible"].isna().all():
        return {"n_feasible": float("nan"), "slo_attainment_feasible": float("nan")}
    feasible = part["feasible"].astype(bool)
    n = int(feasible.sum())
    met = int((part["met_slo"].astype(bool) & feasible).sum())
    return {"n_feasible": n, "slo_attainment_feasible": met / n if n else float("nan")}


#: Columns of ``metrics.csv``: the summary in long format, one row per metric and row key.
METRIC_COLUMNS = ("metric", "unit", "value", "engine", "policy", "slo_class")

#: Unit of every numeric ``summary.csv`` column, and of the extra percentiles in ``metrics.csv``.
METRIC_UNITS = {
    "n_requests": "count",
    "n_finished": "count",
    "n_rejected": "count",
    "ttft_p50_ms": "ms",
    "ttft_p90_ms": "ms",
    "ttft_p99_ms": "ms",
    "tpot_p50_ms": "ms",
    "tpot_p90_ms": "ms",
    "tpot_p99_ms": "ms",
    "e2e_p50_ms": "ms",
    "e2e_p90_ms": "ms",
    "e2e_p99_ms": "ms",
    "slo_attainment": "fraction",
    "goodput_rps": "req/s",
    "throughput_rps": "req/s",
    "output_tok_s": "tok/s",
    "kv_peak_gb": "GB",
    "preemptions": "count",
    "n_failed": "count",
    "window_s": "s",
    "n_feasible": "count",
    "slo_attainment_feasible": "fraction",
}

_KEYS = ("engine", "policy", "slo_class")
#: Metrics left out of ``metrics.csv`` where they are NaN (engines without a step-time model).
_OPTIONAL = ("n_feasible", "slo_attainment_feasible")


def metrics_long(summary: pd.DataFrame, requests: pd.DataFrame | None = None) -> pd.DataFrame:
    """``metrics.csv``: every number of ``summary.csv`` as one row
    ``(metric, unit, value, engine, policy, slo_class)``, the metric named as its summary column.

    With ``requests``, the p90 of TTFT, TPOT and E2E (``ttft_p90_ms``, ``tpot_p90_ms``,
    ``e2e_p90_ms``; over finished requests, as the summary's p50 and p99) are added for each
    row key. Rows come in summary order, metrics in :data:`METRIC_UNITS` order within a key.
    """
    extra: dict[tuple[str, str, str], dict[str, float]] = {}
    if requests is not None and not requests.empty:
        done = requests[requests["status"] == "finished"]
        for (engine, policy), part in done.groupby(["engine", "policy"], sort=False):
            groups = [(c, part[part["slo_class"] == c]) for c in part["slo_class"].unique()]
            for cls, rows in [*groups, ("all", part)]:
                extra[(str(engine), str(policy), str(cls))] = {
                    f"{col}_p90_ms": _pct(rows[f"{col}_ms"], 90) for col in ("ttft", "tpot", "e2e")
                }
    out = []
    for _, row in summary.iterrows():
        key = tuple(str(row[k]) for k in _KEYS)
        values = {c: row[c] for c in summary.columns if c in METRIC_UNITS}
        values.update(extra.get(key, {}))  # type: ignore[arg-type]
        for metric, unit in METRIC_UNITS.items():
            if metric in values and not (metric in _OPTIONAL and pd.isna(values[metric])):
                out.append((metric, unit, float(values[metric]), *key))
    return pd.DataFrame(out, columns=list(METRIC_COLUMNS))
