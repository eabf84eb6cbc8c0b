"""The real CPU engine (``hf``): its options, the real-time replay and its tables.

``hf`` replays a workload against transformers' continuous-batching engine running
SmolLM2-135M-Instruct (``adapters/hf``) in real time: open loop (each request is submitted at its
arrival instant whatever the engine is doing), prompts of the requested lengths cut from the real
ShareGPT prompts, outputs forced to the trace's lengths (EOS ignored), and every output token
timed by the engine itself as it streams. Every request ends finished, rejected (with the reason
the engine or the policy gave) or failed (``run_horizon``, ``stalled``, ``engine_error``,
``token_count_mismatch``).

``sim:hf-cpu`` (``engines.sim.run_sim_hf_cpu_cell``) runs the same workload through the
simulator with the engine's mechanics (``sim/hf_cpu.py``) and a step-time model fitted on the
real engine (``offline.calibrate_hf``).

torch and transformers are imported only when a real run starts, so the simulator side and the
CLI work without the ``hf`` extra.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from superinfer.harness.engines.base import (
    TIMELINE_COLUMNS,
    BenchConfig,
    CellResult,
    RequestOutcome,
    requests_frame,
)
from superinfer.harness.engines.hf_sim import sim_step_time
from superinfer.harness.errors import UserError
from superinfer.harness.policies import policy_manager
from superinfer.harness.workload.prompts import PromptBuilder, load_sharegpt_prompts
from superinfer.harness.workload.workload import Workload
from superinfer.sim.hf_cpu import (
    MECHANICS,
    SIM_HF_CPU,
    HFCPUStepTime,
    hf_cpu_sim_config,
    shape_of,
)
from superinfer.sim.request import RequestSpec

if TYPE_CHECKING:
    from superinfer.adapters.hf.engine import EngineConfig, EngineSession, LoadedModel
    from superinfer.adapters.hf.plugin import StepRecord

__all__ = [
    "HF_ENGINE",
    "SIM_HF_CPU_ENGINE",
    "STEP_COLUMNS",
    "STEP_SPREADS",
    "HFOptions",
    "RequestTrace",
    "hf_options",
    "replay",
    "run_hf_cell",
    "start_session",
    "step_profile",
    "steps_frame",
    "torch_threads",
    "trace_requests_frame",
]

#: The real CPU engine's id (its registry entry: ``engines.registry``).
HF_ENGINE = "hf"
#: Its simulator profile's id.
SIM_HF_CPU_ENGINE = SIM_HF_CPU.name


# -- options ----------------------------------------------------------------------------------


#: ``--engine-option step_spread`` values (:class:`HFOptions`).
STEP_SPREADS = ("calibrated", "none")


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
        mechanics: ``sim:hf-cpu``'s scheduling mechanics: ``hf`` (our CPU engine's: mixed
            prefill/decode steps, chunk admission, hashed blocks) or ``sglang`` (``sim:sglang``'s:
            prefill batches that run without decodes, ``new_token_ratio`` admission with
            retraction, radix cache), at the limits above (``sim.hf_cpu.hf_cpu_sim_config``).
        step_spread: ``none`` (default): the fitted time alone; ``calibrated``: ``sim:hf-cpu``
            scales each step by a ratio drawn from the step-time file's measured spread
            (``sim.step_spread``; the file must have one). Off by default: replaying the five
            hf knee runs with it put fewer rows within issue 19's bounds (240 of 288 against
            255; ``results/fidelity/README.md``).
        step_spread_seed: seed of those draws.
        request_latency_ms: ``sim:hf-cpu`` adds this to every request's first token and finish
            as the client sees them (the server's request path outside its steps; the policy
            decides on the step times); ``None`` (default): the step-time file's
            ``request_latency_ms`` (``suites_engines_knee.request_path_ms``), else 0.
        step_time_scale: ``sim:hf-cpu`` runs every step this many times as long as the fit says
            (> 0; a real run's measured host speed: ``offline.calibrate_hf.run_speeds``).
        mixed_batches: ``sim:hf-cpu`` with ``mechanics=sglang``: ``1`` runs SGLang's
            ``--enable-mixed-chunk`` (a prefill batch carries the running decodes), ``0`` its
            default; ``None`` (default): the mechanics' own (``hf`` always mixes, and refuses 0).
        extend_decodes: ``1``: a step with prefill chunks counts its decodes' held context as
            prefix (``HFCPUStepTime.extend_decodes``: SGLang's mixed batch on its CPU backend);
            ``0``: decodes are decodes (SGLang with ``adapters/sglang/extend_rows.py``);
            ``None`` (default): ``1`` with ``mechanics=sglang``, else ``0``.
    """

    page_size_tokens: int = 32
    num_blocks: int = 256
    max_batch_tokens: int = 256
    max_num_seqs: int = 32
    num_threads: int | None = None
    drain_s: float = 1800.0
    stall_s: float = 60.0
    step_time_file: str | None = None
    mechanics: str = "hf"
    step_spread: str = "none"
    step_spread_seed: int = 0
    request_latency_ms: float | None = None
    step_time_scale: float = 1.0
    mixed_batches: int | None = None
    extend_decodes: int | None = None


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
    if opts.mechanics not in MECHANICS:
        raise UserError(
            f"--engine-option mechanics={opts.mechanics!r}: one of {', '.join(MECHANICS)}"
        )
    if opts.step_spread not in STEP_SPREADS:
        raise UserError(
            f"--engine-option step_spread={opts.step_spread!r}: one of {', '.join(STEP_SPREADS)}"
        )
    for key in ("page_size_tokens", "num_blocks", "max_batch_tokens", "max_num_seqs"):
        if getattr(opts, key) < 1:
            raise UserError(f"--engine-option {key} must be >= 1, got {getattr(opts, key)}")
    if (lat := opts.request_latency_ms) is not None and not 0.0 <= lat < math.inf:
        raise UserError(f"--engine-option request_latency_ms must be >= 0 and finite, got {lat}")
    if opts.extend_decodes not in (None, 0, 1):
        raise UserError(f"--engine-option extend_decodes must be 0 or 1, got {opts.extend_decodes}")
    if opts.mixed_batches not in (None, 0, 1):
        raise UserError(f"--engine-option mixed_batches must be 0 or 1, got {opts.mixed_batches}")
    if opts.mixed_batches is not None:
        try:
            hf_cpu_sim_config(mechanics=opts.mechanics, mixed_batches=bool(opts.mixed_batches))
        except ValueError as exc:
            raise UserError(f"--engine-option {exc}") from None
    if not 0.0 < opts.step_time_scale < math.inf:
        raise UserError(f"--engine-option step_time_scale must be > 0, got {opts.step_time_scale}")
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
    """The requests table (``REQUEST_COLUMNS``) of a real run from its per-token timelines.

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
        times = rec.token_times
        gaps = np.diff(times) if len(times) > 1 else np.zeros(0)
        t = tracked.get(rec.spec.request_id)
        outcome = RequestOutcome(
            generated_tokens=len(times),
            first_token_s=times[0] if times else None,
            finish_s=rec.end_s,
            status=rec.status,
            reason=rec.reason,
            num_preemptions=t.num_preemptions if t is not None else 0,
            replica=0,
            max_itl_ms=float(gaps.max()) * 1e3 if gaps.size else 0.0,
        )
        rows.append((rec.spec, outcome))
    return requests_frame(rows, engine=engine, policy=policy)


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
    pm = policy_manager(policy, config.policy_options.get(policy))
    wall = time.perf_counter()
    session = start_session(loaded, pm.hook, opts)
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
    steps = steps_frame(b.steps, engine=engine, policy=policy, step_time=sim_step_time(opts))
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
        "torch_threads": torch_threads(opts),
        "submit_lag_ms": {
            "p50": round(float(np.percentile(lags, 50)) * 1e3, 3),
            "max": round(float(lags.max()) * 1e3, 3),
        },
        "step_profile": step_profile(steps),
    }
    return CellResult(df, peaks, timeline, info, steps)


def torch_threads(opts: HFOptions) -> int:
    """Torch threads the engine ran with (read before or after a session: it restores
    torch's own)."""
    import torch

    return opts.num_threads or int(torch.get_num_threads())


def start_session(loaded: LoadedModel, hook: Any, opts: HFOptions) -> EngineSession:
    """A started engine session on ``loaded`` with hook relay ``hook`` and ``opts``' limits."""
    from superinfer.adapters.hf.engine import EngineSession

    session = EngineSession(loaded, hook, _engine_config(opts))
    session.start()
    return session
