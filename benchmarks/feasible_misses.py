"""Where a run's feasible-set misses are: attainment by prompt length, beside the isolated TTFT.

Issue 18 asks for chat attainment >= 0.98 over the feasible set (requests whose SLO an *idle*
replica meets, ``harness/engines/isolated.py``). This script reads one or more ``superinfer bench``
run folders (their ``requests.parquet`` and ``manifest.json``) and states, per run, engine, policy
and prompt-length band of one SLO class: how many feasible requests there are, what fraction met
the SLO, how many were rejected or missed their TTFT, and the isolated TTFT of the band's median
prompt (the engine's step-time model, as the feasibility test computes it) against the TTFT target,
so the slack a band has for any queueing is plain.

The bands split out the cluster of 4,000-4,200-token chats of the Azure 2023 conversation trace.

Usage: ``python benchmarks/feasible_misses.py RUN_DIR [RUN_DIR ...] [--slo-class chat]
[--out results/headline/feasible_misses.csv]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pandas as pd

from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.engines.isolated import engine_isolated_latency

#: Prompt-length band edges, tokens (a band is [lo, hi)).
BANDS = (0, 1024, 2048, 4000, 4200, 8192, 1 << 30)
COLUMNS = ["run", "engine", "policy", "slo_class", "prompt_band", "n_feasible",
           "attainment_feasible", "n_rejected", "n_ttft_missed", "median_prompt_tokens",
           "isolated_ttft_ms", "slo_ttft_ms", "isolated_slack_ms"]  # fmt: skip


def _config(manifest: dict) -> BenchConfig:
    """The run's :class:`BenchConfig` from its manifest's ``config`` (fields it does not know are
    left out)."""
    names = {f.name for f in dataclasses.fields(BenchConfig)}
    cfg = {k: v for k, v in manifest["config"].items() if k in names}
    for key in ("engines", "policies", "policy_opts"):
        if key in cfg and isinstance(cfg[key], list):
            cfg[key] = tuple(cfg[key])
    return BenchConfig(**cfg)


def band_rows(
    requests: pd.DataFrame, config: BenchConfig, run: str, slo_class: str
) -> pd.DataFrame:
    """Per engine, policy and prompt band of ``slo_class``: the :data:`COLUMNS` table.

    Args:
        requests: a run's ``requests.parquet`` (columns ``engine, policy, slo_class,
            prompt_tokens, status, met_slo, feasible, ttft_ms, slo_ttft_ms``).
        config: the run's configuration (for the engine's isolated latency).
        run: the label written in the ``run`` column.
        slo_class: the class to break down.

    Returns:
        One row per (engine, policy, band) with feasible requests; ``isolated_ttft_ms`` is NaN on
        engines without a step-time model.

    Raises:
        ValueError: the table has no ``feasible`` column or no request of ``slo_class``.
    """
    if "feasible" not in requests.columns:
        raise ValueError(f"{run}: requests.parquet has no 'feasible' column")
    part = requests[requests["slo_class"] == slo_class]
    if part.empty:
        raise ValueError(f"{run}: no request of class {slo_class!r}")
    part = part[part["feasible"] == True]  # noqa: E712 (NaN where unknown)
    band = pd.cut(part["prompt_tokens"], list(BANDS), right=False)
    rows = []
    for (engine, policy, interval), g in part.groupby(["engine", "policy", band], observed=True):
        latency = engine_isolated_latency(config, engine)
        median = int(g["prompt_tokens"].median())
        iso = latency.prefill_ms(median) if latency is not None else float("nan")
        target = float(g["slo_ttft_ms"].median())
        finished = g[g["status"] == "finished"]
        rows.append({
            "run": run, "engine": engine, "policy": policy, "slo_class": slo_class,
            "prompt_band": f"{int(interval.left)}-{int(interval.right)}",
            "n_feasible": len(g), "attainment_feasible": float(g["met_slo"].mean()),
            "n_rejected": int((g["status"] == "rejected").sum()),
            "n_ttft_missed": int((finished["ttft_ms"] > finished["slo_ttft_ms"]).sum()),
            "median_prompt_tokens": median, "isolated_ttft_ms": iso, "slo_ttft_ms": target,
            "isolated_slack_ms": target - iso,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv: list[str] | None = None) -> int:
    """Read the run folders, write the table, print it; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="superinfer bench output folders")
    ap.add_argument("--slo-class", default="chat")
    ap.add_argument("--out", type=Path, default=Path("results/headline/feasible_misses.csv"))
    args = ap.parse_args(argv)
    tables = []
    for run in args.runs:
        try:
            manifest = json.loads((run / "manifest.json").read_text())
            requests = pd.read_parquet(run / "requests.parquet")
            tables.append(band_rows(requests, _config(manifest), run.name, args.slo_class))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {run}: {exc}")
            return 2
    table = pd.concat(tables, ignore_index=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False, float_format="%.6g")
    print(table.to_string(index=False))
    print(f"wrote {args.out} ({len(table)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
