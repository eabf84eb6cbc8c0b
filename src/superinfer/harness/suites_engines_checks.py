"""The policy checks of ``bench --suite engines`` (``checks.csv``): ``superinfer`` against each
engine's own policy per load, judged by issue 24's attainment target and issue 18's three
real-engine targets. Used by ``suites_engines_report``, which writes the file and the report's
table."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from superinfer.harness.suites_engines_fidelity import mean_of

__all__ = [
    "HOST_SPEED_COLUMNS",
    "ISSUE18_BAND",
    "ISSUE18_POINTS",
    "ISSUE18_TOK_S_RATIO",
    "ISSUE18_TTFT_P99_RATIO",
    "KNEE_BAND",
    "WIN_POINTS",
    "host_speed_frame",
    "host_speed_table",
    "policy_checks",
]

#: ``host_speed.csv``'s columns.
HOST_SPEED_COLUMNS = ["engine", "policy", "load", "repeat", "run", "host_speed"]

#: Native chat attainment band where superinfer must win by >= 10 points (issue 24).
KNEE_BAND = (0.6, 0.85)
WIN_POINTS = 10.0
#: Issue 18's real-engine targets where native (FCFS) chat attainment is 0.6-0.8: chat
#: attainment >= native + 15 points, chat TTFT p99 <= 0.6x native's, output tokens/s (all
#: classes) >= 0.95x native's; each a ratio of means over repeats.
ISSUE18_BAND = (0.6, 0.8)
ISSUE18_POINTS = 15.0
ISSUE18_TTFT_P99_RATIO = 0.6
ISSUE18_TOK_S_RATIO = 0.95


def host_speed_frame(speeds: Mapping[str, Mapping[str, float]]) -> pd.DataFrame:
    """``{engine: {run: factor}}`` (``offline.calibrate_hf.run_speeds`` per real engine, runs
    named ``<engine>_<policy>_<load>_<repeat>``) as the rows of ``host_speed.csv``
    (:data:`HOST_SPEED_COLUMNS`).

    Raises:
        ValueError: a run name not of that form.
    """
    rows = []
    for engine, runs in speeds.items():
        for run, factor in runs.items():
            parts = run.removeprefix(f"{engine}_").rsplit("_", 2)
            try:
                if not run.startswith(f"{engine}_") or len(parts) != 3 or not parts[0]:
                    raise ValueError
                policy, load, repeat = parts[0], float(parts[1]), int(parts[2])
            except ValueError:
                raise ValueError(
                    f"run {run!r} is not <{engine}>_<policy>_<load>_<repeat>"
                ) from None
            rows.append((engine, policy, load, repeat, run, float(factor)))
    return pd.DataFrame(rows, columns=HOST_SPEED_COLUMNS)


def host_speed_table(info: dict[str, Any]) -> pd.DataFrame:
    """:func:`host_speed_frame` of a suite's ``info["host_speeds"]`` (empty without them); a run
    name it cannot read leaves the table empty and says why in ``info["host_speed_failed"]``, so
    the suite's other files are still written."""
    try:
        return host_speed_frame(info.get("host_speeds", {}))
    except ValueError as exc:
        info.setdefault("host_speed_failed", {})["names"] = str(exc)
        return pd.DataFrame(columns=HOST_SPEED_COLUMNS)


def _mean_speed(speeds: pd.DataFrame | None, engine: str, policy: str, load: float) -> float:
    if speeds is None or speeds.empty:
        return math.nan
    m = (speeds["engine"] == engine) & (speeds["policy"] == policy)
    m &= speeds["load"].map(lambda x: f"{x:g}") == f"{load:g}"  # as the run's name has it
    return float(speeds.loc[m, "host_speed"].mean()) if m.any() else math.nan


def policy_checks(
    agg: pd.DataFrame, natives: dict[str, str], speeds: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Per engine with a ``superinfer`` row and load: native and superinfer chat attainment (mean
    over repeats), the difference in points, what issue 24 requires there (>= +10 points where
    native attains 0.6-0.85, >= 0 elsewhere) and whether it holds; also the share of native's
    gap to 1.0 that superinfer closes. Added after those (columns only appended): superinfer's
    chat TTFT p99 and all-class output tokens/s over native's (ratios of the means over
    repeats), whether native's attainment is in issue 18's band (:data:`ISSUE18_BAND`) and,
    there, whether issue 18's three targets hold at once (``issue18_met``; empty outside the
    band); then native's and superinfer's mean host speed over the repeats
    (``native_host_speed``, ``superinfer_host_speed``: ``speeds``, :func:`host_speed_frame`'s
    rows; NaN without them), so a comparison made on a slower host for one policy shows."""
    rows = []
    for engine in agg["engine"].unique():
        native = natives.get(engine)
        part = agg[agg["engine"] == engine]
        if native is None or "superinfer" not in set(part["policy"]):
            continue
        for load in sorted(part["load"].unique()):
            nat = mean_of(agg, engine, native, load, "chat", "slo_attainment")
            sup = mean_of(agg, engine, "superinfer", load, "chat", "slo_attainment")
            points = (sup - nat) * 100
            in_band = KNEE_BAND[0] <= nat <= KNEE_BAND[1]
            need = WIN_POINTS if in_band else 0.0
            gap = 1 - nat
            ttft = mean_of(agg, engine, "superinfer", load, "chat", "ttft_p99_ms") / mean_of(
                agg, engine, native, load, "chat", "ttft_p99_ms"
            )
            tok = mean_of(agg, engine, "superinfer", load, "all", "output_tok_s") / mean_of(
                agg, engine, native, load, "all", "output_tok_s"
            )
            band18 = ISSUE18_BAND[0] <= nat <= ISSUE18_BAND[1]
            met18 = (
                points >= ISSUE18_POINTS - 1e-9
                and ttft <= ISSUE18_TTFT_P99_RATIO + 1e-9
                and tok >= ISSUE18_TOK_S_RATIO - 1e-9
            )
            rows.append(
                {
                    "engine": engine,
                    "load": load,
                    "native": native,
                    "native_chat_attainment": nat,
                    "superinfer_chat_attainment": sup,
                    "points": points,
                    "in_knee_band": in_band,
                    "required_points": need,
                    "met": bool(points >= need - 1e-9),
                    "gap_closed": (sup - nat) / gap if gap > 0 else math.nan,
                    "chat_ttft_p99_ratio": ttft,
                    "output_tok_s_ratio": tok,
                    "in_issue18_band": band18,
                    "issue18_met": met18 if band18 else None,
                    "native_host_speed": _mean_speed(speeds, engine, native, load),
                    "superinfer_host_speed": _mean_speed(speeds, engine, "superinfer", load),
                }
            )
    return pd.DataFrame(rows)
