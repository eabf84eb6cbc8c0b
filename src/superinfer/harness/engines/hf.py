"""Runners for the real CPU engine (``hf``) and its simulator profile (``sim:hf-cpu``).

``hf`` replays a workload against transformers' continuous-batching engine running
SmolLM2-135M-Instruct (``adapters/hf``) in real time: open loop (each request is submitted at its
arrival instant whatever the engine is doing), prompts of the requested lengths cut from the real
ShareGPT prompts, outputs forced to the trace's lengths (EOS ignored), and every output token
timed by the engine itself as it streams. Every request ends finished, rejected (with the reason
the engine or the policy gave) or failed (``run_horizon``, ``stalled``, ``engine_error``,
``token_count_mismatch``).

``sim:hf-cpu`` runs the same workload through the simulator with the engine's mechanics
(``sim/hf_cpu.py``) and a step-time model fitted on the real engine (:func:`calibrate_hf`).

torch and transformers are imported only when a real run starts, so the simulator side and the
CLI work without the ``hf`` extra.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from superinfer.adapters.manager import build_plugin_manager
from superinfer.harness.errors import DataError, UserError
from superinfer.harness.report.metrics import REQUEST_COLUMNS, add_latency_columns
from superinfer.harness.workload.data import trace_path
from superinfer.harness.workload.workload import Workload
from superinfer.sim.engine import SimConfig, Simulator
from superinfer.sim.hf_cpu import (
    HOST_CPU,
    KV_BYTES_PER_TOKEN_FP32,
    SIM_HF_CPU,
    SMOLLM2_135M,
    HFCPUStepTime,
    StepSample,
    shape_of,
    shape_of_totals,
)
from superinfer.sim.request import RequestSpec

if TYPE_CHECKING:
    from superinfer.adapters.hf.engine import EngineConfig, EngineSession, LoadedModel
    from superinfer.adapters.hf.plugin import StepRecord
    from superinfer.harness.bench import BenchConfig, CellResult

__all__ = [
    "HF_ENGINE",
    "HF_WORKLOAD",
    "SHAREGPT_FILE",
    "SIM_HF_CPU_ENGINE",
    "HFOptions",
    "PromptBuilder",
    "RequestTrace",
    "calibrate_hf",
    "fit_steps",
    "hf_options",
    "load_sharegpt_prompts",
    "replay",
    "run_hf_cell",
    "run_sim_hf_cpu_cell",
    "step_profile",
    "steps_frame",
    "trace_requests_frame",
    "workload_defaults",
]

HF_ENGINE = "hf"
SIM_HF_CPU_ENGINE = SIM_HF_CPU.name
SHAREGPT_FILE = "ShareGPT_V3_filtered_500.json"

#: The workload ``superinfer bench`` replays on ``hf`` / ``sim:hf-cpu`` unless told otherwise:
#: the Azure 2023 mix from trace second 100 (10 trace seconds: 39 chat and 16 batch requests,
#: the window holds the first code burst after the code service starts at 77 s), arrivals slowed
#: 20x (0.28 req/s over 200 s), lengths divided by 8 and capped at 256 prompt / 64 output
#: tokens. Sized from the figures in issue 8 (2 quiet cores: about 100 prompt and 24 output
#: tokens/s combined): about half the engine's capacity.
HF_WORKLOAD: dict[str, Any] = {
    "start_s": 100.0,
    "rate_scale": 0.05,
    "duration_s": 200.0,
    "length_scale": 0.125,
    "max_prompt_tokens": 256,
    "max_output_tokens": 64,
}
_SIM_WORKLOAD: dict[str, Any] = {
    "start_s": 0.0,
    "rate_scale": 1.0,
    "duration_s": None,
    "length_scale": 1.0,
    "max_prompt_tokens": None,
    "max_output_tokens": None,
}


def workload_defaults(engines: Sequence[str]) -> dict[str, Any]:
    """Workload settings to use where the user set none: :data:`HF_WORKLOAD` when any engine is
    ``hf`` or ``sim:hf-cpu`` (the two must see the same workload), else the whole trace."""
    small = any(e in (HF_ENGINE, SIM_HF_CPU_ENGINE) for e in engines)
    return dict(HF_WORKLOAD if small else _SIM_WORKLOAD)


# -- options ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HFOptions:
    """``--engine-option`` settings of ``hf`` and ``sim:hf-cpu``.

    Attributes:
        page_size_tokens: tokens per KV block.
        num_blocks: KV blocks of the pool.
        max_batch_tokens: token budget of a step.
        max_num_seqs: most requests per step.
        num_threads: torch threads of the real engine (``None``: one per core).
        drain_s: after the last arrival, how long the real run may take to finish, s.
        stall_s: a real run with live requests and no step for this long ends them as
            ``stalled``, s.
        step_time_file: calibration JSON for ``sim:hf-cpu`` (default: the coefficients in
            ``sim/hf_cpu.py``).
    """

    page_size_tokens: int = 32
    num_blocks: int = 256
    max_batch_tokens: int = 256
    max_num_seqs: int = 32
    num_threads: int | None = None
    drain_s: float = 1800.0
    stall_s: float = 60.0
    step_time_file: str | None = None


def hf_options(options: Mapping[str, str]) -> HFOptions:
    """Parse ``key=value`` engine options.

    Raises:
        UserError: an unknown key or a value of the wrong type; the message lists the keys.
    """
    known = dict(HFOptions.__annotations__)
    kwargs: dict[str, Any] = {}
    for key, raw in options.items():
        if key not in known:
            raise UserError(f"unknown --engine-option {key!r}; known: {', '.join(sorted(known))}")
        kind = known[key]
        try:
            if kind.startswith("int"):
                kwargs[key] = int(raw)
            elif kind.startswith("float"):
                kwargs[key] = float(raw)
            else:
                kwargs[key] = str(raw)
        except ValueError:
            raise UserError(f"--engine-option {key}={raw!r}: not a number") from None
    opts = HFOptions(**kwargs)
    for key in ("page_size_tokens", "num_blocks", "max_batch_tokens", "max_num_seqs"):
        if getattr(opts, key) < 1:
            raise UserError(f"--engine-option {key} must be >= 1, got {getattr(opts, key)}")
    return opts


def _engine_config(opts: HFOptions) -> EngineConfig:
    from superinfer.adapters.hf.engine import EngineConfig

    return EngineConfig(
        page_size_tokens=opts.page_size_tokens,
        num_blocks=opts.num_blocks,
        max_batch_tokens=opts.max_batch_tokens,
        max_num_seqs=opts.max_num_seqs,
        num_threads=opts.num_threads,
    )


# -- prompts ----------------------------------------------------------------------------------


def load_sharegpt_prompts(path: Path | None = None) -> list[str]:
    """First-turn user prompts of ``ShareGPT_V3_filtered_500.json`` (shared/data/traces).

    Raises:
        DataError: missing file, or not the expected JSON (names the file and the entry).
    """
    path = path or trace_path(SHAREGPT_FILE, download=False)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read ShareGPT prompts ({exc})") from None
    if not isinstance(data, list) or not data:
        raise DataError(f"{path}: expected a non-empty JSON array of conversations")
    prompts = []
    for i, entry in enumerate(data):
        try:
            text = entry["conversations"][0]["value"]
        except (KeyError, IndexError, TypeError):
            raise DataError(f"{path}: entry {i}: no conversations[0].value") from None
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{path}: entry {i}: empty prompt")
        prompts.append(text)
    return prompts


class PromptBuilder:
    """Prompts of exact token lengths cut from real ShareGPT text.

    The prompts are tokenized once and laid end to end (separated by a blank line) in an order
    drawn from ``seed``; request ``i`` starts at the ``i``-th prompt of that order and takes as
    many tokens as it needs, running into the following prompts when one is too short.

    Args:
        tokenizer: the model's tokenizer (``__call__`` returning ``input_ids``).
        texts: the prompts (:func:`load_sharegpt_prompts`).
        seed: seed of the order.
    """

    def __init__(self, tokenizer: Any, texts: Sequence[str], seed: int = 0) -> None:
        order = np.random.default_rng(seed).permutation(len(texts))
        sep = list(tokenizer("\n\n", add_special_tokens=False)["input_ids"])
        self._stream: list[int] = []
        self._starts: list[int] = []
        for k in order:
            self._starts.append(len(self._stream))
            self._stream.extend(tokenizer(texts[k], add_special_tokens=False)["input_ids"])
            self._stream.extend(sep)

    def build(self, index: int, num_tokens: int) -> list[int]:
        """Token ids of request ``index``'s prompt, exactly ``num_tokens`` long."""
        start = self._starts[index % len(self._starts)]
        out: list[int] = []
        while len(out) < num_tokens:
            take = self._stream[start : start + num_tokens - len(out)]
            out.extend(take)
            start = 0
        return out


