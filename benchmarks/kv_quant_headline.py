"""Peak KV memory with the per-request KV quantization planner, per engine (issue 7).

Runs each engine's native policy on two workloads, with FP16 KV for every request (no planner)
and with the planner (``superinfer bench --kv-quant``) in two settings:

* ``pressure``: the planner's defaults: new requests step down FP16 -> INT8 -> INT4 when KV
  demand passes 70% / 85% of HBM, never below the class floor (chat INT8, others INT4);
* ``floor``: thresholds near zero, so every request is stored at its class's floor from the
  start (chat INT8, batch INT4): the most memory the planner can save.

Workloads: the headline one (the Azure hour, conv = chat, code = batch, at x0.6, Llama-3.1-70B on
4 A100-80GB TP4 replicas), where KV is never short, and the rotation one (Mooncake long chat on 6
H100 TP4 replicas, 600 s), where live KV exceeds HBM. Writes ``results/kv_quant/headline.csv``:
``workload, engine, policy, planner, kv_peak_gb, kv_peak_ratio`` (to the same engine's FP16 run),
``chat_class, chat_attainment, chat_ttft_p99_ms, output_tok_s, preemptions``. Every run is
deterministic; the KV figures are the simulator's exact byte accounting
(``policy_core/kv_bytes.py``), not a measurement of a GPU.

Usage: ``python benchmarks/kv_quant_headline.py [--out results/kv_quant]``
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from superinfer.harness.bench import BenchConfig, run_bench
from superinfer.harness.policies import resolve_policy
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, write_atomic
from superinfer.harness.suites import HEADLINE_RATE_SCALE, ROTATION_DEFAULTS

ENGINES = ("sim:vllm", "sim:sglang", "sim:trtllm")
PLANNERS: dict[str, dict[str, str] | None] = {
    "none": None,
    "pressure": {},
    "floor": {"int8_pressure": "0.0001", "int4_pressure": "0.0002", "hysteresis": "0"},
}
WORKLOADS = {
    "azure-headline": BenchConfig(trace="azure", rate_scale=HEADLINE_RATE_SCALE),
    "mooncake-rotation": BenchConfig(
        workload=str(ROTATION_DEFAULTS["workload"]),
        model="llama-3.1-70b",
        gpu="h100-80gb",
        tp=4,
        replicas=int(ROTATION_DEFAULTS["replicas"]),  # type: ignore[call-overload]
        duration_s=float(ROTATION_DEFAULTS["duration_s"]),  # type: ignore[arg-type]
    ),
}
COLUMNS = (
    "workload",
    "engine",
    "policy",
    "planner",
    "kv_peak_gb",
    "kv_peak_ratio",
    "chat_class",
    "chat_attainment",
    "chat_ttft_p99_ms",
    "output_tok_s",
    "preemptions",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/kv_quant"))
    parser.add_argument("--engines", default=",".join(ENGINES))
    args = parser.parse_args()
    rows = []
    for wl_name, base in WORKLOADS.items():
        for engine in args.engines.split(","):
            policy, _ = resolve_policy("native", engine)  # the fleet tools' own rule
            fp16_peak = None
            for planner, options in PLANNERS.items():
                cfg = replace(
                    base,
                    engines=(engine,),
                    policies=(policy,),
                    kv_quant=options is not None,
                    kv_quant_options=options or {},
                )
                print(f"{wl_name} {engine} {policy} planner={planner}", flush=True)
                summary = run_bench(cfg).summary
                every = summary[summary.slo_class == "all"].iloc[0]
                classes = [c for c in summary.slo_class if c not in ("all", "batch")]
                chat = summary[summary.slo_class == classes[0]].iloc[0]
                peak = float(every.kv_peak_gb)
                if fp16_peak is None:
                    fp16_peak = peak
                rows.append(
                    {
                        "workload": wl_name,
                        "engine": engine,
                        "policy": policy,
                        "planner": planner,
                        "kv_peak_gb": peak,
                        "kv_peak_ratio": peak / fp16_peak if fp16_peak else float("nan"),
                        "chat_class": classes[0],
                        "chat_attainment": float(chat.slo_attainment),
                        "chat_ttft_p99_ms": float(chat.ttft_p99_ms),
                        "output_tok_s": float(every.output_tok_s),
                        "preemptions": int(every.preemptions),
                    }
                )
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "headline.csv"
    write_atomic(path, lambda p: table.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT))
    print(table.to_string(index=False))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
