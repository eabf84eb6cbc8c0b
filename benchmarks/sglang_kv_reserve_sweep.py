"""``superinfer``'s KV reserve for TTFT arrivals (``ttft_kv_reserve_requests``) swept on
``sim:sglang-cpu`` replays of real SGLang suite runs (issue 18).

Each ``--src`` is a ``superinfer bench --suite engines`` folder with SGLang rows; its simulated
rows are replayed (``suites_engines_replay.resimulate``: the run's arrivals per repeat, loads,
SLOs and step-time fit, or ``--fit SRC=FILE``'s) under ``superinfer`` with each reserve of
``--reserve``, the plugin's other options as the suite sets them. Deterministic. One row per
(source, load, reserve), means over the repeats (``chat_rejected``: the sum):

``src, load, reserve, repeats, chat_attainment, chat_rejected, chat_ttft_p99_ms,
batch_attainment, batch_e2e_p50_ms, output_tok_s, option``

``--option NAME`` sweeps another ``superinfer`` option instead (``reserve`` then holds its
value, ``option`` its name), and ``--set KEY=VALUE`` (repeatable) fixes others for every replay,
e.g. ``--option ttft_seat_reserve --reserve 0,1,2,3 --set serial_whole_prefills=false``.

Usage: ``python benchmarks/sglang_kv_reserve_sweep.py --src results/engines-cpu/sglang-knee2
--src results/engines-cpu/sglang-steps --fit
sglang-steps=results/fidelity/sglang_step_time_sglang-steps.json --reserve 0,1,2,3,4,6,8 --out
results/engines-cpu/kv_reserve_sweep.csv``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from superinfer.adapters.manager import UnknownPolicyError
from superinfer.harness.errors import UserError
from superinfer.harness.suites_engines_replay import resimulate

COLUMNS = ["src", "load", "reserve", "repeats", "chat_attainment", "chat_rejected",
           "chat_ttft_p99_ms", "batch_attainment", "batch_e2e_p50_ms", "output_tok_s",
           "option"]  # fmt: skip
#: The option swept unless ``--option`` names another.
DEFAULT_OPTION = "ttft_kv_reserve_requests"


def sweep_rows(src: Path, reserves: list[int] | list[str], fit: Path | None,
               option: str = DEFAULT_OPTION,
               fixed: dict[str, str] | None = None) -> pd.DataFrame:  # fmt: skip
    """The rows of :data:`COLUMNS` for one source folder, every load and value of ``option``
    (``fixed``: other ``superinfer`` options for every replay).

    Raises:
        UserError: ``src`` is not a suite run folder.
        superinfer.adapters.manager.UnknownPolicyError: a bad option or value.
    """
    rows = []
    for k in reserves:
        options = {**(fixed or {}), option: str(k)}
        got = resimulate(src, "sim:sglang-cpu", fit=fit, superinfer_options=options)
        sim = got[(got["engine"] == "sim:sglang-cpu") & (got["policy"] == "superinfer")]
        for load, runs in sim.groupby("load"):
            chat = runs[runs["slo_class"] == "chat"]
            batch = runs[runs["slo_class"] == "batch"]
            every = runs[runs["slo_class"] == "all"]
            rows.append({
                "src": src.name, "load": load, "reserve": k, "repeats": len(every),
                "chat_attainment": chat["slo_attainment"].mean(),
                "chat_rejected": int(chat["n_rejected"].sum()),
                "chat_ttft_p99_ms": chat["ttft_p99_ms"].mean(),
                "batch_attainment": batch["slo_attainment"].mean(),
                "batch_e2e_p50_ms": batch["e2e_p50_ms"].mean(),
                "output_tok_s": every["output_tok_s"].mean(), "option": option,
            })  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", action="append", required=True, help="suite run folder, repeatable")
    ap.add_argument("--fit", action="append", default=[], help="SRC_NAME=FILE: its step-time fit")
    ap.add_argument("--reserve", default="0,1,2,3,4,6,8", help="reserves (values) to sweep")
    ap.add_argument("--option", default=DEFAULT_OPTION, help="superinfer option to sweep")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every replay")
    ap.add_argument("--out", default="results/engines-cpu/kv_reserve_sweep.csv")
    args = ap.parse_args(argv)
    try:
        values = args.reserve.split(",")
        reserves = [int(x) for x in values] if args.option == DEFAULT_OPTION else values
        fits = dict(f.split("=", 1) for f in args.fit)
        fixed = dict(f.split("=", 1) for f in args.set)
    except ValueError:
        print(f"error: --reserve {args.reserve!r} / --fit {args.fit} / --set {args.set}: "
              "integers, NAME=FILE, KEY=VALUE", file=sys.stderr)  # fmt: skip
        return 2
    frames = []
    for src in map(Path, args.src):
        fit = Path(fits[src.name]) if src.name in fits else None
        try:
            frames.append(sweep_rows(src, reserves, fit, args.option, fixed))
        except (UserError, UnknownPolicyError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    out = pd.concat(frames, ignore_index=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False, float_format="%.6g")
    print(out.round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
