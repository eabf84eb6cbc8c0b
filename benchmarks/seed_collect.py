"""One row per ``superinfer bench --suite seed`` run: its settings and the article's four rows.

The seed suite writes one folder per run (``summary.csv`` in the long form of
``harness/suites_seed.py`` and ``manifest.json``). Comparing settings (engine options such as
SGLang's ``mixed_batches``, ``--policy-opt`` options, the arrival rate) means reading many such
folders; this script puts each run's engine on one line: the load, the non-default options, the
native and whole-stack chat attainment, the four comparisons beside their targets (issue 18:
chat TTFT p99 <= 0.6x native, batch output tokens/s >= 0.96x, peak KV <= 0.67x, chat attainment
>= native + 18 points), whether all four are met, and the oracle's attainment with the same stack.

Usage: ``python benchmarks/seed_collect.py RUN_DIR [RUN_DIR ...] --out FILE.csv``. A folder without
the two files, or whose summary lacks a row this needs, is a one-line error naming it (exit 2).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from superinfer.harness.suites_seed import COMPARISONS

COLUMNS = ["run", "engine", "rate_scale", "duration_s", "engine_options", "superinfer_options",
           "oracle_options", "native_attainment", "stack_attainment", "oracle_attainment",
           "chat_p99_latency_ratio", "batch_throughput_ratio", "peak_kv_ratio",
           "chat_attainment_points", "all_four_met"]  # fmt: skip
#: comparison -> (">=" or "<=", threshold): the suite's targets (``COMPARISONS``: the article's
#: value, on the side its target text names; issue 18).
TARGETS = {name: (target.split()[0], ref) for name, (_, _, ref, target) in COMPARISONS.items()}


def _met(name: str, value: float) -> bool:
    op, threshold = TARGETS[name]
    return value >= threshold if op == ">=" else value <= threshold


class InputError(Exception):
    """A run folder this script cannot read; the message names it."""


def _options(opts: dict[str, str] | None) -> str:
    """``key=value`` pairs, sorted, space-separated ("" for none)."""
    return " ".join(f"{k}={v}" for k, v in sorted((opts or {}).items()))


def collect(run_dir: Path) -> list[dict[str, object]]:
    """The :data:`COLUMNS` rows of one seed run folder, one per engine in it.

    Raises:
        InputError: ``summary.csv`` or ``manifest.json`` missing, not a seed run, or a row missing.
    """
    summary, manifest = run_dir / "summary.csv", run_dir / "manifest.json"
    for path in (summary, manifest):
        if not path.is_file():
            raise InputError(f"{path}: no such file (a `bench --suite seed` run folder?)")
    try:
        meta = json.loads(manifest.read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"{manifest}: not JSON ({err})") from None
    if meta.get("suite") != "seed":
        raise InputError(f"{manifest}: suite is {meta.get('suite')!r}, not 'seed'")
    cfg = meta.get("config", {})
    # (engine, side, metric) -> value; side: "native" (stack none), "stack" (superinfer with the
    # stack), "oracle" (the reference), "cmp" (the full/none comparisons)
    values: dict[tuple[str, str, str], float] = {}
    with summary.open(newline="") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            side = {"none": "native", "full/none": "cmp"}.get(r["stack"])
            side = side or ("oracle" if r["policy"] == "oracle" else "stack")
            try:  # empty: NaN (a class with no finished request in the window)
                values[r["engine"], side, r["metric"]] = float(r["value"] or "nan")
            except ValueError:
                raise InputError(
                    f"{summary}:{line}: value {r['value']!r} is not a number"
                ) from None
    popts = cfg.get("policy_options") or {}
    mine, theirs = popts.get("superinfer") or {}, popts.get("oracle") or {}
    rows = []
    for engine in dict.fromkeys(e for e, _, _ in values):

        def get(side: str, metric: str, engine: str = engine) -> float:
            try:
                return values[engine, side, metric]
            except KeyError:
                raise InputError(f"{summary}: no {engine} {side} row for {metric}") from None

        cmp = {name: get("cmp", name) for name in TARGETS}
        rows.append({
            "run": run_dir.name, "engine": engine, "rate_scale": cfg.get("rate_scale"),
            "duration_s": cfg.get("duration_s"),
            "engine_options": _options(cfg.get("engine_options")),
            "superinfer_options": _options(mine),
            "oracle_options": "same" if theirs == mine else _options(theirs),
            "native_attainment": get("native", "chat_slo_attainment"),
            "stack_attainment": get("stack", "chat_slo_attainment"),
            "oracle_attainment": get("oracle", "chat_slo_attainment"),
            **cmp,
            "all_four_met": all(_met(name, v) for name, v in cmp.items()),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="seed suite run folders")
    ap.add_argument("--out", type=Path, required=True, help="CSV to write")
    args = ap.parse_args(argv)
    try:
        rows = [row for run in args.runs for row in collect(run)]
    except InputError as err:
        print(f"seed_collect: {err}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    print(f"wrote {args.out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
