"""The simulated CPU engines against their real runs, per engine (issue 19's real-engine files).

Reads the fidelity rows of a ``superinfer bench --suite engines`` run (``fidelity.csv``: every
simulated row of ``sim:hf-cpu`` and ``sim:sglang-cpu`` beside the real ``hf`` and SGLang rows it
replays: the same workload, seeds, loads and SLOs; means over the repeats) and writes one file
per real engine into ``--out``:

* ``hf.csv``: ``sim:hf-cpu`` against the real transformers engine;
* ``sglang_cpu.csv``: ``sim:sglang-cpu`` against the real SGLang 0.5.23 CPU server.

Columns: ``engine, policy, load, slo_class, metric, real, simulated, abs_err, rel_err, bound,
within`` (``rel_err = (simulated - real) / real``; bounds of issue 19: a p50 within 0.15, a p99
within 0.25, attainment within 3 points; preemptions and cached prompt tokens are reported,
not judged). The rows are the suite's, renamed, not recomputed
(``harness/suites_engines_report.py::fidelity``).

Usage: ``python benchmarks/fidelity_cpu.py [--src results/engines-cpu] [--out results/fidelity]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

#: Simulated engine -> the file its rows go to.
FILES = {"sim:hf-cpu": "hf.csv", "sim:sglang-cpu": "sglang_cpu.csv"}
COLUMNS = ["engine", "policy", "load", "slo_class", "metric", "real", "simulated", "abs_err",
           "rel_err", "bound", "within"]  # fmt: skip


def split(fid: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``fidelity.csv``'s rows -> ``{file name: rows}`` per :data:`FILES` (columns
    :data:`COLUMNS`); raises ``ValueError`` naming a missing column."""
    need = {"sim_engine", "engine", "policy", "load", "slo_class", "metric", "real", "sim",
            "abs_err", "rel_err", "bound", "within"}  # fmt: skip
    missing = sorted(need - set(fid.columns))
    if missing:
        raise ValueError(f"fidelity.csv: missing column(s) {', '.join(missing)}")
    out = {}
    for sim, name in FILES.items():
        part = fid[fid["sim_engine"] == sim].rename(columns={"sim": "simulated"})
        out[name] = part[COLUMNS].reset_index(drop=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path("results/engines-cpu"))
    ap.add_argument("--out", type=Path, default=Path("results/fidelity"))
    args = ap.parse_args(argv)
    path = args.src / "fidelity.csv"
    try:
        parts = split(pd.read_csv(path))
    except (OSError, ValueError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in parts.items():
        rows.to_csv(args.out / name, index=False, float_format="%.6g")
        judged = rows[rows["within"].notna()]
        n_in = int(judged["within"].astype(bool).sum())
        print(f"wrote {args.out / name}: {len(rows)} rows, {n_in} of {len(judged)} within bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
