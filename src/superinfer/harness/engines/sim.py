"""The simulated engines: ``sim:<profile>`` (a GPU cluster of ``sim.profiles.PROFILES``) and
``sim:hf-cpu`` (the real CPU engine's mechanics, ``sim/hf_cpu.py``, with its fitted step time)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pandas as pd

from superinfer.adapters.hookspecs import policy_counters
from superinfer.harness.engines.base import (
    TIMELINE_COLUMNS,
    BenchConfig,
    CellResult,
    RequestOutcome,
    requests_frame,
)
from superinfer.harness.engines.hf import hf_options
from superinfer.harness.engines.hf_sim import sim_profile
from superinfer.harness.engines.registry import family_kinds
from superinfer.harness.errors import UserError
from superinfer.harness.policies import policy_manager
from superinfer.harness.workload.workload import Workload
from superinfer.sim.config import SimConfig, SimResult, kv_capacity_blocks
from superinfer.sim.engine import Simulator
from superinfer.sim.hardware import GPUSpec, ModelSpec, get_gpu, get_model
from superinfer.sim.hf_cpu import KV_BYTES_PER_TOKEN_FP32, extends_decodes, hf_cpu_sim_config
from superinfer.sim.profiles import EngineProfile, get_profile
from superinfer.sim.routers import ROUTERS

__all__ = [
    "SIM_OPTION_KEYS",
    "run_sim_cell",
    "run_sim_hf_cpu_cell",
    "sim_options",
    "sim_requests_frame",
]

#: ``--engine-option`` keys of the ``sim:<profile>`` engines (what-if knobs, as the real engines'
#: flags): ``max_num_seqs`` (most running requests per replica, vLLM's ``--max-num-seqs``),
#: ``num_gpu_blocks`` (KV blocks per replica, vLLM's ``--num-gpu-blocks-override``) and
#: ``mixed_batches`` (0 or 1: whether a step may run prefill chunks beside decodes; 1 on
#: sim:sglang is SGLang's ``--enable-mixed-chunk``, off in 0.5.23's defaults,
#: ``EngineProfile.mixed_batches``).
SIM_OPTION_KEYS = ("max_num_seqs", "num_gpu_blocks", "mixed_batches")
#: The keys of :data:`SIM_OPTION_KEYS` that are switches (0 or 1), not counts.
_SWITCHES = ("mixed_batches",)


def sim_options(options: Mapping[str, str], *, strict: bool = True) -> dict[str, int]:
    """Parse the ``sim:<profile>`` engine options (:data:`SIM_OPTION_KEYS`), each an integer >= 1
    (``mixed_batches``: 0 or 1).

    Args:
        options: ``--engine-option`` keys and values.
        strict: refuse other keys; off when the run has engines of other families (their
            options are then theirs).

    Raises:
        UserError: an unknown key (``strict``) or a value that is not an integer >= 1 (a switch:
            not 0 or 1).
    """
    out: dict[str, int] = {}
    for key, raw in options.items():
        if key not in SIM_OPTION_KEYS:
            if not strict:
                continue
            known = ", ".join(SIM_OPTION_KEYS)
            raise UserError(f"unknown --engine-option {key!r} for a sim engine; known: {known}")
        try:
            value = int(raw)
        except ValueError:
            raise UserError(f"--engine-option {key}={raw!r}: not an integer") from None
        if key in _SWITCHES and value not in (0, 1):
            raise UserError(f"--engine-option {key} must be 0 or 1, got {value}")
        if key not in _SWITCHES and value < 1:
            raise UserError(f"--engine-option {key} must be >= 1, got {value}")
        out[key] = value
    return out


def sim_requests_frame(
    result: SimResult, *, engine: str, policy: str, latency_s: float = 0.0
) -> pd.DataFrame:
    """The requests table of one simulation (columns ``REQUEST_COLUMNS``, then
    ``cached_tokens``: prompt tokens served from the prefix cache at the request's last
    admission); ``latency_s`` (>= 0) is added to every first token and finish, as a client
    behind the server's request path sees them (``sim:hf-cpu``'s ``request_latency_ms``)."""

    def seen(t: float | None) -> float | None:
        return None if t is None else t + latency_s

    rows = [
        (
            req.spec,
            RequestOutcome(
                generated_tokens=req.generated_tokens,
                first_token_s=seen(req.first_token_s),
                finish_s=seen(req.finish_s),
                status=req.status.value,
                reason=req.reason,
                num_preemptions=req.num_preemptions,
                replica=req.replica,
                max_itl_ms=req.max_itl_s * 1e3,
            ),
        )
        for req in result.requests
    ]
    out = requests_frame(rows, engine=engine, policy=policy)
    out["cached_tokens"] = [req.cached_tokens for req in result.requests]
    return out


def check_kv_fits(
    profile: EngineProfile, model: ModelSpec, gpu: GPUSpec, tp: int, flag: str
) -> None:
    """Fail before any simulation when ``model``'s FP16 weights at TP ``tp`` leave ``gpu`` no
    memory for KV (``sim.config.kv_capacity_blocks``, which would raise mid-run).

    Raises:
        UserError: naming ``flag`` (``--tp`` or a spec's ``tp``), the model, GPU and TP.
    """
    try:
        kv_capacity_blocks(profile, model, gpu, tp)
    except ValueError:
        raise UserError(
            f"{flag} {tp}: {model.name}'s weights leave no KV memory on {gpu.name} at TP{tp}; "
            "use a larger TP"
        ) from None


def run_sim_cell(
    config: BenchConfig,
    engine: str,
    policy: str,
    workload: Workload,
    *,
    plugins: Sequence[object] = (),
) -> CellResult:
    """Simulate ``workload`` on ``engine`` (a simulated GPU profile) under ``policy``.

    Args:
        config: the run's settings (its ``engines`` and ``policies`` are not read).
        engine: a ``sim:<profile>`` engine id (``sim.profiles.PROFILES``).
        policy: a registered policy name.
        workload: the requests.
        plugins: extra pluggy plugins registered beside the policy (observers: step and
            request hooks); an exception one raises ends the simulation and propagates.

    ``config.engine_options``: :func:`sim_options` (``max_num_seqs``, ``num_gpu_blocks``).

    Raises:
        UserError: unknown engine, model or GPU, a bad TP degree or replica count, or a bad
            engine option.
    """
    strict = family_kinds(config.engines) == {"sim-gpu"}
    opts = sim_options(config.engine_options, strict=strict)
    try:
        profile = get_profile(engine)
        model, gpu = get_model(config.model), get_gpu(config.gpu)
    except KeyError as exc:
        raise UserError(exc.args[0]) from None
    if config.replicas < 1:
        raise UserError(f"--replicas must be >= 1, got {config.replicas}")
    if config.tp < 1 or model.num_kv_heads % config.tp:
        raise UserError(f"--tp must divide {model.name}'s {model.num_kv_heads} KV heads")
    if "num_gpu_blocks" not in opts:
        check_kv_fits(profile, model, gpu, config.tp, "--tp")
    if config.router not in ROUTERS:
        raise UserError(f"unknown router {config.router!r}; known: {', '.join(ROUTERS)}")
    sim_config = SimConfig(
        profile,
        model,
        gpu,
        tp=config.tp,
        replicas=config.replicas,
        router=config.router,
        cpu_kv_ratio=config.cpu_kv_ratio,
        horizon_s=config.horizon_s,
        num_gpu_blocks_override=opts.get("num_gpu_blocks"),
    )
    if "max_num_seqs" in opts:
        n = opts["max_num_seqs"]
        profile = replace(profile, max_num_seqs=n, max_num_seqs_large_gpu=n)
    if "mixed_batches" in opts:
        profile = replace(profile, mixed_batches=bool(opts["mixed_batches"]))
    sim_config = replace(sim_config, profile=profile)
    pm = policy_manager(
        policy,
        config.policy_options.get(policy, {}),
        workload=workload,
        kv_policy=config.kv_policy,
        quant_options=config.kv_quant_options if config.kv_quant else None,
        plugins=plugins,
    )
    t0 = time.perf_counter()
    result = Simulator(sim_config, pm.hook).run(workload.requests)
    wall = time.perf_counter() - t0
    policy_stats = policy_counters(pm.hook)  # superinfer's and oracle's counters
    df = sim_requests_frame(result, engine=engine, policy=policy)
    peaks: dict[str, float] = {
        "all": max(result.peak_kv_blocks) * result.kv_block_bytes,
        "all_active": max(result.peak_active_kv_blocks) * result.kv_block_bytes,
    }
    for per_replica in result.peak_class_kv_blocks:
        for cls, blocks in per_replica.items():
            peaks[cls] = max(peaks.get(cls, 0.0), blocks * result.kv_block_bytes)
    timeline = pd.DataFrame(
        [
            (engine, policy, rep, t, used * result.kv_block_bytes / 1e9, waiting, running)
            for rep, t, used, waiting, running in result.timeline
        ],
        columns=list(TIMELINE_COLUMNS),
    )
    info: dict[str, Any] = {
        "wall_s": round(wall, 3),
        "num_steps": result.num_steps,
        "num_schedule_calls": result.num_schedule_calls,
        "simulated_s": result.end_s,
        "kv_capacity_blocks": result.kv_capacity_blocks,
        "kv_capacity_gb": result.kv_capacity_blocks * result.kv_block_bytes / 1e9,
        "counters": result.counters,
    }
    if policy_stats:
        info["policy_stats"] = policy_stats
    return CellResult(df, peaks, timeline, info)


def run_sim_hf_cpu_cell(
    config: BenchConfig,
    engine: str,
    policy: str,
    workload: Workload,
    *,
    plugins: Sequence[object] = (),
) -> CellResult:
    """Simulate ``workload`` on ``sim:hf-cpu`` (the real engine's mechanics and fitted step time,
    with the calibration's measured spread if ``step_spread=calibrated``: ``sim.step_spread``).

    ``plugins``: extra pluggy plugins registered beside the policy (as :func:`run_sim_cell`).

    Raises:
        UserError: a bad engine option or calibration file.
    """
    opts = hf_options(config.engine_options)
    profile = sim_profile(opts)  # the step-time file, read once
    # SGLang runs (and logs) a mixed batch's decodes as extends over their context
    extend = opts.extend_decodes
    if extends_decodes(opts.mechanics) if extend is None else extend:
        profile = replace(profile, step_time=replace(profile.step_time, extend_decodes=True))
    step_time, spread = profile.step_time, profile.spread
    sim_config = hf_cpu_sim_config(
        page_size_tokens=opts.page_size_tokens,
        num_blocks=opts.num_blocks,
        max_batch_tokens=opts.max_batch_tokens,
        max_num_seqs=opts.max_num_seqs,
        mechanics=opts.mechanics,
        mixed_batches=None if opts.mixed_batches is None else bool(opts.mixed_batches),
    )
    pm = policy_manager(policy, config.policy_options.get(policy), plugins=plugins)
    wall = time.perf_counter()
    result = Simulator(sim_config, pm.hook, step_time=profile.model()).run(workload.requests)
    wall = time.perf_counter() - wall
    latency_s = profile.request_latency_s
    df = sim_requests_frame(result, engine=engine, policy=policy, latency_s=latency_s)
    block_bytes = float(KV_BYTES_PER_TOKEN_FP32 * opts.page_size_tokens)
    peaks = {"all": max(result.peak_kv_blocks) * block_bytes}
    for per_replica in result.peak_class_kv_blocks:
        for cls, blocks in per_replica.items():
            peaks[cls] = max(peaks.get(cls, 0.0), blocks * block_bytes)
    timeline = pd.DataFrame(
        [
            (engine, policy, rep, t, used * block_bytes / 1e9, waiting, running)
            for rep, t, used, waiting, running in result.timeline
        ],
        columns=list(TIMELINE_COLUMNS),
    )
    info = {
        "wall_s": round(wall, 3),
        "num_steps": result.num_steps,
        "num_schedule_calls": result.num_schedule_calls,
        "simulated_s": result.end_s,
        "kv_capacity_blocks": opts.num_blocks,
        "kv_capacity_gb": opts.num_blocks * block_bytes / 1e9,
        "step_time": step_time.to_dict(),
        "kv_spill": step_time.spill_dict(),
        "step_spread_seed": None if spread is None else opts.step_spread_seed,
        "step_time_scale": opts.step_time_scale,
        "step_time_file": opts.step_time_file,
        "mechanics": opts.mechanics,
        "mixed_batches": sim_config.profile.mixed_batches,
        "extend_decodes": profile.step_time.extend_decodes,
        "request_latency_ms": round(latency_s * 1e3, 3),
    }
    return CellResult(df, peaks, timeline, info)
