"""Join one-repeat engines-suite runs, made interleaved by arrival seed, into one run per setup.

Two server setups compared on a shared, drifting host are best run interleaved: setup A on
seed 6, setup B on seed 6, A on seed 7, and so on, each a ``superinfer bench --suite engines
--engine-option suite.repeats=1 --seed S`` run. Repeat ``r`` of a suite run draws its arrivals
with seed ``seed + r``, so the one-repeat runs on seeds ``S0, S0 + 1, ...`` are exactly the
repeats of one run on seed ``S0``. This joins each setup's runs into that run's files, named
``NAME_*`` in ``--out`` (as ``benchmarks/sglang_mixed_cost.py --default-run PREFIX`` reads
them; copied into a folder without the prefix, they are a suite run folder):

* ``NAME_summary.csv``: the runs' rows, ``repeat`` set to ``seed - S0``;
* ``NAME_steps.parquet``: the runs' step logs, each ``run`` name's last field (the repeat) set
  the same way;
* ``NAME_run_manifest.json``: the first run's manifest, with ``seed`` ``S0``,
  ``options.repeats`` the number of runs, and ``joined_from`` (each run's folder, seed,
  ``git_sha`` and ``created_utc``).

It also writes, into ``--out``, for the setups together: ``aggregate.csv``, per setup, policy
and class, the mean, min and max over the repeats of ``slo_attainment, ttft_p99_ms,
tpot_p50_ms`` and of ``output_tok_s`` (class ``all``); and ``run_speed.csv``, each run's host
speed read in its decode steps, the one kind of step both setups run alike: ``slowness`` =
the run's decode steps' measured time over a decode step-time model fitted on every setup's
decode steps together (``offline.calibrate_hf.fit_steps``; > 1: the host ran slower than
usual), beside the run's ``output_tok_s`` (columns ``setup, policy, repeat, output_tok_s,
slowness``).

Usage::

    python benchmarks/sglang_interleaved.py --setup fixed=/tmp/r/fixed-s6,/tmp/r/fixed-s7 \\
        --setup default=/tmp/r/default-s6,/tmp/r/default-s7 --out results/some-folder

(writes ``fixed_*`` and ``default_*`` files, ``aggregate.csv`` and ``run_speed.csv`` into
``results/some-folder``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.errors import UserError
from superinfer.harness.report.results import CSV_FLOAT_FORMAT

COLUMNS = ("slo_attainment", "ttft_p99_ms", "tpot_p50_ms", "output_tok_s")


def join(dirs: list[Path], out: Path, name: str) -> pd.DataFrame:
    """Join the one-repeat runs in ``dirs`` (seeds consecutive from the first) into ``out``'s
    ``name_*`` files; returns the joined summary.

    Raises:
        UserError: a folder without ``summary.csv``, ``steps.parquet`` or ``manifest.json``, a
            run of more than one repeat, or seeds that are not consecutive in the given order.
    """
    manifests, summaries, steps = [], [], []
    for d in dirs:
        try:
            manifest = json.loads((d / "manifest.json").read_text())
            summary, log = pd.read_csv(d / "summary.csv"), pd.read_parquet(d / "steps.parquet")
        except (OSError, ValueError) as exc:
            raise UserError(f"{d}: not a suite run folder ({exc})") from None
        if manifest.get("options", {}).get("repeats") != 1:
            raise UserError(f"{d}: a run of {manifest['options'].get('repeats')} repeats, not 1")
        manifests.append(manifest)
        summaries.append(summary)
        steps.append(log)
    first = int(manifests[0]["seed"])
    seeds = [int(m["seed"]) for m in manifests]
    if seeds != list(range(first, first + len(dirs))):
        raise UserError(f"seeds {seeds}: not consecutive from {first} in the order given")
    for rep, (summary, log) in enumerate(zip(summaries, steps, strict=True)):
        summary["repeat"] = rep
        log["run"] = log["run"].str.replace(r"_\d+$", f"_{rep}", regex=True)
    joined: dict[str, Any] = dict(manifests[0])
    joined["options"] = {**joined["options"], "repeats": len(dirs)}
    keep = ("seed", "git_sha", "created_utc")
    joined["joined_from"] = [
        {"folder": str(d), **{k: m[k] for k in keep}} for d, m in zip(dirs, manifests, strict=True)
    ]
    out.mkdir(parents=True, exist_ok=True)
    summary = pd.concat(summaries, ignore_index=True)
    summary.to_csv(out / f"{name}_summary.csv", index=False, float_format=CSV_FLOAT_FORMAT)
    pd.concat(steps, ignore_index=True).to_parquet(out / f"{name}_steps.parquet", index=False)
    (out / f"{name}_run_manifest.json").write_text(json.dumps(joined, indent=2) + "\n")
    return summary


def aggregate(summaries: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per setup, policy, class and column of :data:`COLUMNS`: mean, min and max over the
    repeats (``output_tok_s`` of class ``all`` only; the others of every class)."""
    rows = []
    for setup, summary in summaries.items():
        for (policy, cls), grp in summary.groupby(["policy", "slo_class"], sort=True):
            for col in COLUMNS:
                if (col == "output_tok_s") != (cls == "all"):
                    continue
                vals = grp[col].astype(float)
                rows.append(
                    {
                        "setup": setup, "policy": policy, "slo_class": cls, "metric": col,
                        "n": len(vals), "mean": vals.mean(), "min": vals.min(), "max": vals.max(),
                    }
                )  # fmt: skip
    return pd.DataFrame(rows)


