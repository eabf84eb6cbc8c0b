"""A request's latency alone on an idle replica of an engine, and the per-engine SLO pass:
engine-relative targets resolved, and every request marked feasible or not.

The isolated latency comes from the engine's step-time model: the simulator's own for
``sim:<profile>`` (``sim.calibrated.default_step_time``, the profile's step token budget) and
``sim:hf-cpu``; for the real CPU engine ``hf``, the same measured calibration
(``sim.hf_cpu.HFCPUStepTime``: its default fit, or ``--engine-opt step_time_file``). Engines
without one (``sglang``, ``http``) have no isolated latency: engine-relative SLOs are refused
there and feasibility is unknown (NaN in ``summary.csv``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.engines.registry import engine_family
from superinfer.harness.errors import UserError
from superinfer.harness.workload.workload import Workload
from superinfer.policy_core.slo_forms import (
    engine_relative,
    for_request,
    has_forms,
    infeasible_reason,
)
from superinfer.sim.config import StepTimeModel, repeatable
from superinfer.sim.request import RequestSpec
from superinfer.sim.step_time import BatchShape

__all__ = [
    "IsolatedLatency",
    "engine_isolated_latency",
    "engine_slos",
    "feasibility_info",
    "mark_feasible",
    "resolve_requests",
]


@dataclass(frozen=True)
class IsolatedLatency:
    """One request alone on an idle replica: no queue, no other request in its steps, no prefix
    cache hit.

    Attributes:
        step_time: the engine's step-time model.
        token_budget: most tokens per step (the prompt is prefilled in chunks of this many).
        source: where the model comes from, for the report.
    """

    step_time: StepTimeModel
    token_budget: int
    source: str

    def prefill_ms(self, prompt_tokens: int) -> float:
        """Its TTFT: the prefill steps of a ``prompt_tokens`` prompt, chunks of
        ``token_budget`` tokens, the last sampling the first token (ms)."""
        total, done = 0.0, 0
        while done < prompt_tokens:
            n = min(self.token_budget, prompt_tokens - done)
            last = done + n == prompt_tokens
            pairs = n * (done + (n + 1) / 2)
            shape = BatchShape(n, int(last), pairs, done + n, 0.0, 1, n, n * (done + n), 1)
            total += self.step_time.step_time_s(shape)
            done += n
        return total * 1e3

    def decode_ms(self, context_tokens: int) -> float:
        """One decode step alone reading ``context_tokens + 1`` KV tokens (ms)."""
        if not repeatable(self.step_time):  # not a + b * KV (a spill term): step by step
            kv = float(context_tokens + 1)
            shape = BatchShape(
                num_tokens=1, num_samples=1, prefill_attn_pairs=0.0, prefill_kv_tokens=0,
                decode_kv_tokens=kv, num_seqs=1, prefill_tokens=0,
            )  # fmt: skip
            return self.step_time.step_time_s(shape) * 1e3
        a, b = self.step_time.decode_coefficients(1)
        return (a + b * (context_tokens + 1)) * 1e3

    def tpot_ms(self, prompt_tokens: int, output_tokens: int) -> float:
        """Its mean time per output token: decode steps ``k = 1 .. output_tokens - 1`` read
        ``prompt_tokens + k`` KV tokens, so the mean is ``a + b (prompt + output / 2)`` (ms); for
        a model that is not linear in the KV, the mean of those steps' :meth:`decode_ms`."""
        if not repeatable(self.step_time):
            steps = range(prompt_tokens, prompt_tokens + max(output_tokens - 1, 1))
            return sum(self.decode_ms(c) for c in steps) / len(steps)
        a, b = self.step_time.decode_coefficients(1)
        return (a + b * (prompt_tokens + output_tokens / 2)) * 1e3


def engine_isolated_latency(config: BenchConfig, engine: str) -> IsolatedLatency | None:
    """The isolated latency model of ``engine`` under ``config``, or ``None`` where the engine
    has no step-time model (``sglang``, ``http``).

    Raises:
        UserError: unknown model, GPU or profile, or a bad calibration file.
    """
    kind = engine_family(engine).step_model
    if kind == "hf-cpu":
        from superinfer.harness.engines.hf import hf_options
        from superinfer.harness.engines.hf_sim import sim_step_time

        opts = hf_options(config.engine_options)
        where = opts.step_time_file or "the default sim:hf-cpu fit"
        return IsolatedLatency(
            sim_step_time(opts), opts.max_batch_tokens, f"hf-cpu calibration: {where}"
        )
    if kind != "sim":
        return None
    from superinfer.sim.calibrated import default_step_time
    from superinfer.sim.engine_costs import EngineStepTime
    from superinfer.sim.hardware import get_gpu, get_model
    from superinfer.sim.profiles import get_profile

    try:
        profile = get_profile(engine)
        model, gpu = get_model(config.model), get_gpu(config.gpu)
    except KeyError as exc:
        raise UserError(exc.args[0]) from None
    if config.tp < 1 or model.num_kv_heads % config.tp:
        raise UserError(f"--tp must divide {model.name}'s {model.num_kv_heads} KV heads")
    budget, _ = profile.limits(gpu)
    # the engine's own step time (issue 19): kernel scale, CPU per step, overlap, as the
    # simulator runs it (sim.engine_costs.engine_step_time at the default FP16 weights and KV)
    step = EngineStepTime(default_step_time(model, gpu, config.tp), profile)
    return IsolatedLatency(
        step, budget, f"{engine} step-time model: {type(step).__name__}, {gpu.name} TP{config.tp}"
    )


