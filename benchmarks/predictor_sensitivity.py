"""Sensitivity of the reuse predictor's hit rate to its hyperparameters, on the Mooncake trace at
HBM capacity 0.1 without a CPU tier (the issue-6 target point). The defaults were fixed before
this ran; this shows how much (little) tuning them could move the result.

Writes ``results/cache/predictor_sensitivity.csv`` (variant, option, value, block_hit_rate,
token_hit_rate, switched_at_s, wall_s), with LRU and Belady as reference rows.

    .venv/bin/python benchmarks/predictor_sensitivity.py [--jobs 2]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import pandas as pd

from superinfer.harness.offline.cache_eval import BlockTrace, load_cache_trace, replay
from superinfer.policy_core.reuse import ReusePredictorConfig

CAPACITY_FRAC = 0.1
DEFAULT = ReusePredictorConfig()
VARIANTS: list[tuple[str, str, object]] = [
    ("default", "", ""),
    ("horizon x0.5", "horizon_scale", 0.5),
    ("horizon x2", "horizon_scale", 2.0),
    ("64 samples per call", "samples_per_call", 64),
    ("learning rate 0.03", "learning_rate", 0.03),
    ("learning rate 0.3", "learning_rate", 0.3),
    ("cold start until 10k labels", "min_labels", 10_000),
    ("seed 1", "seed", 1),
]


def _run(args: tuple[BlockTrace, str, str, object]) -> dict[str, object]:
    trace, name, option, value = args
    hbm = int(CAPACITY_FRAC * trace.num_unique)
    if name in ("lru", "belady"):
        res = replay(trace, name, CAPACITY_FRAC, hbm)
    else:
        cfg = replace(DEFAULT, **{option: value}) if option else DEFAULT
        res = replay(trace, "predictor", CAPACITY_FRAC, hbm, predictor_config=cfg)
    return {
        "variant": name,
        "option": option,
        "value": value,
        "block_hit_rate": res.block_hit_rate,
        "token_hit_rate": res.token_hit_rate,
        "switched_at_s": (res.predictor or {}).get("switched_at_s"),
        "wall_s": res.wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/cache/predictor_sensitivity.csv"))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    trace = load_cache_trace("mooncake")
    tasks = [(trace, "lru", "", ""), (trace, "belady", "", "")]
    tasks += [(trace, name, option, value) for name, option, value in VARIANTS]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_run, tasks))
    table = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False, float_format="%.6g")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