# -- the real engine --------------------------------------------------------------------------


@dataclass(slots=True)
class RequestTrace:
    """What happened to one request of a real run. Instants are on the session clock (s).

    Attributes:
        spec: the request.
        token_times: the engine's timestamp of each output token, in order.
        status: ``finished``, ``rejected`` or ``failed``.
        reason: why it was rejected or failed (empty when finished).
        end_s: when it ended (its last token, for a finished request).
        submit_lag_s: how late it was handed to the engine after its arrival instant.
    """

    spec: RequestSpec
    token_times: list[float] = field(default_factory=list)
    status: str = ""
    reason: str = ""
    end_s: float | None = None
    submit_lag_s: float = 0.0


def replay(
    session: EngineSession,
    specs: Sequence[RequestSpec],
    prompts: Sequence[list[int]],
    opts: HFOptions,
) -> tuple[list[RequestTrace], float]:
    """Replay ``specs`` on a started session in real time, open loop.

    Each request is submitted at its ``arrival_s`` on the session clock with its prompt from
    ``prompts`` (same order) and must generate exactly ``output_tokens`` tokens. Streamed
    outputs are collected until every request has ended, ``opts.drain_s`` after the last arrival
    (the rest fail with ``run_horizon``), or when live requests see no step for ``opts.stall_s``
    (``stalled``).

    Returns:
        One trace per spec (in ``specs`` order) and the instant the replay stopped.

    Raises:
        PolicyError: the policy returned an inapplicable decision (or another error that stopped
            the engine's loop).
    """
    from superinfer.adapters.hf.view import TrackedRequest

    progress = {s.request_id: RequestTrace(s) for s in specs}
    order = sorted(range(len(specs)), key=lambda i: (specs[i].arrival_s, i))
    horizon = (max(s.arrival_s for s in specs) if specs else 0.0) + opts.drain_s
    live: set[str] = set()
    nxt = 0
    steps_seen, last_step_s = 0, 0.0
    while True:
        now = session.clock()
        while nxt < len(order) and specs[order[nxt]].arrival_s <= now:
            spec = specs[order[nxt]]
            tracked = TrackedRequest(
                spec.request_id,
                spec.arrival_s,
                spec.prompt_tokens,
                spec.max_output_tokens,
                spec.slo,
            )
            session.submit(tracked, prompts[order[nxt]], spec.output_tokens)
            progress[spec.request_id].submit_lag_s = session.clock() - spec.arrival_s
            live.add(spec.request_id)
            nxt += 1
        error = session.fatal_error
        if error is not None:
            raise error
        with session.binding.lock:
            ended = dict(session.binding.ended)
            steps = len(session.binding.steps)
        for rid in [r for r in live if r in ended]:
            status, reason, at = ended[rid]
            rec = progress[rid]
            rec.status, rec.reason, rec.end_s = status, reason, at
            live.discard(rid)
        if steps != steps_seen:
            steps_seen, last_step_s = steps, now
        if nxt == len(order) and not live:
            return list(progress.values()), now
        stalled = (
            live
            and nxt == len(order)
            and now - max(last_step_s, specs[order[-1]].arrival_s) > opts.stall_s
        )
        if now > horizon or stalled:
            for rid in live:
                rec = progress[rid]
                rec.status, rec.reason, rec.end_s = (
                    "failed",
                    "stalled" if stalled else "run_horizon",
                    now,
                )
            return list(progress.values()), now
        wait = 0.05 if nxt == len(order) else min(0.05, specs[order[nxt]].arrival_s - now)
        out = session.next_output(max(wait, 0.0))
        if out is None or out.request_id not in live:
            continue
        rec = progress[out.request_id]
        new = len(out.generated_tokens) - len(rec.token_times)
        stamps = out.timestamps or []
        if new > 0:
            rec.token_times.extend(session.to_session_s(t) for t in stamps[len(stamps) - new :])
        if out.is_finished():
            live.discard(out.request_id)
            rec.end_s = rec.token_times[-1] if rec.token_times else session.clock()
            if out.error is not None:
                rec.status, rec.reason = "failed", f"engine_error: {out.error}"
            elif len(rec.token_times) != rec.spec.output_tokens:
                rec.status, rec.reason = "failed", "token_count_mismatch"
            else:
                rec.status = "finished"


