"""Simulator fidelity: the same workload on ``sim:hf-cpu`` and on the real engine ``hf``.

Reads a real run directory written by ``superinfer bench --engine hf`` (its ``requests.parquet``,
``steps.parquet`` and ``manifest.json``), simulates the same workload (same trace window, scaling,
engine limits and seed) on ``sim:hf-cpu`` with the step-time model of a calibration file
(``superinfer calibrate --engine hf``), and compares per SLO class the p50 and p99 of TTFT and
E2E over finished requests::

    rel_err = (sim_ms - real_ms) / real_ms        (signed; the target is |rel_err| <= 0.15)

Writes ``errors.csv`` (columns ``slo_class, metric, quantile, real_ms, sim_ms, rel_err``), the
simulated ``summary.csv`` and a ``report.md`` that also gives the step-time model's error on the
real run's own steps, which separates the step-time model from the scheduling dynamics.

Usage::

    python benchmarks/hf_fidelity.py [--real results/hf] [--policy fcfs]
        [--calibration results/hf/step_time_fit.json] [--out results/fidelity]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from superinfer.harness.bench import BenchConfig
from superinfer.harness.engines.hf import SIM_HF_CPU_ENGINE
from superinfer.harness.engines.sim import run_sim_hf_cpu_cell
from superinfer.harness.errors import UserError
from superinfer.harness.report.metrics import summarize
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, write_atomic
from superinfer.harness.workload.workload import build_workload, scale_lengths
from superinfer.sim.hf_cpu import HFCPUStepTime, shape_of_totals

ERROR_COLUMNS = ("slo_class", "metric", "quantile", "real_ms", "sim_ms", "rel_err")
QUANTILES = {"p50": 50, "p99": 99}


def _config(meta: dict, policy: str, calibration: Path) -> BenchConfig:
    cfg = meta["config"]
    options = dict(cfg.get("engine_options") or {})
    options["step_time_file"] = str(calibration)
    return BenchConfig(
        trace=cfg["trace"],
        engines=(SIM_HF_CPU_ENGINE,),
        policies=(policy,),
        rate_scale=cfg["rate_scale"],
        duration_s=cfg["duration_s"],
        seed=cfg["seed"],
        start_s=cfg.get("start_s", 0.0),
        length_scale=cfg.get("length_scale", 1.0),
        max_prompt_tokens=cfg.get("max_prompt_tokens"),
        max_output_tokens=cfg.get("max_output_tokens"),
        engine_options=options,
    )


def errors_table(real: pd.DataFrame, sim: pd.DataFrame) -> pd.DataFrame:
    """Per class (and ``all``), p50/p99 of TTFT and E2E of finished requests, real vs simulated."""
    rows = []
    classes = sorted(real["slo_class"].unique())
    for name in [*classes, "all"]:
        r = real if name == "all" else real[real["slo_class"] == name]
        s = sim if name == "all" else sim[sim["slo_class"] == name]
        r, s = r[r["status"] == "finished"], s[s["status"] == "finished"]
        for metric in ("ttft", "e2e"):
            for q, pct in QUANTILES.items():
                real_ms = float(np.percentile(r[f"{metric}_ms"], pct)) if len(r) else np.nan
                sim_ms = float(np.percentile(s[f"{metric}_ms"], pct)) if len(s) else np.nan
                rows.append((name, metric, q, real_ms, sim_ms, (sim_ms - real_ms) / real_ms))
    return pd.DataFrame(rows, columns=list(ERROR_COLUMNS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", type=Path, default=Path("results/hf"))
    parser.add_argument("--policy", default="fcfs")
    parser.add_argument("--calibration", type=Path, default=Path("results/hf/step_time_fit.json"))
    parser.add_argument("--out", type=Path, default=Path("results/fidelity"))
    args = parser.parse_args(argv)
    try:
        meta = json.loads((args.real / "manifest.json").read_text(encoding="utf-8"))
        real_all = pd.read_parquet(args.real / "requests.parquet")
        steps_path = args.real / "steps.parquet"
        steps = pd.read_parquet(steps_path) if steps_path.is_file() else pd.DataFrame()
    except (OSError, ValueError) as exc:
        print(f"error: {args.real}: not a run directory of `superinfer bench --engine hf` ({exc})")
        return 2
    real = real_all[(real_all["engine"] == "hf") & (real_all["policy"] == args.policy)]
    if real.empty:
        print(f"error: {args.real}/requests.parquet has no hf rows for policy {args.policy!r}")
        return 2
    try:
        model = HFCPUStepTime.from_file(args.calibration)
        config = _config(meta, args.policy, args.calibration)
        workload = build_workload(
            config.trace,
            rate_scale=config.rate_scale,
            duration_s=config.duration_s,
            start_s=config.start_s,
        )
        workload = scale_lengths(
            workload,
            length_scale=config.length_scale,
            max_prompt_tokens=config.max_prompt_tokens,
            max_output_tokens=config.max_output_tokens,
        )
        cell = run_sim_hf_cpu_cell(config, SIM_HF_CPU_ENGINE, args.policy, workload)
    except (UserError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    sim = cell.requests
    if sorted(sim["request_id"]) != sorted(real["request_id"]):
        print("error: the simulated workload is not the real run's (request ids differ)")
        return 2

    errors = errors_table(real, sim)
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(
        args.out / "errors.csv",
        lambda p: errors.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT),
    )
    summary = pd.DataFrame(
        summarize(real, engine="hf", policy=args.policy, kv_peak_bytes={})
        + summarize(
            sim, engine=SIM_HF_CPU_ENGINE, policy=args.policy, kv_peak_bytes=cell.kv_peak_bytes
        )
    )
    write_atomic(
        args.out / "summary.csv",
        lambda p: summary.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT),
    )
    if not steps.empty:
        steps = steps[(steps["engine"] == "hf") & (steps["policy"] == args.policy)].copy()
        steps["predicted_ms"] = [
            model.step_time_s(shape_of_totals(r.num_tokens, r.num_seqs, r.num_samples, r.kv_tokens))
            * 1e3
            for r in steps.itertuples()
        ]
    report = _report(args, meta, errors, steps, model)
    write_atomic(args.out / "report.md", lambda p: p.write_text(report, encoding="utf-8"))
    print(errors.to_string(index=False))
    print(f"wrote {args.out}/errors.csv, summary.csv, report.md")
    return 0


def _report(
    args: argparse.Namespace,
    meta: dict,
    errors: pd.DataFrame,
    steps: pd.DataFrame,
    model: HFCPUStepTime,
) -> str:
    worst = errors["rel_err"].abs().max()
    lines = [
        "# Simulator fidelity: `sim:hf-cpu` vs the real CPU engine `hf`",
        "",
        f"Real run: `{args.real}` (git `{meta.get('git_sha')}`, {meta.get('created_utc')}), "
        f"policy `{args.policy}`. Step-time model: `{args.calibration}`.",
        "",
        "`rel_err = (sim_ms - real_ms) / real_ms` over finished requests; "
        "target |rel_err| <= 0.15. "
        f"Worst |rel_err| here: {worst:.3f}.",
        "",
        "| class | metric | quantile | real ms | sim ms | rel err |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in errors.itertuples():
        lines.append(
            f"| {r.slo_class} | {r.metric} | {r.quantile} | {r.real_ms:,.0f} | {r.sim_ms:,.0f} "
            f"| {r.rel_err:+.3f} |"
        )
    if not steps.empty:
        rel = (steps["predicted_ms"] - steps["duration_ms"]).abs() / steps["duration_ms"]
        lines += [
            "",
            "## The step-time model on the real run's own steps",
            "",
            "Mean |relative error| of the fitted step time against each measured step of the "
            "real run (no scheduling involved):",
            "",
            "| steps | kind | mean abs rel err | measured mean ms | predicted mean ms |",
            "|---:|---|---:|---:|---:|",
        ]
        for kind, part in steps.groupby("kind"):
            prel = rel[part.index]
            lines.append(
                f"| {len(part)} | {kind} | {prel.mean():.3f} | {part['duration_ms'].mean():,.1f} "
                f"| {part['predicted_ms'].mean():,.1f} |"
            )
        lines.append(
            f"| {len(steps)} | all | {rel.mean():.3f} | {steps['duration_ms'].mean():,.1f} "
            f"| {steps['predicted_ms'].mean():,.1f} |"
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
