"""Per policy and SLO class, how the requests that arrived inside a time window ended: met, missed
on TTFT or TPOT, rejected (with reason) or failed. ``superinfer fleet plan`` judges a replica count
on such a window (after warm-up) and stops a cell at its first miss over the allowed count, so its
``search.csv`` says *when* a count failed, not by how much; this reads a full ``superinfer bench``
run of the same count and says by how much.

    .venv/bin/python benchmarks/window_outcomes.py RUN_DIR --start-s 300 --end-s 900 \
        [--out RUN_DIR/window.csv]

Columns: ``policy, slo_class, requests, met, attainment, missed_ttft, missed_tpot, rejected,
failed, top_reason``. A finished request that missed both TTFT and TPOT counts in both columns.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd


def window_outcomes(requests: pd.DataFrame, start_s: float, end_s: float) -> pd.DataFrame:
    """Outcomes of the requests with ``start_s <= arrival_s < end_s``, per policy and class.

    Args:
        requests: a run's ``requests.parquet`` (columns ``policy, slo_class, arrival_s,
            status, reason, met_slo, ttft_ms, tpot_ms, slo_ttft_ms, slo_tpot_ms``).

    Returns:
        One row per (policy, slo_class), columns as the module docstring lists.
    """
    w = requests[(requests.arrival_s >= start_s) & (requests.arrival_s < end_s)]
    rows = []
    for (policy, cls), g in w.groupby(["policy", "slo_class"], sort=True):
        done = g[g.status == "finished"]
        late = done[~done.met_slo]
        not_done = g[g.status != "finished"]
        reasons = not_done.reason.value_counts()
        rows.append({
            "policy": policy, "slo_class": cls, "requests": len(g),
            "met": int(g.met_slo.sum()), "attainment": round(float(g.met_slo.mean()), 6),
            "missed_ttft": int((late.ttft_ms > late.slo_ttft_ms).sum()),
            "missed_tpot": int((late.tpot_ms > late.slo_tpot_ms).sum()),
            "rejected": int((g.status == "rejected").sum()),
            "failed": int((g.status == "failed").sum()),
            "top_reason": reasons.index[0] if len(reasons) else "",
        })  # fmt: skip
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--start-s", type=float, required=True)
    parser.add_argument("--end-s", type=float, required=True)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    path = args.run_dir / "requests.parquet"
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (a superinfer bench run directory?)")
    table = window_outcomes(pd.read_parquet(path), args.start_s, args.end_s)
    out = args.out or args.run_dir / "window.csv"
    table.to_csv(out, index=False)
    print(table.to_string(index=False))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