def trace_requests_frame(
    records: Sequence[RequestTrace], tracked: Mapping[str, Any], *, engine: str, policy: str
) -> pd.DataFrame:
    """The requests table (:data:`REQUEST_COLUMNS`) of a real run from its per-token timelines.

    ``first_token_s`` is the first token's instant, ``generated_tokens`` the number of token
    instants, ``max_itl_ms`` the largest gap between consecutive ones, ``finish_s`` the record's
    ``end_s``; the latencies come from
    :func:`~superinfer.harness.report.metrics.add_latency_columns`
    (docs/metrics.md). Used by ``hf`` and ``http``.

    Args:
        records: one per request.
        tracked: request id -> record with ``num_preemptions`` (missing ids: 0 preemptions).
        engine: engine id for the rows.
        policy: policy name for the rows.
    """
    rows = []
    for rec in records:
        s = rec.spec
        times = rec.token_times
        gaps = np.diff(times) if len(times) > 1 else np.zeros(0)
        t = tracked.get(s.request_id)
        rows.append(
            (
                engine,
                policy,
                s.request_id,
                s.source,
                s.slo.name,
                s.arrival_s,
                s.prompt_tokens,
                s.output_tokens,
                len(times),
                times[0] if times else None,
                rec.end_s,
                rec.status,
                rec.reason,
                t.num_preemptions if t is not None else 0,
                0,
                float(gaps.max()) * 1e3 if gaps.size else 0.0,
                s.slo.ttft_ms,
                s.slo.tpot_ms,
                s.slo.deadline_s,
            )
        )
    cols = [c for c in REQUEST_COLUMNS if c not in ("ttft_ms", "tpot_ms", "e2e_ms", "met_slo")]
    df = pd.DataFrame(rows, columns=cols)
    for col in ("first_token_s", "finish_s", "slo_ttft_ms", "slo_tpot_ms", "slo_deadline_s"):
        df[col] = df[col].astype(float)
    return add_latency_columns(df)[list(REQUEST_COLUMNS)]


