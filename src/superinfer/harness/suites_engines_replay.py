"""Replays of a finished engines suite's simulated rows (issue 19's fidelity files).

:func:`resimulate` runs ``sim:hf-cpu`` or ``sim:sglang-cpu`` again against the real rows of a
``superinfer bench --suite engines`` run folder, so that a change to the simulator is scored on
real runs already made (``benchmarks/fidelity_cpu.py --resim``); with the runs' speeds
(:func:`host_speeds`) each cell runs at the speed its real run's host had, which
separates what the simulator's mechanics miss from what the host's drift between runs moved.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.bench import BenchConfig
from superinfer.harness.errors import UserError
from superinfer.harness.offline.calibrate_hf import run_speeds
from superinfer.harness.suites_engines import sim_cells
from superinfer.harness.suites_engines_knee import engine_runs
from superinfer.harness.suites_engines_options import (
    HF_BEFORE_RECORD,
    HF_UNRECORDED,
    SGLANG_BEFORE_RECORD,
    SIM_HF,
    SIM_OF,
    SIM_SGLANG,
    SuiteOptions,
    for_engine,
)
from superinfer.sim.hf_cpu import HFCPUStepTime

#: Per simulated engine, what ``superinfer`` ran with on its real engine in runs whose manifest
#: does not record these options (recorded ones win).
_UNRECORDED = {SIM_SGLANG: SGLANG_BEFORE_RECORD, SIM_HF: HF_UNRECORDED}

__all__ = ["host_speeds", "resimulate"]


def host_speeds(src: Path, fit: Path, engine: str) -> dict[str, float]:
    """Each run of the real ``engine`` in the suite run folder ``src`` and its host speed against
    the step-time file ``fit``: ``offline.calibrate_hf.run_speeds`` of that engine's runs in
    ``src/steps.parquet`` (a suite that ran hf and SGLang keeps both in one log).

    Raises:
        UserError: no step log in ``src`` (runs made before the suite kept one) or no run of
            ``engine`` in it, an unreadable log or fit (naming the file), or a bad step.
    """
    log = src / "steps.parquet"
    if not log.is_file():
        raise UserError(f"{log}: no such file (host speeds need the real runs' step logs)")
    try:
        mine = engine_runs(pd.read_parquet(log), engine)
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{log}: cannot read its runs ({exc})") from None
    if mine.empty:
        raise UserError(f"{log}: no run of {engine}")
    try:
        model = HFCPUStepTime.from_file(fit)
    except ValueError as exc:
        raise UserError(str(exc)) from None  # names the file
    try:
        return run_speeds(mine, model)
    except UserError as exc:
        raise UserError(f"{log}: {exc}") from None


def resimulate(
    src: Path,
    engine: str,
    extra: Mapping[str, str] | None = None,
    fit: Path | None = None,
    superinfer_options: Mapping[str, str] | None = None,
    speeds: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """Replay the simulated rows of ``engine`` (``sim:hf-cpu`` or ``sim:sglang-cpu``) against
    the real rows of a finished suite run in ``src`` (its ``summary.csv``, ``manifest.json`` and
    ``<real engine>_step_time.json``), with more simulator options ``extra`` (e.g.
    ``mechanics=sglang``): the same arrivals per repeat, loads, SLOs (a run under
    ``suite.chat_ttft_x``: its engine's own chat target) and step-time fit (or the
    fit in ``fit``, e.g. one from a later run's lone and batched passes), and ``superinfer``
    with ``superinfer_options`` over the suite's (e.g. ``ttft_kv_reserve_requests``) and over
    what ``superinfer`` ran with on the real engine (the manifest's ``superinfer_options``; an hf
    run made before it was recorded: the options its config carried, over
    :data:`HF_BEFORE_RECORD`; runs between 9816ae6 and 7fd49b0 ran 0.9 unrecorded, so replay
    them with ``superinfer_options={"tpot_plan_share": "0.9"}``; an hf run that did not record
    an option of :data:`HF_UNRECORDED` ran without it). ``speeds``: each policy's
    cell runs at its real run's host speed (``{run: factor}``, :func:`host_speeds` against the
    same fit; ``step_time_scale``).

    Returns:
        ``src``'s summary rows of the real engine followed by the new simulated rows (the
        columns of ``summary.csv``), for ``suites_engines_fidelity.fidelity``.

    Raises:
        UserError: ``src`` lacks a file, ``engine`` is not a simulated CPU engine, ``speeds``
            lacks a run or comes with a ``step_time_scale`` in ``extra``.
    """
    if engine not in SIM_OF:
        raise UserError(f"{engine}: not a simulated CPU engine ({', '.join(SIM_OF)})")
    real = SIM_OF[engine]
    paths = [src / "summary.csv", src / "manifest.json", fit or src / f"{real}_step_time.json"]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UserError(f"{missing[0]}: no such file (a `bench --suite engines` run folder?)")
    summary = pd.read_csv(paths[0])
    manifest = json.loads(paths[1].read_text())
    known = {f.name for f in dataclasses.fields(SuiteOptions)}
    kwargs: dict[str, Any] = {}
    for key, value in manifest.get("options", {}).items():
        if key in known:
            if isinstance(value, list):
                value = tuple(value)
            elif isinstance(value, dict):
                value = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
            kwargs[key] = value
    kwargs.setdefault("chat_ttft_x", 0.0)  # runs before it (2026-12-07) had absolute targets
    opts = for_engine(SuiteOptions(**kwargs), manifest.get("engines", {}), engine)
    ran = summary[summary["engine"] == real]
    found = {real: tuple(sorted(float(x) for x in ran["load"].unique()))}
    config = BenchConfig(seed=int(manifest.get("seed", 0)))
    ran_with = manifest.get("superinfer_options", {}).get(real)
    if ran_with is None and engine == SIM_HF:  # an hf run from before the record
        given = manifest.get("config", {}).get("policy_options", {}).get("superinfer", {})
        ran_with = {**HF_BEFORE_RECORD, **given}
    # options a run from before them did not record, as it ran
    ran_with = {**_UNRECORDED[engine], **(ran_with or {})}
    if speeds is not None and "step_time_scale" in (extra or {}):
        raise UserError("host_speed sets each cell's step_time_scale: do not give one too")
    frames = sim_cells(
        config, engine, opts, paths[2], lambda _m: None, found, extra,
        superinfer_options={**(ran_with or {}), **(superinfer_options or {})},
        speeds=speeds,
    )  # fmt: skip
    return pd.concat([ran, *frames], ignore_index=True)
