"""Which engine differences drive which numbers on the headline workload (issue 19).

Setup: the headline workload (the Azure conv+code hour at 0.6x its rate: conv = chat, code =
batch; Llama-3.1-70B on A100-80GB, TP4, 4 replicas, round robin), every engine under its native
policy ``fcfs``. Then ablations: ``sim:trtllm`` with one mechanic or cost at a time set to
``sim:sglang``'s or ``sim:vllm``'s, so each difference between the engines' rows is attributed
to the term that makes it.

Writes ``results/fidelity/engine_differences.csv`` (columns: ``variant, differs_from_trtllm_in,
slo_class, n, ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, tpot_p99_ms, e2e_p50_ms, attainment,
output_tok_s, preemptions``) and ``engine_differences.md``. Attainment here is a request meeting
both its TTFT and its TPOT target (``SLO.ttft_ms``, ``SLO.tpot_ms``), a close approximation of the
report's; the suite's own numbers are ``results/headline``.

Usage: ``python benchmarks/engine_differences.py [--out DIR] [--duration-s S]``.
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import replace
from pathlib import Path

import numpy as np

from superinfer.adapters.manager import build_plugin_manager
from superinfer.harness.bench import HEADLINE_RATE_SCALE, build_bench_workload
from superinfer.harness.engines.base import BenchConfig
from superinfer.sim.engine import SimConfig, Simulator
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.profiles import SIM_SGLANG, SIM_TRTLLM, SIM_VLLM
from superinfer.sim.request import RequestStatus

COLUMNS = ["variant", "differs_from_trtllm_in", "slo_class", "n", "ttft_p50_ms", "ttft_p99_ms",
           "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "attainment", "output_tok_s",
           "preemptions"]  # fmt: skip

_SG, _VL, _TR = SIM_SGLANG, SIM_VLLM, SIM_TRTLLM
VARIANTS = [
    ("sim:vllm", "(engine)", _VL),
    ("sim:sglang", "(engine)", _SG),
    ("sim:trtllm", "(engine)", _TR),
    ("trtllm+sglang kernels", "kernel scale", replace(_TR, kernel_key=_SG.kernel_key)),
    ("trtllm+sglang unmixed prefill", "prefill runs alone", replace(_TR, mixed_batches=False)),
    ("trtllm+sglang admission", "new_token_ratio admission, page 1",
     replace(_TR, admission=_SG.admission, reserve_ratio_init=_SG.reserve_ratio_init,
             reserve_ratio_min=_SG.reserve_ratio_min, block_size_tokens=1,
             reserve_ratio_decay=_SG.reserve_ratio_decay, kv_memory=_SG.kv_memory,
             memory_fraction=_SG.memory_fraction, activation_reserve_bytes=0)),
    ("trtllm+vllm kernels", "kernel scale", replace(_TR, kernel_key=_VL.kernel_key)),
    ("trtllm+vllm cpu", "CPU per step, no overlap",
     replace(_TR, cpu_key=_VL.cpu_key, cpu_overlap=False)),
    ("trtllm+vllm limits", "2,048 tokens / 256 seqs per step on A100",
     replace(_TR, token_budget=_VL.token_budget, max_num_seqs=_VL.max_num_seqs)),
    ("trtllm+vllm admission", "chunk-only admission, page 16",
     replace(_TR, admission=_VL.admission, block_size_tokens=16)),
]  # fmt: skip


def _rows(name: str, what: str, result: object, window_s: float) -> list[dict[str, object]]:
    reqs = [r for r in result.requests if r.status is RequestStatus.FINISHED]  # type: ignore[attr-defined]
    out = []
    for cls in ("chat", "batch", "all"):
        rs = [r for r in reqs if cls == "all" or r.spec.slo.name == cls]
        if not rs:
            continue
        ttft = np.array([r.first_token_s - r.spec.arrival_s for r in rs]) * 1e3
        multi = [r for r in rs if r.generated_tokens > 1]
        tpot = np.array([(r.finish_s - r.first_token_s) / (r.generated_tokens - 1)
                         for r in multi]) * 1e3  # fmt: skip
        e2e = np.array([r.finish_s - r.spec.arrival_s for r in rs]) * 1e3

        def ok(r: object) -> bool:
            slo = r.spec.slo  # type: ignore[attr-defined]
            t = (r.first_token_s - r.spec.arrival_s) * 1e3  # type: ignore[attr-defined]
            g = r.generated_tokens  # type: ignore[attr-defined]
            p = (r.finish_s - r.first_token_s) / (g - 1) * 1e3 if g > 1 else 0.0  # type: ignore[attr-defined]
            return (slo.ttft_ms is None or t <= slo.ttft_ms) and (
                slo.tpot_ms is None or p <= slo.tpot_ms
            )

        out.append({
            "variant": name, "differs_from_trtllm_in": what, "slo_class": cls, "n": len(rs),
            "ttft_p50_ms": round(float(np.median(ttft)), 2),
            "ttft_p99_ms": round(float(np.percentile(ttft, 99)), 2),
            "tpot_p50_ms": round(float(np.median(tpot)), 3),
            "tpot_p99_ms": round(float(np.percentile(tpot, 99)), 3),
            "e2e_p50_ms": round(float(np.median(e2e)), 1),
            "attainment": round(sum(ok(r) for r in rs) / len(rs), 4),
            "output_tok_s": round(sum(r.generated_tokens for r in rs) / window_s, 2),
            "preemptions": sum(r.num_preemptions for r in rs),
        })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/fidelity")
    parser.add_argument("--duration-s", type=float, default=None)
    args = parser.parse_args()
    cfg = BenchConfig(trace="azure", rate_scale=HEADLINE_RATE_SCALE, duration_s=args.duration_s)
    workload = build_bench_workload(cfg)
    rows: list[dict[str, object]] = []
    for name, what, profile in VARIANTS:
        config = SimConfig(profile, get_model(cfg.model), get_gpu(cfg.gpu), tp=cfg.tp,
                           replicas=cfg.replicas)  # fmt: skip
        result = Simulator(config, build_plugin_manager("fcfs").hook).run(workload.requests)
        window = max(r.finish_s or 0.0 for r in result.requests)
        rows += _rows(name, what, result, window)
        print(name, [(r["slo_class"], r["ttft_p99_ms"], r["tpot_p50_ms"], r["attainment"])
                     for r in rows[-3:]], flush=True)  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "engine_differences.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out / 'engine_differences.csv'}")


if __name__ == "__main__":
    main()