#: Columns of ``steps.parquet``: one row per real engine step (durations in ms).
STEP_COLUMNS = (
    "engine",
    "policy",
    "step_index",
    "start_s",
    "duration_ms",
    "schedule_ms",
    "policy_ms",
    "prepare_ms",
    "forward_ms",
    "finish_ms",
    "kind",
    "num_seqs",
    "num_tokens",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_samples",
    "kv_tokens",
    "predicted_ms",
    "num_waiting",
    "used_blocks",
)


def steps_frame(
    steps: Sequence[StepRecord],
    *,
    engine: str,
    policy: str,
    step_time: HFCPUStepTime | None = None,
) -> pd.DataFrame:
    """One row per real step (:data:`STEP_COLUMNS`); ``predicted_ms`` is ``step_time``'s
    prediction for the step's shape (NaN without a model)."""
    rows = []
    for r in steps:
        shape = shape_of([(p.computed_tokens, p.num_tokens, p.samples) for p in r.pieces])
        decode = r.num_decode_tokens
        kind = "decode" if decode == r.num_tokens else "prefill" if decode == 0 else "mixed"
        rows.append(
            (
                engine,
                policy,
                r.step_index,
                r.start_s,
                r.duration_s * 1e3,
                r.schedule_s * 1e3,
                r.policy_s * 1e3,
                r.prepare_s * 1e3,
                r.forward_s * 1e3,
                r.finish_s * 1e3,
                kind,
                len(r.pieces),
                r.num_tokens,
                r.num_prefill_tokens,
                decode,
                shape.num_samples,
                shape.prefill_kv_tokens + shape.decode_kv_tokens,
                step_time.step_time_s(shape) * 1e3 if step_time else float("nan"),
                r.num_waiting,
                r.used_blocks,
            )
        )
    return pd.DataFrame(rows, columns=list(STEP_COLUMNS))


#: Phases of a step, in the order they run (``StepRecord``).
PHASES = ("schedule_ms", "prepare_ms", "forward_ms", "finish_ms")


