"""Simulated rows of ``bench --suite engines`` against their real rows (issue 19's real-engine
bounds): :func:`fidelity` over the suite's aggregate table, :func:`fidelity_bound` per metric."""

from __future__ import annotations

import math

import pandas as pd

from superinfer.harness.suites_engines_options import ENGINE_POLICIES, SIM_OF

__all__ = [
    "FIDELITY_BOUND",
    "FIDELITY_BOUND_P99",
    "FIDELITY_BOUND_POINTS",
    "FIDELITY_CSV_COLUMNS",
    "FIDELITY_METRICS",
    "SIM_ROWS",
    "fidelity",
    "fidelity_bound",
    "fidelity_csv",
    "mean_of",
    "within_count",
]

#: |rel_err| bound of a simulated p50 against its real one (issue 19's real-engine target;
#: results/fidelity/README.md).
FIDELITY_BOUND = 0.15
#: |rel_err| bound of a simulated p99 (issue 19).
FIDELITY_BOUND_P99 = 0.25
#: Attainment bound, in points (issue 19: "attainment within 3 points").
FIDELITY_BOUND_POINTS = 3.0
#: Simulated (engine, policy) -> the real (engine, policy) it models: the policies pair up in
#: ``ENGINE_POLICIES`` order (``sim:sglang-cpu``'s ``fcfs`` models SGLang's ``native``).
SIM_ROWS = {
    (sim, sim_policy): (real, policy)
    for sim, real in SIM_OF.items()
    for sim_policy, policy in zip(ENGINE_POLICIES[sim], ENGINE_POLICIES[real], strict=True)
}
#: Metrics the fidelity table compares: (class, column).
FIDELITY_METRICS = tuple(
    (cls, metric)
    for cls in ("chat", "batch")
    for metric in (
        "ttft_p50_ms",
        "ttft_p99_ms",
        "tpot_p50_ms",
        "e2e_p50_ms",
        "e2e_p99_ms",
        "slo_attainment",
        "preemptions",
        "prompt_tokens_cached",
    )
)


def fidelity_bound(metric: str) -> tuple[str, float]:
    """``(kind, bound)`` a simulated ``metric`` is judged by: ``("rel", 0.15)`` for a p50,
    ``("rel", 0.25)`` for a p99, ``("points", 3.0)`` for attainment (absolute, in points), or
    ``("", nan)`` for a count that is reported, not judged (preemptions, cached prompt tokens)."""
    if metric == "slo_attainment":
        return "points", FIDELITY_BOUND_POINTS
    if "_p99_" in metric:
        return "rel", FIDELITY_BOUND_P99
    if "_p50_" in metric:
        return "rel", FIDELITY_BOUND
    return "", math.nan


def mean_of(
    agg: pd.DataFrame,
    engine: str,
    policy: str,
    load: float,
    cls: str,
    metric: str,
    stat: str = "mean",
) -> float:
    """``stat`` of ``metric`` in the :func:`aggregate`-shaped ``agg`` for one (engine, policy,
    load, class); NaN when there is no such row."""
    row = agg[
        (agg["engine"] == engine)
        & (agg["policy"] == policy)
        & (agg["load"] == load)
        & (agg["slo_class"] == cls)
        & (agg["metric"] == metric)
    ]
    return float(row[stat].iloc[0]) if len(row) else math.nan


def fidelity(agg: pd.DataFrame) -> pd.DataFrame:
    """Simulated rows against their real rows (:data:`SIM_ROWS`) per load, class and metric
    (:data:`FIDELITY_METRICS`): ``rel_err = (sim - real) / real`` and ``abs_err = sim - real``
    (real and sim = means over repeats); ``bound`` and ``within`` from :func:`fidelity_bound`
    (a p50 by ``|rel_err| <= 0.15``, a p99 by ``<= 0.25``, attainment by ``|abs_err| <= 0.03``;
    counts: ``within`` empty). A metric the real engine does not report is left out."""
    rows = []
    for (sim_engine, sim_policy), (engine, policy) in SIM_ROWS.items():
        sims = agg[(agg["engine"] == sim_engine) & (agg["policy"] == sim_policy)]
        for load in sorted(sims["load"].unique()):
            for cls, metric in FIDELITY_METRICS:
                real = mean_of(agg, engine, policy, load, cls, metric)
                sim = mean_of(agg, sim_engine, sim_policy, load, cls, metric)
                if math.isnan(real):
                    continue
                rel = (sim - real) / real if real else math.nan
                kind, bound = fidelity_bound(metric)
                if kind == "points":
                    within: bool | None = bool(abs(sim - real) * 100 <= bound + 1e-9)
                elif kind == "rel":
                    within = bool(abs(rel) <= bound)
                else:
                    within = None
                rows.append(
                    {
                        "sim_engine": sim_engine,
                        "engine": engine,
                        "policy": policy,
                        "load": load,
                        "slo_class": cls,
                        "metric": metric,
                        "real": real,
                        "sim": sim,
                        "abs_err": sim - real,
                        "rel_err": rel,
                        "bound": f"{bound:g} {kind}" if kind else "",
                        "within": within,
                    }
                )
    return pd.DataFrame(rows)


def within_count(fid: pd.DataFrame) -> tuple[int, int]:
    """``(rows within their bound, rows judged)`` of :func:`fidelity` rows (fresh or read back
    from CSV, where an unjudged row's ``within`` is empty)."""
    judged = fid["within"].dropna()
    return int(judged.astype(bool).sum()), len(judged)


#: The columns of a fidelity CSV (``results/fidelity/sglang_cpu*.csv``, ``hf*.csv``): a
#: :func:`fidelity` row with ``sim`` named ``simulated``, without ``sim_engine``.
FIDELITY_CSV_COLUMNS = ["engine", "policy", "load", "slo_class", "metric", "real", "simulated",
                        "abs_err", "rel_err", "bound", "within"]  # fmt: skip


def fidelity_csv(fid: pd.DataFrame) -> pd.DataFrame:
    """:func:`fidelity` rows in the CSV layout :data:`FIDELITY_CSV_COLUMNS` (index reset)."""
    return fid.rename(columns={"sim": "simulated"})[FIDELITY_CSV_COLUMNS].reset_index(drop=True)
