"""Where each real engine's knee is, for ``bench --suite engines``: a short pilot of its native
policy in the same (quiet) window as the measured runs.

The knee is the load (total req/s) where the engine's own policy attains 0.6-0.85 of the chat
SLO (issue 24). It moves with the machine (two cores shared with other jobs slow a step 2-4x), so
a load fixed from a pilot on a busy machine misses it on a quiet one; the suite therefore probes
it right before the runs, starting from the lone requests' serial capacity
(:func:`serial_capacity`) and bracketing (:func:`find_knee`), and runs its 3 loads around it
(:func:`knee_loads`). Each engine's lone requests also calibrate its simulated rows
(:func:`lone_step_fit`: ``sim:sglang-cpu`` from SGLang's, ``sim:hf-cpu`` from hf's).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from superinfer.harness.errors import UserError
from superinfer.harness.suites_engines_options import SGLANG, SIM_FOR, SIM_SGLANG_LIMITS
from superinfer.sim.hf_cpu import FEATURES

__all__ = [
    "KNEE_BAND",
    "MIN_LOG_STEPS",
    "find_knee",
    "knee_loads",
    "engine_runs",
    "log_fit",
    "lone_step_fit",
    "request_path_ms",
    "pilot_knee",
    "serial_capacity",
    "sglang_step_fit",
    "step_log_fit",
    "with_seq_cost",
]

#: SGLang's prefill tokens per pass in the suite (its ``--chunked-prefill-size``).
SGLANG_CHUNK_TOKENS = int(SIM_SGLANG_LIMITS["max_batch_tokens"])
#: Native chat attainment that marks the knee.
KNEE_BAND = (0.6, 0.85)


def serial_capacity(lone: pd.DataFrame, batch_share: float) -> float:
    """Requests per second one-at-a-time service would sustain: ``1 / E[e2e]`` of the lone
    requests, classes weighted by the workload's mix (``batch_share`` batch).

    Args:
        lone: lone requests (``slo_class``, ``e2e_ms``; NaN for unfinished ones).
        batch_share: the workload's batch fraction.

    Returns:
        req/s; NaN when a class has no finished lone request.
    """
    med = lone.groupby("slo_class")["e2e_ms"].median()
    chat, batch = med.get("chat", math.nan), med.get("batch", math.nan)
    mean_s = ((1 - batch_share) * chat + batch_share * batch) / 1e3
    return 1.0 / mean_s if mean_s > 0 else math.nan


def find_knee(
    attainment_at: Callable[[float], float],
    start: float,
    *,
    step: float = 1.5,
    max_probes: int = 4,
    band: tuple[float, float] = KNEE_BAND,
) -> tuple[float, list[tuple[float, float]]]:
    """Bracket the load where ``attainment_at(load)`` falls inside ``band``.

    From ``start``: up by ``step`` while above the band, down while below; once a load above and
    one below the band are known, their geometric mean. Stops at the first probe inside the band
    or after ``max_probes``.

    Args:
        attainment_at: runs the engine's native policy at a load, returns its chat attainment.
        start: first load, req/s (> 0).
        step: factor between probes (> 1).
        max_probes: most probes.
        band: ``(low, high)`` attainment of the knee.

    Returns:
        ``(knee load, [(load, attainment), ...] in probe order)``: the in-band probe; else the
        geometric mean of the tightest bracket; else, every probe on one side of the band, one
        ``step`` past the last probe in the direction of the band (the highest load times
        ``step`` when all attained above it, the lowest divided by ``step`` when all fell below).
    """
    probes: list[tuple[float, float]] = []
    load = start
    above = below = None  # highest load above the band, lowest load below it
    for _ in range(max_probes):
        att = float(attainment_at(load))
        probes.append((load, att))
        if band[0] <= att <= band[1]:
            return load, probes
        if att > band[1]:
            above = load if above is None else max(above, load)
        else:
            below = load if below is None else min(below, load)
        if above is not None and below is not None:
            load = math.sqrt(above * below)
        elif above is not None:
            load = above * step
        else:
            load = below / step  # type: ignore[operator]
    if above is not None and below is not None:
        return math.sqrt(above * below), probes
    # one-sided: every probe above the band (too light) or below it (too heavy); the knee lies
    # past the last probe, so go one more step that way (the next probe it would have run)
    return load, probes


def knee_loads(knee: float, spread: float = 1.25) -> tuple[float, float, float]:
    """The 3 loads around ``knee``: ``knee / spread``, ``knee``, ``knee * spread``, each rounded to
    3 significant digits."""
    return tuple(float(f"{x:.3g}") for x in (knee / spread, knee, knee * spread))  # type: ignore[return-value]


def pilot_knee(
    attainment_at: Callable[[float], float],
    lone: pd.DataFrame | None,
    batch_share: float,
    fallback: float,
    max_probes: int,
) -> dict[str, Any]:
    """:func:`find_knee` from the lone requests' :func:`serial_capacity` (``fallback`` req/s
    without one), 3 significant digits; ``{"start", "probes", "knee", "loads"}``."""
    start = serial_capacity(lone, batch_share) if lone is not None else math.nan
    start = float(f"{start if start > 0 else fallback:.3g}")
    knee, probes = find_knee(attainment_at, start, max_probes=max_probes)
    return {"start": start, "probes": probes, "knee": knee, "loads": knee_loads(knee)}


def lone_step_fit(
    lone: pd.DataFrame,
    chunk_tokens: int,
    label: str,
    batched: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """A ``sim:hf-cpu`` step-time calibration for a real engine from its lone requests and, when
    given, its batched pass.

    With ``T1`` the median TPOT of the lone requests (one decode step of one sequence), ``P``
    and ``TTFT`` the median prompt and first-token time of the lone batch prompts
    (``n = ceil(P / chunk_tokens)`` prefill passes) and ``b`` the least-squares slope of the
    batched groups' median TPOT against their size ``k`` (with ``(1, T1)``; a decode step of
    ``k`` sequences is ``intercept + (num_tokens + num_seqs) * k``):
    ``num_tokens = (TTFT - n * T1) / (P - n)``, ``num_seqs = b - num_tokens`` and
    ``intercept = T1 - b``, each clipped at 0 (``num_seqs = 0`` and ``intercept = T1 -
    num_tokens`` without a batched pass, or when ``b`` is below ``num_tokens``). Other terms 0:
    the context length's cost is not separated from the rest.

    Args:
        lone: the lone run's requests (``slo_class``, ``prompt_tokens``, ``ttft_ms``, ``tpot_ms``).
        chunk_tokens: the engine's prefill tokens per pass (SGLang ``--chunked-prefill-size``,
            hf ``max_batch_tokens``).
        label: the engine, for the source line and the error.
        batched: the batched pass's requests (``concurrency``, ``tpot_ms``), or None.

    Returns:
        ``{"coefficients": {feature: s}, "source": ...}`` (``HFCPUStepTime.from_file`` reads it).

    Raises:
        UserError: no finished lone batch request to fit on.
    """
    done = lone.dropna(subset=["ttft_ms"])
    batch = done[done["slo_class"] == "batch"]
    if batch.empty or done["tpot_ms"].dropna().empty:
        raise UserError(
            f"the simulated {label} rows need the lone {label} requests (suite.lone > 0)"
        )
    tpot = float(done["tpot_ms"].median()) / 1e3
    ttft = float(batch["ttft_ms"].median()) / 1e3
    prompt = float(batch["prompt_tokens"].median())
    passes = float(np.ceil(prompt / chunk_tokens))
    c_tok = max((ttft - passes * tpot) / (prompt - passes), 0.0)
    c_seq, groups = 0.0, ""
    timed = batched.dropna(subset=["tpot_ms"]) if batched is not None else None
    if timed is not None and not timed.empty:
        med = timed.groupby("concurrency")["tpot_ms"].median() / 1e3
        ks = np.array([1.0, *med.index.astype(float)])
        ts = np.array([tpot, *med.to_numpy()])
        slope = float(np.polyfit(ks, ts, 1)[0])
        c_seq = max(slope - c_tok, 0.0)
        groups = ", TPOT " + ", ".join(
            f"{t * 1e3:.1f} ms at {int(k)}" for k, t in zip(ks, ts, strict=True)
        )
    c0 = max(tpot - c_tok - c_seq, 0.0)
    coef = dict.fromkeys(FEATURES, 0.0)
    coef.update(intercept=c0, num_tokens=c_tok, num_seqs=c_seq)
    return {
        "coefficients": coef,
        "source": f"lone {label} requests: decode step {tpot * 1e3:.1f} "
        f"ms, {prompt:.0f}-token prompt TTFT {ttft * 1e3:.0f} ms in {passes:.0f} passes "
        f"of {chunk_tokens}" + (f"; batched{groups} sequences" if groups else ""),
    }


def sglang_step_fit(lone: pd.DataFrame, batched: pd.DataFrame | None = None) -> dict[str, Any]:
    """:func:`lone_step_fit` for SGLang at the suite's ``--chunked-prefill-size``
    (``SIM_SGLANG_LIMITS["max_batch_tokens"]``, 512)."""
    return lone_step_fit(lone, SGLANG_CHUNK_TOKENS, "SGLang", batched)


def with_seq_cost(
    own: Mapping[str, Any], donor: Mapping[str, Any], donor_name: str
) -> dict[str, Any]:
    """The step-time fit ``own`` (``lone_step_fit``'s JSON) with the per-sequence decode cost
    (``num_seqs``) of the fit ``donor`` (a run with the batched pass), scaled by ``own``'s
    intercept over ``donor``'s: the cost of an extra sequence is taken as a share of the step,
    so a fit from a run on a slower or faster machine state carries over
    (``benchmarks/fidelity_cpu.py --seq-cost-from``).

    Raises:
        KeyError: a fit without ``coefficients`` / ``intercept`` / ``num_seqs``.
    """
    out = json.loads(json.dumps(own))
    a, b = out["coefficients"], donor["coefficients"]
    ratio = float(a["intercept"]) / float(b["intercept"])
    a["num_seqs"] = float(b["num_seqs"]) * ratio
    out["source"] = (
        f"{own.get('source', 'lone fit')}; per-sequence decode cost "
        f"{float(b['num_seqs']) * 1e3:.2f} ms from {donor_name} (batched pass) x {ratio:.3f}, "
        "the ratio of the two intercepts"
    )
    return dict(out)


#: Fewest steps in a real engine's step logs the suite fits its simulation on (fewer: the lone fit).
MIN_LOG_STEPS = 200


def engine_runs(steps: pd.DataFrame, engine: str) -> pd.DataFrame:
    """The rows of ``engine``'s runs in a suite's step log (its ``run`` column,
    ``<engine>_<policy>_<load>_<repeat>``: ``suites_engines.collect_step_logs``); a suite that
    ran hf and SGLang keeps both in one log."""
    return steps[steps["run"].astype(str).str.startswith(f"{engine}_")]


def step_log_fit(
    steps: pd.DataFrame, engine: str, lone: Mapping[str, Any], *, iterations: bool
) -> dict[str, Any] | None:
    """The step time of ``engine``'s simulation fitted on its runs' own step logs (``steps``:
    ``suites_engines.collect_step_logs``' frame, its ``run`` column ``<engine>_...``), with the
    lone fit kept beside it (``lone``); ``None`` with fewer than :data:`MIN_LOG_STEPS` steps of
    ``engine``.

    ``iterations`` (an SGLang server's log, for ``sim:sglang-cpu``): whole scheduler iterations
    (``offline.calibrate_hf``'s ``sglang_iteration_steps``); else (``hf``, for ``sim:hf-cpu``)
    the engine's steps as logged. The fit is
    ``calibrate --steps``'s (``offline.calibrate_hf.fit_steps``): coefficients, the spill term
    where the steps show one (``kv_spill``) and the steps' spread (``spread``, used only with
    ``step_spread=calibrated``). On the hf knee runs a fit on the runs' own steps put 255 of 288
    replayed rows within issue 19's bounds (254 with the fit that keeps the steps' total time,
    ``fit_steps``; ``results/fidelity/host_speed_summary.csv``); the lone fit's rows, 14 of 108
    (``results/fidelity``).
    """
    from superinfer.harness.offline.calibrate_hf import fit_steps, sglang_iteration_steps

    if steps.empty:
        return None
    steps = engine_runs(steps, engine)
    if len(steps) < MIN_LOG_STEPS:
        return None
    _, report = fit_steps(sglang_iteration_steps(steps) if iterations else steps.copy())
    runs = steps["run"].nunique()
    what = (
        "each run_batch plus the scheduler's gap before it (calibrate --engine sglang)"
        if iterations
        else "each engine step as logged (calibrate --engine hf --steps)"
    )
    return {
        "coefficients": report["coefficients"],
        "kv_spill": report["kv_spill"],
        "spread": report["spread"],
        "fit": report["fit"],
        "total_scale": report["total_scale"],
        "scaled_fit": report["scaled_fit"],
        "fit_by_kind": report["fit_by_kind"],
        "source": f"the {engine} runs' own step logs: {len(steps)} steps of {runs} runs, {what}",
        "lone": dict(lone),
    }


def request_path_ms(lone: pd.DataFrame, steps: pd.DataFrame) -> float | None:
    """The server's request path outside its scheduler steps, ms: the median over the lone
    requests of the client's TTFT less the server's own time to that request's first token, read
    in the server's step log of the lone pass.

    The lone requests run one at a time, far apart, so each one's prefill is a run of
    consecutive ``prefill`` steps, each after the first holding the earlier ones as its prefix
    (``prefix_tokens``), whose ``num_prefill_tokens`` add up to its prompt (two chunks, 512 +
    388 tokens, for a 900-token prompt); the server's time to its first token is that
    run's ``duration_ms`` plus the scheduler gaps inside it. Runs of a length no lone prompt has
    (the server's warm-up requests) are passed over; the rest pair with the lone requests in
    arrival order, and only when there are as many of them as lone requests (a prefix hit or a
    request that never ran would shift every later pair: then no estimate). Finished requests
    with a finite difference count. What is left of the client's TTFT is the tokenizer
    and the hand-off to the scheduler (with ``--sleep-on-idle``, its wake-up), the detokenizer,
    the HTTP stream and our client: a step loop has none of it (``sim:hf-cpu``'s
    ``request_latency_ms`` adds it to every first token and finish as the client sees them).

    Args:
        lone: the lone requests (``requests`` rows: ``arrival_s``, ``prompt_tokens``,
            ``status``, ``ttft_ms``).
        steps: the server's step log over the lone pass (``adapters/sglang/steplog.py``
            columns: ``kind``, ``num_prefill_tokens``, ``prefix_tokens``, ``duration_ms``,
            ``gap_ms``), in order.

    Returns:
        ms, rounded to 0.1 (negative medians are 0); ``None`` without a safe pairing or a
        finished lone request.
    """
    runs: list[tuple[int, float]] = []  # (prefill tokens, server ms) of each run of prefills
    open_run = False
    cols = ("kind", "num_prefill_tokens", "prefix_tokens", "duration_ms", "gap_ms")
    for kind, tokens, prefix, dur, gap in zip(*(steps[c] for c in cols), strict=True):
        if kind != "prefill":
            open_run = False
        elif open_run and prefix >= runs[-1][0]:  # a later chunk: its earlier ones are its prefix
            n, ms = runs[-1]
            runs[-1] = (n + int(tokens), ms + float(gap) + float(dur))
        else:
            runs.append((int(tokens), float(dur)))
            open_run = True
    ordered = lone.sort_values("arrival_s")
    prompts = {int(n) for n in ordered["prompt_tokens"]}
    theirs = [ms for n, ms in runs if n in prompts]  # runs of a lone prompt's length, in order
    if len(theirs) != len(ordered):
        return None  # a run missing or extra (a prefix hit, a failed request): no safe pairing
    gaps = [
        float(ttft) - ms
        for ms, ttft, status in zip(theirs, ordered["ttft_ms"], ordered["status"], strict=True)
        if status == "finished" and math.isfinite(float(ttft) - ms)
    ]
    return round(max(0.0, float(np.median(gaps))), 1) if gaps else None


def log_fit(
    engine: str,
    lone: dict[str, Any],
    logs: pd.DataFrame,
    info: dict[str, Any],
    tell: Callable[[str], None],
) -> dict[str, Any]:
    """The step time of ``engine``'s simulation: fitted on its runs' step logs ``logs``
    (:func:`step_log_fit`), else the ``lone`` fit (too few steps, or a fit that
    fails: said in ``info["step_log_fit_failed"]`` and through ``tell``). With a log fit, each
    run's host speed against it goes to ``info["host_speeds"][engine]``
    (``offline.calibrate_hf.run_speeds``); if that fails, the fit stays and the reason goes to
    ``info["host_speed_failed"][engine]``.

    Args:
        engine: the real engine (``hf`` or ``sglang``).
        lone: its fit on the lone requests (:func:`lone_step_fit`).
        logs: the runs' step logs (``suites_engines.collect_step_logs``).
        info: the suite's info dict, added to.
        tell: progress messages.
    """
    from superinfer.harness.offline.calibrate_hf import run_speeds
    from superinfer.sim.hf_cpu import HFCPUStepTime

    try:
        fit = step_log_fit(logs, engine, lone, iterations=engine == SGLANG)
    except UserError as exc:  # the real runs are kept; the simulation takes the lone fit
        info.setdefault("step_log_fit_failed", {})[engine] = str(exc)
        tell(f"{engine}: no fit on its step logs ({exc}); {SIM_FOR[engine]} takes the lone fit")
        return lone
    if fit is None:
        return lone
    try:
        speeds = run_speeds(engine_runs(logs, engine), HFCPUStepTime.from_calibration(fit))
        info.setdefault("host_speeds", {})[engine] = speeds
    except (UserError, ValueError) as exc:
        info.setdefault("host_speed_failed", {})[engine] = str(exc)
        tell(f"{engine}: no host speeds ({exc})")
    return fit
