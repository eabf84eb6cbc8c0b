"""The simulated CPU engines against their real runs, per engine (issue 19's real-engine files).

Reads the ``summary.csv`` of a ``superinfer bench --suite engines`` run (the simulated
``sim:hf-cpu`` and ``sim:sglang-cpu`` rows replay the real ``hf`` and SGLang rows' workload:
the same arrivals per repeat, loads and SLOs), compares their means over the repeats with
``harness/suites_engines_fidelity.py::fidelity`` and writes one file per real engine into ``--out``:

* ``hf.csv``: ``sim:hf-cpu`` against the real transformers engine;
* ``sglang_cpu.csv``: ``sim:sglang-cpu`` against the real SGLang 0.5.23 CPU server.

Columns: ``engine, policy, load, slo_class, metric, real, simulated, abs_err, rel_err, bound,
within`` (``rel_err = (simulated - real) / real``; bounds of issue 19: a p50 within 0.15, a p99
within 0.25, attainment within 3 points; preemptions and cached prompt tokens are reported,
not judged).

Usage: ``python benchmarks/fidelity_cpu.py [--src DIR ...] [--out results/fidelity]`` (default
``--src results/engines-cpu``; ``--src results/engines-cpu --src
results/engines-cpu/sglang-knee`` adds the SGLang knee run's loads).

``--resim ENGINE [--sim-option KEY=VALUE ...] [--superinfer-opt KEY=VALUE ...]`` replays that
simulated engine's rows against the same real rows first (``suites_engines_replay.resimulate``: the
run's arrivals, loads, SLOs and step-time fit, or ``--fit FILE``'s, plus the options, e.g.
``mechanics=sglang``, and superinfer's as the run recorded them), so a change to
the simulator is scored on real runs already made.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import click
import pandas as pd

from superinfer.cli_options import key_values
from superinfer.harness.errors import UserError
from superinfer.harness.suites_engines_fidelity import (
    FIDELITY_CSV_COLUMNS,
    fidelity,
    fidelity_csv,
    within_count,
)
from superinfer.harness.suites_engines_knee import with_seq_cost
from superinfer.harness.suites_engines_options import SIM_OF
from superinfer.harness.suites_engines_replay import resimulate
from superinfer.harness.suites_engines_report import aggregate

#: Simulated engine -> the file its rows go to.
FILES = {"sim:hf-cpu": "hf.csv", "sim:sglang-cpu": "sglang_cpu.csv"}
#: A summary row's identity: one run's class.
KEYS = ["engine", "policy", "repeat", "load", "slo_class"]
COLUMNS = FIDELITY_CSV_COLUMNS


def split(summary: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """A suite's ``summary.csv`` -> ``{file name: fidelity rows}`` per :data:`FILES` (columns
    :data:`COLUMNS`); raises ``ValueError`` naming a missing column."""
    missing = sorted(set(KEYS) - set(summary.columns))
    if missing:
        raise ValueError(f"missing column(s) {', '.join(missing)}")
    fid = fidelity(aggregate(summary))
    if fid.empty:
        raise ValueError("no simulated row beside a real one (run the suite with its sim engines)")
    out = {}
    for sim, name in FILES.items():
        out[name] = fidelity_csv(fid[fid["sim_engine"] == sim])
    return out


def _replay(
    summary: pd.DataFrame,
    src: Path,
    engine: str,
    extra: dict[str, str],
    superinfer: dict[str, str],
    args: argparse.Namespace,
) -> pd.DataFrame:
    """``summary`` with ``engine``'s simulated rows replayed (``--resim``; ``extra``: its
    ``--sim-option``s, ``superinfer``: the ``--superinfer-opt``s), if ``src`` ran its real
    engine."""
    real = SIM_OF[engine]
    if not (summary["engine"] == real).any():
        return summary
    fit = args.fit
    donors = [d / f"{real}_step_time.json" for d in args.seq_cost_from]
    donors = [d for d in donors if d.is_file()]
    if donors:
        fit = args.out / f"{real}_step_time_{src.name}.json"
        own = src / f"{real}_step_time.json"
        mine, theirs = json.loads(own.read_text()), json.loads(donors[0].read_text())
        derived = with_seq_cost(mine, theirs, str(donors[0]))
        fit.write_text(json.dumps(derived, indent=2) + "\n")
    kept = summary[~summary["engine"].isin((engine, real))]
    replayed = resimulate(src, engine, extra, fit, superinfer_options=superinfer)
    return pd.concat([kept, replayed], ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--src",
        type=Path,
        action="append",
        help="suite run folder(s), repeatable "
        "(their loads must not overlap) [default: results/engines-cpu]",
    )
    ap.add_argument("--out", type=Path, default=Path("results/fidelity"))
    ap.add_argument("--resim", choices=sorted(SIM_OF), action="append", default=[],
                    help="replay this simulated engine first, repeatable")  # fmt: skip
    ap.add_argument("--sim-option", action="append", default=[], metavar="KEY=VALUE",
                    help="a simulator option of --resim, repeatable")  # fmt: skip
    ap.add_argument("--fit", type=Path, default=None,
                    help="--resim: this step-time fit instead of each run's own")  # fmt: skip
    ap.add_argument("--seq-cost-from", type=Path, action="append", default=[], metavar="DIR",
                    help="--resim: each run's own fit with the per-sequence decode cost of the "
                    "fit of the first DIR that has one for that engine (a run with the batched "
                    "pass), scaled by the ratio of the two fits' intercepts; written to --out; "
                    "repeatable")  # fmt: skip
    ap.add_argument("--superinfer-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="--resim: a superinfer option over what the run recorded, repeatable "
                    "(e.g. tpot_plan_share=0.9 for a run that ran with it before the suite's "
                    "manifest recorded it)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        extra = key_values(tuple(args.sim_option), "--sim-option")
        superinfer = key_values(tuple(args.superinfer_opt), "--superinfer-opt")
    except click.BadParameter as exc:
        print(f"error: {exc.format_message()}", file=sys.stderr)
        return 2
    frames = []
    args.out.mkdir(parents=True, exist_ok=True)
    for src in args.src or [Path("results/engines-cpu")]:
        path = src / "summary.csv"
        try:
            summary = pd.read_csv(path)
            for engine in args.resim:
                summary = _replay(summary, src, engine, extra, superinfer, args)
            frames.append(summary)
        except (OSError, ValueError, KeyError, UserError) as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 2
    summary = pd.concat(frames, ignore_index=True)
    if summary.duplicated(KEYS).any():
        print("error: the --src runs share an (engine, policy, repeat, load)", file=sys.stderr)
        return 2
    try:
        parts = split(summary)
    except ValueError as exc:
        print(f"error: {', '.join(str(s) for s in args.src or [])}: {exc}", file=sys.stderr)
        return 2
    for name, rows in parts.items():
        rows.to_csv(args.out / name, index=False, float_format="%.6g")
        n_in, n_judged = within_count(rows)
        print(f"wrote {args.out / name}: {len(rows)} rows, {n_in} of {n_judged} within bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
