"""SGLang 0.3.0's max-load rows: how many of the simulated steps decode more requests than 0.3.0
replays from a CUDA graph.

SGLang 0.3.0 captures decode CUDA graphs for batch sizes up to 160 (``model_runner.py``
``init_cuda_graphs``: ``[1, 2, 4] + [i * 8 for i in range(1, 21)]``; ``cuda_graph_runner.py``
``can_run``: ``batch_size <= self.max_bs``; read in the PyPI wheel ``sglang-0.3.0``); a larger
decode batch runs eagerly, every layer's kernels launched from Python, a cost that grows with the
model's layers (32 for Llama-3.1-8B, 80 for 70B) and that our step model has no term for. This
simulates the two published max-load rows (641: 8B on A100 TP1, the CPU term's fit row; 645:
70B on H100 TP4, 13.9 % too fast) with the installed costs (``sim/engine_costs.json``) and
reports, per row, the steps, the share of steps that run more than 160 requests (decode steps:
0.3.0 prefills apart from decodes, at most 8,192 prompt tokens a step), the share of the simulated
GPU time they take, the median and p90 requests per step, and the run's simulated GPU and CPU
seconds (the kernels' time and the per-step CPU term ``c0 + c_seq x requests`` summed over its
steps; 0.3.0 has no overlap scheduler, so their sum is the run's step time).

Usage::

    python benchmarks/sglang030_graph_batches.py \
        [--out results/fidelity/sglang030_graph_batches.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from superinfer.harness.offline import calibrate_published_sim as cps
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, write_atomic
from superinfer.harness.workload.data import data_dir
from superinfer.sim.engine_costs import load_costs
from superinfer.sim.versions import get_version

#: Largest decode batch SGLang 0.3.0 replays from a CUDA graph (its ``batch_size_list``).
GRAPH_MAX_BS = 160
ROWS = ("641", "645")


def main(argv: list[str] | None = None) -> int:
    """Simulate rows 641 and 645 and write one CSV row each."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path("results/fidelity/sglang030_graph_batches.csv")
    ap.add_argument("--out", type=Path, default=default)
    args = ap.parse_args(argv)
    base = data_dir()
    if base is None:
        raise SystemExit("error: no shared data folder found (set SUPERINFER_DATA)")
    costs = load_costs()
    published = {r["row_id"]: r for r in cps.load_rows(base / "published" / "engine_perf.csv")}
    out = []
    for row_id in ROWS:
        setup, why = cps.setup_of(published[row_id])
        if setup is None:
            raise SystemExit(f"error: row {row_id} cannot be simulated: {why}")
        steps: list[tuple[float, int, int]] = []  # (GPU s, requests, CPU divisor) per step
        metrics = cps.simulate(setup, costs, base, steps=steps)
        gpu = np.array([s[0] for s in steps])
        seqs = np.array([s[1] for s in steps])
        eager = seqs > GRAPH_MAX_BS
        cpu = costs["cpu"][get_version(setup.release).cpu_key]  # c0 + c_seq n, / K (divisor)
        cpu_s = sum((cpu["intercept_s"] + cpu["per_seq_s"] * n) / k for _, n, k in steps)
        out.append({
            "row_id": row_id,
            "setup": setup.label,
            "published_output_tok_s": float(published[row_id]["value"]),
            "simulated_output_tok_s": metrics["total_output_tok_s"],
            "steps": len(steps),
            "steps_over_160": float(eager.mean()),
            "gpu_time_share_over_160": float(gpu[eager].sum() / gpu.sum()),
            "batch_median": float(np.median(seqs)),
            "batch_p90": float(np.percentile(seqs, 90)),
            "gpu_s": float(gpu.sum()),
            "cpu_s": cpu_s,
        })  # fmt: skip
    frame = pd.DataFrame(out)
    write_atomic(args.out, lambda p: frame.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT,
                                                  lineterminator="\n"))  # fmt: skip
    print(frame.to_string(index=False))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