def step_profile(steps: pd.DataFrame) -> dict[str, Any]:
    """Where the engine's time went: per phase, total and share of all step time; the policy's
    share; and the mean step by kind.

    Args:
        steps: :func:`steps_frame` rows of one run.
    """
    if steps.empty:
        return {"num_steps": 0}
    total = float(steps["duration_ms"].sum())
    phases = {
        p.removesuffix("_ms"): {
            "total_s": round(float(steps[p].sum()) / 1e3, 3),
            "share": round(float(steps[p].sum()) / total, 4),
        }
        for p in PHASES
    }
    phases["policy"] = {
        "total_s": round(float(steps["policy_ms"].sum()) / 1e3, 3),
        "share": round(float(steps["policy_ms"].sum()) / total, 4),
    }
    kinds = {
        kind: {
            "steps": len(part),
            "mean_ms": round(float(part["duration_ms"].mean()), 2),
            "mean_forward_ms": round(float(part["forward_ms"].mean()), 2),
            "mean_tokens": round(float(part["num_tokens"].mean()), 1),
            "mean_seqs": round(float(part["num_seqs"].mean()), 1),
        }
        for kind, part in steps.groupby("kind")
    }
    return {
        "num_steps": len(steps),
        "step_time_s": round(total / 1e3, 3),
        "phases": phases,
        "by_kind": kinds,
    }


def _check_workload(workload: Workload, opts: HFOptions, max_len: int) -> None:
    if not workload.requests:
        raise UserError("the workload has no requests")
    longest = max(s.prompt_tokens + s.output_tokens for s in workload.requests)
    if longest > max_len:
        raise UserError(
            f"a request needs {longest} tokens, more than the model's {max_len}: "
            "use --length-scale / --max-prompt-tokens / --max-output-tokens"
        )


def run_hf_cell(config: BenchConfig, engine: str, policy: str, workload: Workload) -> CellResult:
    """Replay ``workload`` on the real engine under ``policy``, in real time.

    Raises:
        UserError: a bad engine option, a request longer than the model's context, the hf extra
            or the model not installed, the ShareGPT prompts missing.
        PolicyError: the policy returned an inapplicable decision.
    """
    from superinfer.harness.bench import TIMELINE_COLUMNS, CellResult

    opts = hf_options(config.engine_options)
    try:
        from superinfer.adapters.hf.engine import ModelNotInstalledError, load_smollm2
    except ImportError as exc:
        raise UserError(f"engine hf needs the hf extra ({exc}); run `make install-hf`") from None
    try:
        loaded = load_smollm2()
    except ModelNotInstalledError as exc:
        raise UserError(str(exc)) from None
    _check_workload(workload, opts, loaded.max_model_len_tokens)
    builder = PromptBuilder(loaded.tokenizer, load_sharegpt_prompts(), seed=config.seed)
    specs = workload.requests
    prompts = [builder.build(i, s.prompt_tokens) for i, s in enumerate(specs)]
    pm = build_plugin_manager(policy, config.policy_options.get(policy))
    wall = time.perf_counter()
    session = _start_session(loaded, pm.hook, opts)
    try:
        records, end_s = replay(session, specs, prompts, opts)
    finally:
        session.stop(hard=True)
    wall = time.perf_counter() - wall
    b = session.binding
    df = trace_requests_frame(records, b.tracked, engine=engine, policy=policy)
    block_bytes = float(b.kv_block_bytes)
    peaks = {"all": b.peak_blocks * block_bytes}
    peaks.update({c: n * block_bytes for c, n in b.peak_class_blocks.items()})
    timeline = pd.DataFrame(
        [(engine, policy, 0, t, used * block_bytes / 1e9, w, r) for t, used, w, r in b.timeline],
        columns=list(TIMELINE_COLUMNS),
    )
    steps = steps_frame(b.steps, engine=engine, policy=policy, step_time=_sim_step_time(opts))
    lags = np.array([r.submit_lag_s for r in records])
    info = {
        "wall_s": round(wall, 3),
        "run_s": round(end_s, 3),
        "num_steps": len(b.steps),
        "model": loaded.name,
        "dtype": loaded.dtype,
        "model_load_s": round(loaded.load_s, 3),
        "engine": asdict(opts),
        "kv_capacity_blocks": opts.num_blocks,
        "kv_capacity_gb": opts.num_blocks * block_bytes / 1e9,
        "torch_threads": _torch_threads(opts),
        "submit_lag_ms": {
            "p50": round(float(np.percentile(lags, 50)) * 1e3, 3),
            "max": round(float(lags.max()) * 1e3, 3),
        },
        "step_profile": step_profile(steps),
    }
    return CellResult(df, peaks, timeline, info, steps)


