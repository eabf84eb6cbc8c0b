"""Are TensorRT-LLM 0.14's "202/214" online rows fixed lengths or a ShareGPT-like mix? (issue 19)

The 0.14 online-serving table (``shared/data/published/engine_perf.csv`` rows 123-302; Triton
``tensorrtllm_backend``, BF16, 500 requests per point, H100) lists three workloads by ISL/OSL:
467/256, 467/16 and 202/214, and names no dataset. The calibration simulates all three as fixed
lengths. At QPS=INF the 467/x setups land within 8.2 % of the published throughput, the 202/214
ones 83 % too fast (rows 208, 211, 212; 298, 301, 302), which is most of TensorRT-LLM's p90
max-load miss (``results/fidelity/README.md``). 202 is the mean ShareGPT prompt the vLLM 0.6.0
blog states (``calibrate_published_sim.SHAREGPT_MEAN_IN``), and a mix of lengths does what the
published row shows: with every request queued at once, the run lasts until its longest output
ends, so output tokens per second fall while the mean ITL of the long-running batch does not.

This script simulates each 202/214 row twice, as the calibration does (``simulate``: the
release profile, ``sim/engine_costs.json``, ``fcfs``, the same 500 requests, the same seeded
Poisson arrivals) with fixed 202/214 lengths and with ShareGPT lengths
(``_sharegpt_lengths``: the ShareGPT length table under ``bench_serving``'s filter, scaled to
mean 202 prompt / 214 output tokens), and prints published, both simulations and their
``rel_err`` for every metric of the rows: request, output and total-token throughput, mean TTFT,
mean ITL. ``--out FILE`` writes the same as csv (``source_row, setup, metric, published,
fixed, sharegpt, rel_err_fixed, rel_err_sharegpt``).

These rows are ``score`` rows of the calibration, and the reading was chosen by looking at them,
so this is a diagnosis, not a fit: ``published.csv`` and the fitted costs do not change.

Usage (about 1 minute)::

    python benchmarks/trtllm_014_lengths.py [--out results/fidelity/trtllm_014_lengths.csv]
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import replace
from pathlib import Path

import superinfer.harness.offline.calibrate_published_sim as cps
from superinfer.harness.workload.data import data_dir
from superinfer.sim.engine_costs import load_costs

#: The workload's published mean output length (the table's OSL column).
OSL_202 = 214.0
COLUMNS = ("source_row", "setup", "metric", "published", "fixed", "sharegpt", "rel_err_fixed",
           "rel_err_sharegpt")  # fmt: skip


def sharegpt_202_214(setup: cps.Setup, base: Path) -> dict[str, float]:
    """``setup`` simulated with ShareGPT lengths of mean 202 prompt / 214 output tokens."""
    metrics: dict[str, float] = cps.simulate(
        replace(setup, isl=0, osl=0), load_costs(), base, sharegpt_means=(202.0, OSL_202)
    )
    return metrics


def rows_202_214() -> list[tuple[dict[str, str], cps.Setup, str]]:
    """The simulable 0.14 rows of the 202/214 workload, in ``row_id`` order, each with its
    setup and metric key."""
    out = []
    for row in cps.load_rows():
        setup, _ = cps.setup_of(row)
        if setup is None or setup.release != "trtllm-0.14" or (setup.isl, setup.osl) != (202, 214):
            continue
        key = cps._metric_key(row)
        if key is not None:
            out.append((row, setup, key))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="also write the table as csv")
    args = ap.parse_args()
    base = data_dir()
    assert base is not None
    cache: dict[cps.Setup, tuple[dict[str, float], dict[str, float]]] = {}
    table = []
    for row, setup, key in rows_202_214():
        if setup not in cache:
            cache[setup] = (cps.simulate(setup, load_costs(), base), sharegpt_202_214(setup, base))
        fixed, mixed = cache[setup]
        pub = float(row["value"])
        f, s = fixed.get(key), mixed.get(key)
        if f is None or s is None:
            continue
        table.append((row["row_id"], setup.label, key, pub, f, s, f / pub - 1, s / pub - 1))
    print(f"{'row':>4} {'setup':58} {'metric':28} {'published':>10} {'fixed':>10} "
          f"{'sharegpt':>10} {'err fixed':>9} {'err sgpt':>9}")  # fmt: skip
    for r in table:
        print(f"{r[0]:>4} {r[1]:58} {r[2]:28} {r[3]:>10.1f} {r[4]:>10.1f} {r[5]:>10.1f} "
              f"{r[6]:>+9.1%} {r[7]:>+9.1%}")  # fmt: skip
    if args.out:
        with open(args.out, "w", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(COLUMNS)
            for r in table:
                w.writerow([r[0], r[1], r[2], f"{r[3]:g}", f"{r[4]:.6g}", f"{r[5]:.6g}",
                            f"{r[6]:.4f}", f"{r[7]:.4f}"])  # fmt: skip
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
