"""Calibration of ``sim:hf-cpu`` on the real CPU engine: measure real steps, fit the step time.

``calibrate_hf`` runs closed batches of real ShareGPT prompts through the engine (``hf``),
records every step's shape and wall time, and ``fit_steps`` fits the model of ``sim/hf_cpu.py``.
torch and transformers are imported only when a measurement starts. The same model is fitted on
a real SGLang CPU server's step log (``adapters/sglang/steplog.py``) for ``sim:sglang-cpu``
(``superinfer calibrate --engine sglang --steps``): :func:`sglang_iteration_steps` first adds to
each batch the scheduler's own time before it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from superinfer.harness.engines.hf import (
    HF_ENGINE,
    hf_options,
    start_session,
    step_profile,
    steps_frame,
    torch_threads,
)
from superinfer.harness.errors import UserError
from superinfer.harness.policies import policy_manager
from superinfer.harness.report.results import manifest, write_atomic
from superinfer.harness.workload.prompts import PromptBuilder, load_sharegpt_prompts
from superinfer.sim.hf_cpu import HFCPUStepTime, StepSample, shape_of_totals
from superinfer.sim.step_spread import StepSpread

if TYPE_CHECKING:
    from superinfer.adapters.hf.plugin import StepRecord

__all__ = [
    "CALIBRATION_GRID",
    "calibrate_hf",
    "fit_steps",
    "fit_summary",
    "run_speeds",
    "sglang_iteration_steps",
    "write_hf_calibration",
]

#: A gap longer than this (ms) between two SGLang batches held idle time (the server waited for
#: requests), not only the scheduler's own work: in the step logs of
#: results/engines-cpu/sglang-steps the gaps are 1.2-10.1 ms (p10-p99) and 0.19 % exceed 20 ms.
BUSY_GAP_MS = 20.0


#: Closed batches run by :func:`calibrate_hf`: ``(requests, prompt tokens, output tokens)``. They
#: cover prefill chunks of 32-256 tokens over 0-224 tokens of context, decode batches of 1 to 16
#: requests at contexts of 32 to 300 tokens, and the mixed steps where one batch turns into the
#: next.
CALIBRATION_GRID: tuple[tuple[int, int, int], ...] = (
    (1, 32, 16),
    (1, 256, 16),
    (2, 96, 16),
    (4, 64, 16),
    (4, 192, 12),
    (8, 32, 16),
    (8, 128, 12),
    (16, 48, 12),
    (16, 160, 8),
)


def calibrate_hf(
    options: Mapping[str, str] | None = None,
    *,
    grid: Sequence[tuple[int, int, int]] = CALIBRATION_GRID,
    seed: int = 0,
) -> tuple[HFCPUStepTime, dict[str, Any], pd.DataFrame]:
    """Measure real engine steps over ``grid`` and fit the ``sim:hf-cpu`` step-time model.

    Each grid entry is a closed batch (all requests submitted at once, fcfs) of real ShareGPT
    prompts; every step it takes is recorded with its shape and wall time.

    Args:
        options: ``--engine-option`` settings (engine limits, threads).
        grid: closed batches ``(requests, prompt tokens, output tokens)``.
        seed: seed of the prompt order.

    Returns:
        ``(model, report, steps)``: the fitted model, a JSON-able report (coefficients, fit
        error overall and per step kind, engine settings, wall time), and the measured steps.

    Raises:
        UserError: bad options, or the hf extra / model not installed.
    """
    from superinfer.adapters.hf.engine import ModelNotInstalledError, load_smollm2
    from superinfer.adapters.hf.view import TrackedRequest
    from superinfer.harness.workload.workload import BATCH_SLO

    opts = hf_options(options or {})
    try:
        loaded = load_smollm2()
    except ModelNotInstalledError as exc:
        raise UserError(str(exc)) from None
    builder = PromptBuilder(loaded.tokenizer, load_sharegpt_prompts(), seed=seed)
    records: list[StepRecord] = []
    wall = time.perf_counter()
    for batch, (n, prompt, output) in enumerate(grid):
        pm = policy_manager("fcfs")
        session = start_session(loaded, pm.hook, opts)
        try:
            for i in range(n):
                rid = f"cal{batch}-{i}"
                session.submit(
                    TrackedRequest(rid, 0.0, prompt, output, BATCH_SLO),
                    builder.build(batch * 16 + i, prompt),
                    output,
                )
            finished = 0
            deadline = time.perf_counter() + opts.drain_s
            while finished < n and time.perf_counter() < deadline:
                if session.fatal_error is not None:
                    raise session.fatal_error
                out = session.next_output(0.05)
                finished += out is not None and out.is_finished()
        finally:
            session.stop(hard=True)
        if finished < n:
            raise UserError(f"calibration batch {batch} did not finish within {opts.drain_s} s")
        records.extend(
            replace(r, step_index=len(records) + k) for k, r in enumerate(session.binding.steps)
        )
    steps = steps_frame(records, engine=HF_ENGINE, policy="fcfs")
    model, report = fit_steps(steps)
    report = {
        **report,
        "grid": [list(g) for g in grid],
        "engine": asdict(opts),
        "model": loaded.name,
        "dtype": loaded.dtype,
        "torch_threads": torch_threads(opts),
        "wall_s": round(time.perf_counter() - wall, 3),
        "step_profile": step_profile(steps),
    }
    return model, report, steps


def _samples(steps: pd.DataFrame) -> list[StepSample]:
    """Each recorded step's shape and measured duration (raises ``KeyError`` on a missing
    column)."""
    return [
        StepSample(
            shape_of_totals(
                int(r["num_tokens"]),
                int(r["num_seqs"]),
                int(r["num_samples"]),
                int(r["kv_tokens"]),
                0 if pd.isna(held := r.get("prefix_tokens", 0)) else int(held),
            ),
            float(r["duration_ms"]) / 1e3,
        )
        for _, r in steps.iterrows()
    ]


def fit_steps(steps: pd.DataFrame) -> tuple[HFCPUStepTime, dict[str, Any]]:
    """Fit the ``sim:hf-cpu`` step-time model to recorded steps (:data:`STEP_COLUMNS`; only
    ``num_tokens``, ``num_seqs``, ``num_samples``, ``kv_tokens``, ``kind``, ``duration_ms`` and,
    where the log has it (SGLang's), ``prefix_tokens`` are read), and set their ``predicted_ms``
    column.

    The least squares on relative error (``HFCPUStepTime.fit``) lands below the mean of the
    right-skewed step times and sets slow outliers aside, so it predicts less total time than the
    steps took (they took 1.4-7.2 % more on the 20 step logs of
    results/fidelity/host_speed_summary.csv); a queue's waits follow the total, so the fitted
    model is then scaled (coefficients and spill cost) to predict exactly the steps' total time
    (``total_scale``). Replaying the 15 SGLang and 5 hf suite folders there
    (results/fidelity/README.md, "Host speed"), this scaling put 29 more of 1,152 judged rows
    within issue 19's bounds.

    Returns:
        The model and the JSON-able fit report: coefficients, the spill term (``kv_spill``, empty
        without one), the measured / predicted spread per step kind (``spread``,
        ``sim.step_spread.StepSpread``), the least squares' error (``fit``, before the scale),
        ``total_scale``, the scaled model's error overall (``scaled_fit``) and per kind.

    Raises:
        UserError: too few steps or a missing column.
    """
    try:
        samples = _samples(steps)
        model, fit = HFCPUStepTime.fit(samples)
        measured = sum(s.duration_s for s in samples)
        scale = measured / sum(model.step_time_s(s.shape) for s in samples)
        model = model.scaled(scale)
    except (KeyError, ValueError, ZeroDivisionError) as exc:
        raise UserError(f"cannot fit the step-time model to these steps: {exc}") from None
    steps["predicted_ms"] = [model.step_time_s(s.shape) * 1e3 for s in samples]
    rel = (steps["predicted_ms"] - steps["duration_ms"]).abs() / steps["duration_ms"]
    try:
        spread = StepSpread.fit(
            list(steps["kind"]), list(steps["duration_ms"] / steps["predicted_ms"])
        )
    except ValueError as exc:
        raise UserError(f"cannot measure the steps' spread: {exc}") from None
    report = {
        "coefficients": model.to_dict(),
        "units": "s per unit of each feature (sim/hf_cpu.py FEATURES)",
        "kv_spill": model.spill_dict(),
        "spread": spread.to_dict(),
        "fit": asdict(fit),
        "total_scale": round(scale, 6),
        "scaled_fit": {
            "mean_abs_rel_err": round(float(rel.mean()), 4),
            "p50_abs_rel_err": round(float(rel.median()), 4),
            "p90_abs_rel_err": round(float(rel.quantile(0.9)), 4),
        },
        "fit_by_kind": {
            kind: {"steps": int(m.sum()), "mean_abs_rel_err": round(float(rel[m].mean()), 4)}
            for kind in ("prefill", "decode", "mixed")
            if (m := steps["kind"] == kind).any()
        },
    }
    return model, report


def sglang_iteration_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """An SGLang step log with ``duration_ms`` made the whole scheduler iteration: the batch's
    ``run_batch`` time plus its ``gap_ms`` (the previous batch's result processing and this one's
    scheduling, our policy's call included) where the gap is at most :data:`BUSY_GAP_MS`, else
    plus the median of those busy gaps (an idle wait is not a cost of the step). The step-time
    model of ``sim:hf-cpu`` is one number per iteration, so this is what it must cover.
    ``forward_ms`` keeps the ``run_batch`` time.

    Raises:
        UserError: no ``gap_ms`` or ``duration_ms`` column (not an SGLang step log).
    """
    missing = sorted({"gap_ms", "duration_ms"} - set(steps.columns))
    if missing:
        raise UserError(f"not an SGLang step log: no column {', '.join(missing)}")
    gap = pd.to_numeric(steps["gap_ms"], errors="coerce")
    busy = gap.notna() & (gap <= BUSY_GAP_MS)
    fill = float(gap[busy].median()) if busy.any() else 0.0
    out = steps.copy()
    out["forward_ms"] = steps["duration_ms"]
    out["duration_ms"] = steps["duration_ms"] + gap.where(busy, fill)
    return out


def run_speeds(steps: pd.DataFrame, model: HFCPUStepTime) -> dict[str, float]:
    """How fast the host ran each real run against a fitted step time: the run's measured step
    time over ``model``'s prediction for the same steps, each summed over the run.

    A queue's waits follow the total work, so a sum, not a median, is what a replay must match.
    An SGLang step log (``gap_ms`` present) is timed per scheduler iteration first
    (:func:`sglang_iteration_steps`), as its fit was. Give it one engine's runs (an SGLang
    log's median busy gap would otherwise be added to the other engine's steps). Against
    today's fit of each suite's own log, the 285 SGLang runs of results/fidelity/host_speed.csv
    span 0.86-1.59, runs of one suite minutes apart included (README.md there, "Host speed");
    those of results/engines-cpu/sglang-host-speed-knee 0.65-1.59.

    Args:
        steps: a suite's ``steps.parquet`` (the columns :func:`fit_steps` reads, and ``run``:
            ``<engine>_<policy>_<load>_<repeat>``).
        model: the fit the simulator replays the runs with.

    Returns:
        ``{run: factor}`` in ``run`` order; 1.1: that run's steps took 10 % longer than the fit.

    Raises:
        UserError: a missing column, a step with a missing (NaN) shape or duration, or a run
            whose steps the model predicts no time for.
    """
    if "gap_ms" in steps.columns:
        steps = sglang_iteration_steps(steps)
    try:
        samples = _samples(steps)
        runs = steps["run"].astype(str).to_numpy()
    except KeyError as exc:
        raise UserError(f"step log lacks column {exc}") from None
    except ValueError as exc:  # int(NaN) in a step's shape
        raise UserError(f"step log has a step without a shape ({exc})") from None
    if steps["duration_ms"].isna().any():
        raise UserError("step log has a step without a duration_ms")
    measured = pd.Series([s.duration_s for s in samples]).groupby(runs, sort=False).sum()
    predicted = pd.Series([model.step_time_s(s.shape) for s in samples])
    predicted = predicted.groupby(runs, sort=False).sum()
    zero = predicted.index[predicted <= 0].tolist()
    if zero:
        raise UserError(f"run {zero[0]}: the step-time model predicts no time for its steps")
    return {str(run): float(measured[run] / predicted[run]) for run in measured.index}


def write_hf_calibration(
    engine_options: Mapping[str, str],
    *,
    seed: int = 0,
    steps_file: str | None = None,
    out: str = "results/hf/step_time_fit.json",
    server_log: bool = False,
) -> tuple[HFCPUStepTime, dict[str, Any], Path, Path]:
    """Measure (or refit from ``steps_file``) and write the ``sim:hf-cpu`` calibration.

    Writes the coefficients, the fit error and the engine's per-step profile to ``out`` (use it
    with ``superinfer bench --engine sim:hf-cpu --engine-option step_time_file=PATH``) and the
    steps to ``<out stem>_steps.csv`` beside it.

    Args:
        engine_options: ``--engine-option`` settings (engine limits, threads).
        seed: seed of the prompt order.
        steps_file: refit from these recorded steps (a ``*_steps.csv`` of calibrate or a run's
            ``steps.parquet``) instead of measuring; what the earlier measurement recorded in
            ``out`` is kept.
        out: the calibration file.
        server_log: ``steps_file`` is a real SGLang server's step log, fitted per scheduler
            iteration (:func:`sglang_iteration_steps`) for ``sim:sglang-cpu``.

    Returns:
        ``(model, report, calibration path, steps path)``.

    Raises:
        UserError: unreadable steps, too few to fit, ``server_log`` without ``steps_file``, or
            the hf extra / model not installed.
    """
    path = Path(out)
    if server_log and steps_file is None:
        raise UserError("calibrate --engine sglang refits a server's step log: give --steps")
    if steps_file is None:
        model, report, steps = calibrate_hf(engine_options, seed=seed)
    else:
        source = Path(steps_file)
        try:
            steps = pd.read_parquet(source) if source.suffix == ".parquet" else pd.read_csv(source)
        except (OSError, ValueError) as exc:
            raise UserError(f"{source}: cannot read recorded steps ({exc})") from None
        if server_log:
            steps = sglang_iteration_steps(steps)
        model, report = fit_steps(steps)
        if server_log:
            report["engine"] = "sglang"
            report["iteration"] = f"run_batch + the gap before it (<= {BUSY_GAP_MS:g} ms)"
        report["steps_from"] = str(source)
        try:
            previous = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except ValueError:
            previous = {}
        for key in ("grid", "engine", "model", "dtype", "torch_threads", "wall_s", "step_profile"):
            if key in previous:  # what the measurement the steps came from recorded
                report[key] = previous[key]
    meta = manifest({"config": {"seed": seed}})
    doc = {**report, "git_sha": meta["git_sha"], "host": meta["host"], "command": meta["command"]}
    text = json.dumps(doc, indent=2) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    steps_path = path.with_name(path.stem + "_steps.csv")
    write_atomic(steps_path, lambda p: steps.to_csv(p, index=False, float_format="%.6g"))
    return model, report, path, steps_path


def fit_summary(model: HFCPUStepTime, report: Mapping[str, Any]) -> list[str]:
    """Lines describing a fit: its error, then each coefficient (s per unit of its feature) and
    the spill term, if any."""
    fit = report["fit"]
    lines = [
        f"fitted on {fit['num_samples']} steps: mean |rel err| {fit['mean_abs_rel_err']:.3f}, "
        f"p90 {fit['p90_abs_rel_err']:.3f}"
    ]
    lines += [f"  {name:12s} {value:.6g} s" for name, value in model.to_dict().items()]
    if model.spill_s_per_token:
        lines.append(
            f"  spill        {model.spill_s_per_token:.6g} s per key token past "
            f"{model.spill_tokens:,.0f} key tokens"
        )
    return lines