def _resolve(spec: RequestSpec, latency: IsolatedLatency | None) -> RequestSpec:
    slo = spec.slo
    if not has_forms(slo):
        return spec
    prefill = decode = None
    if latency is not None:
        prefill = latency.prefill_ms(spec.prompt_tokens)
        decode = latency.decode_ms(spec.prompt_tokens)
    return dataclasses.replace(
        spec, slo=for_request(slo, spec.prompt_tokens, prefill_ms=prefill, decode_ms=decode)
    )


def resolve_requests(
    requests: tuple[RequestSpec, ...], engine: str, latency: IsolatedLatency | None
) -> tuple[RequestSpec, ...]:
    """``requests`` with every SLO made absolute for ``engine``
    (:func:`~superinfer.policy_core.slo_forms.for_request`); the same tuple when no class has a
    form.

    Raises:
        UserError: an engine-relative class on an engine without an isolated latency model.
    """
    formed = {r.slo.name: r.slo for r in requests if has_forms(r.slo)}
    if not formed:
        return requests
    relative = sorted(n for n, s in formed.items() if engine_relative(s))
    if relative and latency is None:
        raise UserError(
            f"SLO class {relative[0]!r} is engine-relative (ttft_x_isolated / tpot_x_isolated) "
            f"but engine {engine!r} has no step-time calibration; use absolute targets there"
        )
    return tuple(_resolve(r, latency) for r in requests)


def engine_slos(workload: Workload, engine: str, latency: IsolatedLatency | None) -> Workload:
    """``workload`` with its requests' SLOs made absolute for ``engine``
    (:func:`resolve_requests`); the workload itself when no class has a form.

    Raises:
        UserError: an engine-relative class on an engine without an isolated latency model.
    """
    requests = resolve_requests(workload.requests, engine, latency)
    if requests is workload.requests:
        return workload
    return dataclasses.replace(workload, requests=requests)


def mark_feasible(
    df: pd.DataFrame, requests: tuple[RequestSpec, ...], latency: IsolatedLatency | None
) -> pd.DataFrame:
    """Add ``feasible`` (bool, or NaN without a latency model) and ``infeasible_reason``
    (``""`` when feasible) to a cell's requests table, row ``i`` being ``requests[i]``
    (:func:`~superinfer.policy_core.slo_forms.infeasible_reason` on its isolated latency)."""
    out = df.copy()
    if latency is None:
        out["feasible"] = float("nan")
        out["infeasible_reason"] = ""
        return out
    cache: dict[tuple[int, int], tuple[float, float]] = {}
    reasons = []
    for spec in requests:
        key = (spec.prompt_tokens, spec.output_tokens)
        if key not in cache:
            cache[key] = (
                latency.prefill_ms(spec.prompt_tokens),
                latency.tpot_ms(spec.prompt_tokens, spec.output_tokens),
            )
        ttft, tpot = cache[key]
        reasons.append(infeasible_reason(spec.slo, spec.output_tokens, ttft_ms=ttft, tpot_ms=tpot))
    by_id = dict(zip((s.request_id for s in requests), reasons, strict=True))
    out["infeasible_reason"] = [by_id.get(rid, "") for rid in out["request_id"]]
    out["feasible"] = out["infeasible_reason"] == ""
    return out


def feasibility_info(df: pd.DataFrame, latency: IsolatedLatency | None) -> dict[str, object]:
    """For the manifest and the report: where the isolated latency came from, and per SLO class
    the requests an idle replica cannot serve within their SLO, by the target missed
    (``{"chat": {"n": 1445, "infeasible": {"ttft": 117}}}``). ``df``: one cell's requests table
    with the :func:`mark_feasible` columns."""
    if latency is None or "feasible" not in df:
        return {"source": None, "classes": {}}
    classes: dict[str, dict[str, object]] = {}
    for cls, part in df.groupby("slo_class", sort=True):
        kinds = part.loc[~part["feasible"].astype(bool), "infeasible_reason"].str.split().str[0]
        counts = {str(k): int(v) for k, v in kinds.value_counts().sort_index().items()}
        classes[str(cls)] = {"n": len(part), "infeasible": counts}
    return {"source": latency.source, "classes": classes}
