"""The seed article's four rows on the real CPU engines, from the engines suite's repeats.

``superinfer bench --suite seed`` runs the simulated engines. The real engines (``hf``: SmolLM2-135M
on transformers; ``sglang``: the SGLang 0.5.23 CPU server) were run by ``superinfer bench --suite
engines`` (``results/hf/``, ``results/engines-cpu/``: the same model on each engine, at loads
around its knee, 3-16 repeats per load, native vs ``superinfer``). This script reads that suite's
``summary.csv`` or ``aggregate.csv`` files (mean, min and max over the repeats) and states the
seed's rows from them, per
engine and load: chat TTFT p99, batch output tokens/s, peak KV, chat SLO attainment, each side's
mean with its spread, and the comparison (ratio of means; attainment difference in points) beside
the article's value (:data:`superinfer.harness.suites_seed.COMPARISONS`).

What "the whole stack" is on each engine: ``hf`` applies none of the stack's parts (no CPU KV tier,
no placement-driven prefix cache, no per-request KV precision), so ``superinfer`` alone is its
whole stack; on ``sglang`` the reuse placement would apply but the engines suite ran the policy
alone, so its rows are the policy's. Peak KV is not reported by the SGLang server (NaN).

``--summary`` takes engines-suite ``summary.csv`` files instead (one row per repeat) and pools
the repeats of one engine and load across them (:func:`pooled_aggregate`), e.g. three runs at the
same load on different arrival seeds; with neither option the files of
:data:`DEFAULT_SUMMARIES` (the latest runs of the current policy on each engine).

Usage: ``python benchmarks/seed_real_engines.py [--summary FILE ...] [--aggregate FILE ...]
[--out results/seed/real_engines.csv]``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from superinfer.harness.suites_seed import COMPARISONS, METRICS

#: The latest engines-suite runs of the current policy: hf with ``tpot_plan_share`` 0.9 at
#: 0.214-0.4 req/s (5 repeats per load), the SGLang server with the chat KV and seat reserves
#: and one batch prompt in prefill at a time at 0.5 and 0.6 req/s (6 repeats each, seeds 6-11)
#: and 1.0 req/s (3, seeds 0-2). The SGLang runs before those rules (``sglang-reserve*``) are
#: left out: another policy.
DEFAULT_SUMMARIES = [
    Path("results/hf/tpot-plan-0.9-low/summary.csv"),
    Path("results/hf/tpot-plan-0.9-0.334/summary.csv"),
    Path("results/hf/tpot-plan-0.9/summary.csv"),
    Path("results/engines-cpu/sglang-serial-0.5-s6/summary.csv"),
    Path("results/engines-cpu/sglang-serial-0.6-s6/summary.csv"),
    Path("results/engines-cpu/sglang-serial-1.0/summary.csv"),
]
#: Real engine -> its native policy as the engines suite names it.
NATIVE = {"hf": "fcfs", "sglang": "native"}
COLUMNS = ["engine", "load_rps", "policy", "metric", "value", "min", "max", "n_repeats",
           "seed_article_value"]  # fmt: skip


def seed_rows(aggregate: pd.DataFrame) -> pd.DataFrame:
    """The seed rows per real engine and load from an engines-suite ``aggregate.csv`` table.

    Args:
        aggregate: columns ``engine, policy, load, slo_class, metric, n, mean, min, max, std``.

    Returns:
        A table of :data:`COLUMNS`: per engine and load, each side's four metrics (mean over the
        repeats, with min and max), then the four comparisons (``policy`` =
        ``superinfer/<native>``; ``min``/``max`` empty).

    Raises:
        ValueError: an engine of :data:`NATIVE` with no row for its native policy or superinfer,
            or one engine and load given twice.
    """
    keys = ["engine", "policy", "load", "slo_class", "metric"]
    if aggregate.duplicated(keys).any():
        dup = aggregate[aggregate.duplicated(keys)].iloc[0]
        raise ValueError(f"{dup['engine']} at {dup['load']} req/s is given twice")
    rows: list[dict[str, object]] = []
    for engine, native in NATIVE.items():
        part = aggregate[aggregate["engine"] == engine]
        for load in sorted(part["load"].unique()):
            at = part[part["load"] == load]
            sides: dict[str, dict[str, float]] = {}
            for policy in (native, "superinfer"):
                cells = at[at["policy"] == policy]
                if cells.empty:
                    raise ValueError(f"{engine} at {load} req/s: no {policy!r} rows")
                sides[policy] = {}
                for metric, (cls, column, native_ref, stack_ref) in METRICS.items():
                    hit = cells[(cells["slo_class"] == cls) & (cells["metric"] == column)]
                    r = hit.iloc[0] if len(hit) else None
                    mean = float(r["mean"]) if r is not None else math.nan
                    sides[policy][metric] = mean
                    rows.append({
                        "engine": engine, "load_rps": load, "policy": policy, "metric": metric,
                        "value": mean,
                        "min": float(r["min"]) if r is not None else math.nan,
                        "max": float(r["max"]) if r is not None else math.nan,
                        "n_repeats": int(r["n"]) if r is not None else 0,
                        "seed_article_value": native_ref if policy == native else stack_ref,
                    })  # fmt: skip
            for name, (metric, kind, ref, _) in COMPARISONS.items():
                base, full = sides[native][metric], sides["superinfer"][metric]
                value = full / base if kind == "ratio" else (full - base) * 100
                rows.append({"engine": engine, "load_rps": load, "policy": f"superinfer/{native}",
                             "metric": name, "value": value, "min": math.nan, "max": math.nan,
                             "n_repeats": 0, "seed_article_value": ref})  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def pooled_aggregate(summaries: list[pd.DataFrame]) -> pd.DataFrame:
    """One :func:`aggregate`-shaped table over engines-suite summary rows from several runs: the
    repeats of one (engine, policy, load, class) in every file are pooled (mean, min, max and
    ``n`` over all of them), as if one run had made them all.

    Args:
        summaries: ``summary.csv`` tables (columns ``engine, policy, repeat, load, slo_class``
            and the metrics).

    Returns:
        Columns ``engine, policy, load, slo_class, metric, n, mean, min, max, std``.

    Raises:
        KeyError: a table lacks one of the key columns.
    """
    from superinfer.harness.suites_engines_report import aggregate

    return aggregate(pd.concat(summaries, ignore_index=True))


def _read(paths: list[Path]) -> list[pd.DataFrame]:
    frames = []
    for path in paths:
        try:
            frames.append(pd.read_csv(path))
        except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise SystemExit(f"error: {path}: {exc}") from None
    return frames


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aggregate", type=Path, nargs="+", default=[],
                    help="engines-suite aggregate.csv files (rows of one engine and load must "
                    "come from one file)")  # fmt: skip
    ap.add_argument("--summary", type=Path, nargs="+", default=[],
                    help="engines-suite summary.csv files, their repeats pooled per engine and "
                    "load")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("results/seed/real_engines.csv"))
    args = ap.parse_args()
    summaries = args.summary or ([] if args.aggregate else DEFAULT_SUMMARIES)
    frames = _read(args.aggregate)
    names = ", ".join(map(str, [*args.aggregate, *summaries]))
    try:
        if summaries:
            frames.append(pooled_aggregate(_read(summaries)))
        table = seed_rows(pd.concat(frames, ignore_index=True))
    except (KeyError, ValueError) as exc:
        raise SystemExit(f"error: {names}: {exc}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    table.to_csv(tmp, index=False, float_format="%.6g")
    tmp.replace(args.out)
    print(f"wrote {args.out} ({len(table)} rows)")


if __name__ == "__main__":
    main()
