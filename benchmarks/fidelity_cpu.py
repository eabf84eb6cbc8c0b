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
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from superinfer.harness.suites_engines_fidelity import fidelity, within_count
from superinfer.harness.suites_engines_report import aggregate

#: Simulated engine -> the file its rows go to.
FILES = {"sim:hf-cpu": "hf.csv", "sim:sglang-cpu": "sglang_cpu.csv"}
#: A summary row's identity: one run's class.
KEYS = ["engine", "policy", "repeat", "load", "slo_class"]
COLUMNS = ["engine", "policy", "load", "slo_class", "metric", "real", "simulated", "abs_err",
           "rel_err", "bound", "within"]  # fmt: skip


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
        part = fid[fid["sim_engine"] == sim].rename(columns={"sim": "simulated"})
        out[name] = part[COLUMNS].reset_index(drop=True)
    return out


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
    args = ap.parse_args(argv)
    frames = []
    for src in args.src or [Path("results/engines-cpu")]:
        path = src / "summary.csv"
        try:
            frames.append(pd.read_csv(path))
        except (OSError, ValueError) as exc:
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
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in parts.items():
        rows.to_csv(args.out / name, index=False, float_format="%.6g")
        n_in, n_judged = within_count(rows)
        print(f"wrote {args.out / name}: {len(rows)} rows, {n_in} of {n_judged} within bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
