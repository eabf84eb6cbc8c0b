"""How much of the simulated CPU engines' miss is the fit's total and the host's drift.

Each real run of ``superinfer bench --suite engines`` ran on a shared 2-core VM whose speed moved
between runs minutes apart (the same step shapes took up to 1.6x as long in one run as in the
rest). The simulator replays every run with one fit of all the suite's steps, so a slow run's
queue looks like a mechanism the simulator lacks. This replays each ``--src`` folder's simulated
rows three ways (``suites_engines_replay.resimulate``, deterministic):

* ``as_run``: with the folder's own fit (or ``FIT``), as ``fidelity_cpu.py --resim`` does;
* ``refit``: with today's fit of the folder's step log, as the suite fits it
  (``suites_engines_knee.step_log_fit``: ``offline.calibrate_hf.fit_steps``, which scales the
  least squares to the steps' total time), the folder's other keys (``request_latency_ms``)
  kept; a fit without a request path gets the one the suite measures today
  (``suites_engines_knee.request_path_ms``) where the folder kept the lone pass's step log
  (``lone_steps.parquet``; ``sglang-view-knee``'s fit was made before the suite measured it);
* ``host_speed``: the refit, each cell at its real run's host speed (the run's measured step time
  over the refit's prediction, summed over its steps: ``offline.calibrate_hf.run_speeds``);

and writes into ``--out``:

* ``host_speed.csv``: ``src, engine, run, host_speed`` (one row per real run, against the refit);
* ``host_speed_fidelity.csv``: ``src, replay`` and the columns of ``fidelity_cpu.py``'s files,
  every row of the three replays;
* ``host_speed_summary.csv``: :data:`SUMMARY` (rows within issue 19's bounds of those judged,
  per replay; the refit's ``total_scale``; the runs' host speeds; the refit's
  ``request_latency_ms``).

A host-speed replay is not a prediction (its factor is read off the run it replays); it tells
the rows the mechanics miss from the rows a slower or faster host moved.

Usage: ``python benchmarks/fidelity_host_speed.py --src DIR[=FIT] ... [--out DIR]``, ``FIT``: a
step-time file to replay that folder with instead of its own (as ``fidelity_cpu.py --fit``); the
refits go to a temporary folder the last line names.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.errors import UserError
from superinfer.harness.suites_engines_fidelity import (
    FIDELITY_CSV_COLUMNS,
    fidelity,
    fidelity_csv,
    within_count,
)
from superinfer.harness.suites_engines_knee import request_path_ms, step_log_fit
from superinfer.harness.suites_engines_options import SGLANG, SIM_OF
from superinfer.harness.suites_engines_replay import host_speeds, resimulate
from superinfer.harness.suites_engines_report import aggregate

SUMMARY = ["src", "sim_engine", "judged", "within_as_run", "within_refit", "within_host_speed",
           "total_scale", "speed_min", "speed_median", "speed_max",
           "request_latency_ms"]  # fmt: skip
#: The replays, in order.
REPLAYS = ("as_run", "refit", "host_speed")


def parse_src(text: str) -> tuple[Path, Path | None]:
    """``DIR`` or ``DIR=FIT`` -> ``(folder, fit or None)``."""
    folder, _, fit = text.partition("=")
    return Path(folder), Path(fit) if fit else None


def sim_engine_of(src: Path) -> str:
    """The simulated engine whose real rows ``src/summary.csv`` holds (the first found).

    Raises:
        UserError: no summary, or no real engine of a simulated CPU engine in it.
    """
    try:
        engines = set(pd.read_csv(src / "summary.csv", usecols=["engine"])["engine"])
    except (OSError, ValueError) as exc:
        raise UserError(f"{src / 'summary.csv'}: {exc}") from None
    for sim, real in SIM_OF.items():
        if real in engines:
            return sim
    raise UserError(f"{src / 'summary.csv'}: no rows of {', '.join(SIM_OF.values())}")


def refit(src: Path, fit: Path | None, real: str, out: Path) -> dict[str, Any]:
    """Today's fit of ``real``'s runs in ``src/steps.parquet``, as the suite fits them
    (``suites_engines_knee.step_log_fit``), over the keys of ``src``'s own fit (or ``fit``);
    written to ``out`` and returned.

    Raises:
        UserError: no step log, an unreadable fit, too few steps to fit, or an unreadable
            ``lone.csv`` or lone step log (:func:`lone_request_path`).
    """
    own = fit or src / f"{real}_step_time.json"
    try:
        doc = json.loads(own.read_text(encoding="utf-8"))
        steps = pd.read_parquet(src / "steps.parquet")
    except (OSError, ValueError) as exc:
        raise UserError(str(exc)) from None
    got = step_log_fit(steps, real, {}, iterations=real == SGLANG)
    if got is None:
        raise UserError(f"{src / 'steps.parquet'}: too few steps of {real} to fit")
    doc.update({k: v for k, v in got.items() if k != "lone"})
    if "request_latency_ms" not in doc and (ms := lone_request_path(src, real)) is not None:
        doc["request_latency_ms"] = ms
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return doc


def lone_request_path(src: Path, real: str) -> float | None:
    """The request path of ``real``'s server, ms, measured as the suite measures it today
    (``suites_engines_knee.request_path_ms``) on ``src``'s lone requests (``lone.csv``, those
    sent one at a time: ``concurrency`` 1) and the lone pass's step log (``lone_steps.parquet``);
    ``None`` when the folder kept no such log, the pairing is not safe, or no lone request
    finished.

    Raises:
        UserError: an unreadable ``lone.csv`` or step log, or a ``lone.csv`` without an
            ``engine`` column.
    """
    log = src / "lone_steps.parquet"
    if not log.is_file():
        return None
    try:
        lone = pd.read_csv(src / "lone.csv")
        steps = pd.read_parquet(log)
    except (OSError, ValueError) as exc:
        raise UserError(str(exc)) from None
    if "engine" not in lone.columns:
        raise UserError(f"{src / 'lone.csv'}: no engine column")
    if "concurrency" in lone.columns:
        lone = lone[lone["concurrency"] == 1]
    return request_path_ms(lone[lone["engine"] == real], steps)


def replay_all(src: Path, fit: Path | None, work: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """``(fidelity rows of the three replays, host speeds, summary row)`` of one folder; the refit
    is written into ``work``.

    Raises:
        UserError: a missing file (the step log among them) or a bad fit.
    """
    sim = sim_engine_of(src)
    real = SIM_OF[sim]
    new = work / f"{src.name}_{real}_step_time.json"
    doc = refit(src, fit, real, new)
    speeds = host_speeds(src, new, real)
    frames = []
    for replay, use, at in (("as_run", fit, None), ("refit", new, None),
                            ("host_speed", new, speeds)):  # fmt: skip
        summary = resimulate(src, sim, fit=use, speeds=at)
        rows = fidelity_csv(fidelity(aggregate(summary)))
        frames.append(rows.assign(src=src.name, replay=replay))
    table = pd.DataFrame(
        {"src": src.name, "engine": real, "run": list(speeds), "host_speed": list(speeds.values())}
    )
    within = {f"within_{r}": within_count(f)[0] for r, f in zip(REPLAYS, frames, strict=True)}
    s = table["host_speed"]
    row = {"src": src.name, "sim_engine": sim, "judged": within_count(frames[0])[1], **within,
           "total_scale": doc["total_scale"], "speed_min": s.min(), "speed_median": s.median(),
           "speed_max": s.max(), "request_latency_ms": doc.get("request_latency_ms")}  # fmt: skip
    out = pd.concat(frames, ignore_index=True)
    return out[["src", "replay", *FIDELITY_CSV_COLUMNS]], table, row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", action="append", required=True, metavar="DIR[=FIT]",
                    help="a suite run folder with its steps.parquet, repeatable")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("results/fidelity"))
    args = ap.parse_args(argv)
    rows, speeds, summary = [], [], []
    work = Path(tempfile.mkdtemp(prefix="host-speed-fits-"))
    for text in args.src:
        src, fit = parse_src(text)
        try:
            got, table, row = replay_all(src, fit, work)
        except UserError as exc:
            print(f"error: {src}: {exc}", file=sys.stderr)
            return 2
        rows.append(got)
        speeds.append(table)
        summary.append(row)
        span = f"{row['speed_min']:.3f}-{row['speed_max']:.3f}"
        print(f"{src.name}: {row['within_as_run']} -> {row['within_refit']} -> "
              f"{row['within_host_speed']} of {row['judged']} rows within (total scale "
              f"{row['total_scale']:.3f}, host speed {span})")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    files = {
        "host_speed.csv": pd.concat(speeds, ignore_index=True),
        "host_speed_fidelity.csv": pd.concat(rows, ignore_index=True),
        "host_speed_summary.csv": pd.DataFrame(summary, columns=SUMMARY),
    }
    for name, frame in files.items():
        frame.to_csv(args.out / name, index=False, float_format="%.6g")
    total = pd.DataFrame(summary)
    counts = " -> ".join(str(total[f"within_{r}"].sum()) for r in REPLAYS)
    print(f"all: {counts} of {total['judged'].sum()} rows within (refits in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
