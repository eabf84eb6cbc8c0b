"""What chunked prefill costs on the real hf engine, per policy, from engines-suite step logs
(issue 18: why ``superinfer``'s yielding prefill floor lost output tok/s on hf).

Each ``--src`` is a ``superinfer bench --suite engines`` folder with hf rows
(``steps.parquet``: one row per real step). Per folder, two least-squares fits over every hf
step of every policy, and one row per policy:

- the **decode speed** of each policy's runs: every decode-only step's time over a fit, over the
  whole folder, of decode-only step time against 1, sequences and KV tokens; the mean of those
  ratios per policy (1.05: that policy's decode steps ran 5 % slower than the fit, read here as
  its runs' host speed, since a decode-only step carries no prefill; the suite's own
  ``host_speed.csv``, each run's steps of every kind against the folder's step-time fit, can
  read differently, by up to 4 % in results/engines-cpu);
- its busy time (the sum of step times, s) divided by that speed (``busy_norm_s``: the work its
  steps did, at the folder's speed), and that over ``fcfs``'s (``busy_norm_vs_fcfs``);
- its prefilling steps, their prefill tokens and median chunk;
- the folder's **step-cost fit** (``fit_*``): every hf step's time against 1, prefill tokens,
  decode sequences, prefill-plus-decode tokens x KV tokens (thousands), and whether the step
  prefilled at all (``fit_prefill_step_ms``: what a step pays for carrying any prefill, on top of
  its tokens). The same on every row of a folder.

Columns: ``src, policy, runs, steps, busy_s, decode_speed, busy_norm_s, busy_norm_vs_fcfs,
prefill_steps, prefill_tokens, median_chunk, fit_base_ms, fit_prefill_token_ms,
fit_decode_seq_ms, fit_token_kv_ms, fit_prefill_step_ms``

Usage: ``python benchmarks/hf_prefill_cost.py --src results/engines-cpu/hf-yields-0.333
--src results/engines-cpu/hf-yields-floor128-0.333 --out results/engines-cpu/hf_prefill_cost.csv``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

COLUMNS = ["src", "policy", "runs", "steps", "busy_s", "decode_speed", "busy_norm_s",
           "busy_norm_vs_fcfs", "prefill_steps", "prefill_tokens", "median_chunk",
           "fit_base_ms", "fit_prefill_token_ms", "fit_decode_seq_ms", "fit_token_kv_ms",
           "fit_prefill_step_ms"]  # fmt: skip
#: Columns of ``steps.parquet`` read here.
STEP_COLUMNS = ("engine", "policy", "run", "duration_ms", "num_seqs", "num_tokens",
                "num_prefill_tokens", "num_decode_tokens", "kv_tokens")  # fmt: skip


def _lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return coef


def cost_rows(steps: pd.DataFrame, src: str) -> pd.DataFrame:
    """The rows of :data:`COLUMNS` for one folder's step log (its hf rows).

    Args:
        steps: a ``steps.parquet`` frame (:data:`STEP_COLUMNS`; durations in ms).
        src: the folder's name, for the ``src`` column.

    Returns:
        One row per policy, sorted by policy; ``busy_norm_vs_fcfs`` NaN without ``fcfs`` rows.

    Raises:
        ValueError: a missing column, no hf step, or no decode-only or prefilling step to fit.
    """
    missing = [c for c in STEP_COLUMNS if c not in steps.columns]
    if missing:
        raise ValueError(f"{src}: steps.parquet lacks column {missing[0]!r}")
    s = steps[steps["engine"] == "hf"]
    if s.empty:
        raise ValueError(f"{src}: no hf step in steps.parquet")
    prefilling = s["num_prefill_tokens"] > 0
    dec = s[~prefilling]
    if dec.empty or not prefilling.any():
        raise ValueError(f"{src}: needs decode-only and prefilling hf steps to fit")
    y = s["duration_ms"].to_numpy(float)
    x = np.column_stack([
        np.ones(len(s)), s["num_prefill_tokens"], s["num_decode_tokens"],
        s["num_tokens"] * s["kv_tokens"] / 1e3, prefilling.astype(float),
    ])  # fmt: skip
    fit = _lstsq(x, y)
    xd = np.column_stack([np.ones(len(dec)), dec["num_seqs"], dec["kv_tokens"] / 1e3])
    yd = dec["duration_ms"].to_numpy(float)
    speed = yd / (xd @ _lstsq(xd, yd))
    speeds = pd.Series(speed, index=dec.index).groupby(dec["policy"]).mean()
    rows = []
    for policy, g in s.groupby("policy", sort=True):
        busy = g["duration_ms"].sum() / 1e3
        pf = g[g["num_prefill_tokens"] > 0]
        sp = float(speeds.get(policy, np.nan))
        rows.append([
            src, policy, g["run"].nunique(), len(g), busy, sp, busy / sp, np.nan, len(pf),
            int(pf["num_prefill_tokens"].sum()),
            float(pf["num_prefill_tokens"].median()) if len(pf) else np.nan, *fit,
        ])  # fmt: skip
    out = pd.DataFrame(rows, columns=COLUMNS)
    base = out.loc[out["policy"] == "fcfs", "busy_norm_s"]
    if len(base):
        out["busy_norm_vs_fcfs"] = out["busy_norm_s"] / float(base.iloc[0])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", action="append", required=True, type=Path,
                    help="an engines-suite run folder with hf rows (repeatable)")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True, help="the CSV to write")
    args = ap.parse_args(argv)
    frames = []
    for src in args.src:
        path = src / "steps.parquet"
        if not path.is_file():
            print(f"error: {path}: no such file (an engines-suite run folder?)", file=sys.stderr)
            return 2
        try:
            frames.append(cost_rows(pd.read_parquet(path), src.name))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    table = pd.concat(frames, ignore_index=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False, float_format="%.4f")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