def _torch_threads(opts: HFOptions) -> int:
    """Threads the engine ran with (read before or after a session: it restores torch's own)."""
    import torch

    return opts.num_threads or int(torch.get_num_threads())


def _start_session(loaded: LoadedModel, hook: Any, opts: HFOptions) -> EngineSession:
    from superinfer.adapters.hf.engine import EngineSession

    session = EngineSession(loaded, hook, _engine_config(opts))
    session.start()
    return session


# -- the simulator profile ---------------------------------------------------------------------


def _sim_step_time(opts: HFOptions) -> HFCPUStepTime:
    if opts.step_time_file is None:
        return HFCPUStepTime()
    try:
        return HFCPUStepTime.from_file(Path(opts.step_time_file))
    except ValueError as exc:
        raise UserError(str(exc)) from None


def run_sim_hf_cpu_cell(
    config: BenchConfig, engine: str, policy: str, workload: Workload
) -> CellResult:
    """Simulate ``workload`` on ``sim:hf-cpu`` (the real engine's mechanics and fitted step time).

    Raises:
        UserError: a bad engine option or calibration file.
    """
    from superinfer.harness.bench import TIMELINE_COLUMNS, CellResult, sim_requests_frame

    opts = hf_options(config.engine_options)
    step_time = _sim_step_time(opts)
    profile = replace(
        SIM_HF_CPU,
        block_size_tokens=opts.page_size_tokens,
        token_budget=opts.max_batch_tokens,
        token_budget_large_gpu=opts.max_batch_tokens,
        max_num_seqs=opts.max_num_seqs,
        max_num_seqs_large_gpu=opts.max_num_seqs,
    )
    sim_config = SimConfig(
        profile, SMOLLM2_135M, HOST_CPU, tp=1, replicas=1, num_gpu_blocks_override=opts.num_blocks
    )
    pm = build_plugin_manager(policy, config.policy_options.get(policy))
    wall = time.perf_counter()
    result = Simulator(sim_config, pm.hook, step_time=step_time).run(workload.requests)
    wall = time.perf_counter() - wall
    df = sim_requests_frame(result, engine=engine, policy=policy)
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
        "step_time_file": opts.step_time_file,
    }
    return CellResult(df, peaks, timeline, info)


# -- calibration -------------------------------------------------------------------------------

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
        pm = build_plugin_manager("fcfs")
        session = _start_session(loaded, pm.hook, opts)
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
        "torch_threads": _torch_threads(opts),
        "wall_s": round(time.perf_counter() - wall, 3),
        "step_profile": step_profile(steps),
    }
    return model, report, steps


def fit_steps(steps: pd.DataFrame) -> tuple[HFCPUStepTime, dict[str, Any]]:
    """Fit the ``sim:hf-cpu`` step-time model to recorded steps (:data:`STEP_COLUMNS`; only
    ``num_tokens``, ``num_seqs``, ``num_samples``, ``kv_tokens``, ``kind`` and ``duration_ms``
    are read), and set their ``predicted_ms`` column.

    Returns:
        The model and the JSON-able fit report (coefficients, fit error overall and per kind).

    Raises:
        UserError: too few steps or a missing column.
    """
    try:
        samples = [
            StepSample(
                shape_of_totals(
                    int(r["num_tokens"]),
                    int(r["num_seqs"]),
                    int(r["num_samples"]),
                    int(r["kv_tokens"]),
                ),
                float(r["duration_ms"]) / 1e3,
            )
            for _, r in steps.iterrows()
        ]
        model, fit = HFCPUStepTime.fit(samples)
    except (KeyError, ValueError) as exc:
        raise UserError(f"cannot fit the step-time model to these steps: {exc}") from None
    steps["predicted_ms"] = [model.step_time_s(s.shape) * 1e3 for s in samples]
    rel = (steps["predicted_ms"] - steps["duration_ms"]).abs() / steps["duration_ms"]
    report = {
        "coefficients": model.to_dict(),
        "units": "s per unit of each feature (sim/hf_cpu.py FEATURES)",
        "fit": asdict(fit),
        "fit_by_kind": {
            kind: {"steps": int(m.sum()), "mean_abs_rel_err": round(float(rel[m].mean()), 4)}
            for kind in ("prefill", "decode", "mixed")
            if (m := steps["kind"] == kind).any()
        },
    }
    return model, report