def run_speed(out: Path, summaries: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Each run's ``slowness`` in its decode steps (module docstring), from the setups'
    ``NAME_steps.parquet`` in ``out``."""
    from superinfer.harness.offline.calibrate_hf import fit_steps
    from superinfer.sim.hf_cpu import shape_of_totals

    logs = {name: pd.read_parquet(out / f"{name}_steps.parquet") for name in summaries}
    dec = pd.concat(
        [log[log["kind"] == "decode"].assign(setup=name) for name, log in logs.items()],
        ignore_index=True,
    )
    model, _ = fit_steps(dec.copy())
    shapes = (
        shape_of_totals(int(n), int(n), int(n), int(k))
        for n, k in zip(dec["num_seqs"], dec["kv_tokens"], strict=True)
    )
    dec["predicted_ms"] = [model.step_time_s(shape) * 1e3 for shape in shapes]
    by_run = dec.groupby(["setup", "run"])[["duration_ms", "predicted_ms"]].sum()
    rows = []
    for name, summary in summaries.items():
        for _, r in summary[summary["slo_class"] == "all"].iterrows():
            run = f"{r['engine']}_{r['policy']}_{r['load']}_{int(r['repeat'])}"
            measured, predicted = by_run.loc[(name, run)]
            rows.append(
                {
                    "setup": name, "policy": r["policy"], "repeat": int(r["repeat"]),
                    "output_tok_s": r["output_tok_s"], "slowness": measured / predicted,
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", action="append", required=True, metavar="NAME=DIR,DIR,...")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    summaries = {}
    try:
        for spec in args.setup:
            name, sep, dirs = spec.partition("=")
            if not sep or not name or not dirs:
                raise UserError(f"--setup {spec!r}: expected NAME=DIR,DIR,...")
            paths = [Path(d) for d in dirs.split(",") if d]
            summaries[name] = join(paths, args.out, name)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    agg = aggregate(summaries)
    agg.to_csv(args.out / "aggregate.csv", index=False, float_format=CSV_FLOAT_FORMAT)
    print(agg.to_string(index=False))
    speed = run_speed(args.out, summaries)
    speed.to_csv(args.out / "run_speed.csv", index=False, float_format=CSV_FLOAT_FORMAT)
    print(speed.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
