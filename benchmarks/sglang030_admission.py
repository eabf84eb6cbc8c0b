"""Would SGLang 0.3.1's ``ignore_eos`` admission explain 0.3.0's 70B max-load row? (issue 19)

``results/fidelity/published.csv`` has SGLang 0.3.0's Llama-3.1-70B, 4 x H100 max-load run
(rows 644/645) 13.9 % faster than published, with the 8B run (640/641) fitted. The published
runs used ``python -m sglang.bench_serving``, which sends ``ignore_eos`` unless
``--disable-ignore-eos``, with ``--disable-radix-cache``; SGLang 0.3.1 and later admit such
requests by a finish-aware check (``PrefillAdder.add_one_req_ignore_eos``, modelled as
``EngineProfile.finish_aware_admission``, :func:`superinfer.policy_core.batching.
finish_aware_fits`) instead of the ``new_token_ratio`` reserve the ``sim:sglang@0.3.0`` profile
uses. This script simulates every SGLang 0.3.0 setup of the published rows as the calibration
does (``calibrate_published_sim.simulate``: same request counts, ``fcfs``, the installed
``sim/engine_costs.json`` and the release's request-path latency) with the rule off (the
profile as it is) and on, and writes one row per published number. (It moved them by under 0.1
point; and 0.3.0 itself turned out to have no such path: its PyPI wheel's ``policy_scheduler.py``
charges ``new_token_ratio`` for every request, as the profile does; the rule ships from 0.3.1.)

Columns: ``source_row, setup, metric, published, sim_off, sim_on, rel_err_off, rel_err_on``
(``rel_err = (sim - published) / published``). Deterministic; about 2 minutes on 2 cores::

    python benchmarks/sglang030_admission.py --out results/fidelity/sglang030_admission.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from superinfer.harness.errors import DataError
from superinfer.harness.offline.calibrate_published import with_request_latency
from superinfer.harness.offline.calibrate_published_sim import (
    _metric_key,
    load_rows,
    setup_of,
    simulate,
)
from superinfer.harness.workload.data import data_dir
from superinfer.sim.engine_costs import load_costs

RELEASE = "sglang-0.3.0"
COLUMNS = ["source_row", "setup", "metric", "published", "sim_off", "sim_on",
           "rel_err_off", "rel_err_on"]  # fmt: skip


def table(base: Path, costs: dict[str, Any],
          simulate_fn: Callable[..., dict[str, float]] = simulate) -> list[list[Any]]:  # fmt: skip
    """The rows of the CSV (:data:`COLUMNS`), one per published number of an SGLang 0.3.0 setup
    that the simulation yields, from the published table under ``base`` and the cost
    parameters ``costs`` (``sim/engine_costs.json``'s shape); ``simulate_fn`` is
    ``calibrate_published_sim.simulate`` (replaceable in tests).

    Raises:
        DataError: the published table is missing or malformed.
        KeyError: ``costs`` has no request-path latency for SGLang 0.3.0.
        ValueError: a setup does not fit its GPUs.
    """
    latency = costs["request_latency_s"][RELEASE]["s"]
    numbers = {"cpu": costs["cpu"], "kernel_scale": costs["kernel_scale"]}
    rows = []
    for raw in load_rows(base / "published" / "engine_perf.csv"):
        setup, _ = setup_of(raw)
        metric = _metric_key(raw)
        if setup is not None and metric is not None and setup.release == RELEASE:
            rows.append((raw, setup, metric))
    sims = {}
    for setup in sorted({s for _, s, _ in rows}, key=lambda s: s.label):
        print(setup.label, flush=True)
        sims[setup] = tuple(
            with_request_latency(
                simulate_fn(setup, numbers, base, {"finish_aware_admission": on}), latency
            )
            for on in (False, True)
        )
    out = []
    for raw, setup, metric in rows:
        published = float(raw["value"])
        off, on = (m.get(metric) for m in sims[setup])
        if off is None or on is None:
            continue
        out.append([raw["row_id"], setup.label, metric, published, round(off, 4), round(on, 4),
                    round((off - published) / published, 4),
                    round((on - published) / published, 4)])  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="CSV to write")
    args = ap.parse_args(argv)
    base = data_dir()
    if base is None:
        print("error: no shared data folder found (set SUPERINFER_DATA)", file=sys.stderr)
        return 2
    try:
        rows = table(base, load_costs())
    except (DataError, KeyError, ValueError) as exc:
        print(f"error: {base / 'published' / 'engine_perf.csv'} or "
              f"sim/engine_costs.json: {exc}", file=sys.stderr)  # fmt: skip
        return 2
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(COLUMNS)
            w.writerows(rows)
    except OSError as exc:
        print(f"error: {args.out}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
