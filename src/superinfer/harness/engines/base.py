"""What every engine runner shares: the run's settings, one cell's result, the timeline columns
and the one builder of the requests table.

An engine runner is ``runner(config, engine, policy, workload) -> CellResult``; the registry
(``engines.registry``) maps an engine id to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pandas as pd

from superinfer.harness.report.metrics import REQUEST_COLUMNS, add_latency_columns
from superinfer.sim.request import RequestSpec

__all__ = [
    "TIMELINE_COLUMNS",
    "BenchConfig",
    "CellResult",
    "RequestOutcome",
    "requests_frame",
]


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark: a workload on engines, under several policies.

    Attributes:
        trace: ``--trace`` name or path (see ``harness.workload.workload.TRACES``); ignored when
            ``workload`` is set.
        engines: engine ids (``sim:vllm``); each runs every policy.
        model: model name.
        gpu: GPU name.
        tp: tensor-parallel degree per replica.
        replicas: replicas behind the router.
        router: how arrivals are spread over replicas (``sim.routers.ROUTERS``).
        cpu_kv_ratio: CPU-tier KV capacity per replica as a multiple of its HBM KV capacity;
            ``None`` takes each engine profile's own, 0 disables the tier.
        policies: policy names; empty means every registered policy.
        policy_options: per policy name, constructor options.
        policy_opts: ``--policy-opt`` strings, ``key=value`` (every selected policy that has
            the option) or ``policy.key=value`` (that policy); resolved by
            :func:`harness.policies.merge_policy_opts` over ``policy_options``.
        rate_scale: arrival-rate multiplier.
        duration_s: workload window in scaled seconds (``None``: the whole trace).
        seed: seed of every random choice (synthetic arrivals, sampling, timestamp spreading
            of spec workloads; a plain trace replay draws none).
        workload: workload spec, a built-in name or a TOML path (``harness.workload.specs``);
            ``None`` uses ``trace``.
        kv_quant: store each request's KV at the precision the quantization planner chooses
            (``policy_core.quant_planner``), instead of FP16 for all.
        kv_policy: prefix-cache placement policy (``superinfer.kv_policies``: ``lru``, ``lfu``,
            ``reuse``); ``None``: the engine's own eviction order.
        horizon_s: stop simulating at this instant; requests still live then fail with reason
            ``"simulation_horizon"`` (``None``: run until every request ends).
        start_s: trace seconds skipped before the window.
        length_scale: factor on prompt and output lengths (``workload.scale_lengths``).
        max_prompt_tokens: cap on prompt lengths after scaling.
        max_output_tokens: cap on output lengths after scaling.
        engine_options: ``key -> value`` settings of the engines (``--engine-option``); the
            ``hf`` and ``sim:hf-cpu`` keys are ``harness.engines.hf.HFOptions``, the ``http``
            keys ``harness.engines.http.HTTPOptions``.
        url: base URL of the server the ``http`` engine benchmarks (``--url``).
        stack: ``"none"``, or ``"full"`` (``--stack full``): the rotation scheduler, the reuse
            predictor's placement and the KV quantization planner together, on every engine
            that supports each (``harness.bench.engine_stack``).
        backend: how the ``http`` engine sends SLO, priority and length fields: ``sglang``,
            ``vllm``, ``trtllm`` or ``openai`` (``--backend``).
    """

    trace: str = "azure"
    engines: tuple[str, ...] = ("sim:vllm",)
    model: str = "llama-3.1-70b"
    gpu: str = "a100-80gb"
    tp: int = 4
    replicas: int = 4
    router: str = "round_robin"
    cpu_kv_ratio: float | None = None
    policies: tuple[str, ...] = ()
    policy_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    policy_opts: tuple[str, ...] = ()
    rate_scale: float = 1.0
    duration_s: float | None = None
    seed: int = 0
    workload: str | None = None
    kv_quant: bool = False
    kv_quant_options: Mapping[str, str] = field(default_factory=dict)
    kv_policy: str | None = None
    horizon_s: float | None = None
    start_s: float = 0.0
    length_scale: float = 1.0
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    engine_options: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    backend: str = "openai"
    stack: str = "none"


@dataclass(frozen=True)
class CellResult:
    """One engine x policy run.

    Attributes:
        requests: its ``requests.parquet`` rows (columns :data:`REQUEST_COLUMNS`).
        kv_peak_bytes: peak KV bytes in HBM per SLO class, for ``"all"`` (cached prefixes
            included) and ``"all_active"`` (cached prefixes nobody uses excluded).
        timeline: samples with :data:`TIMELINE_COLUMNS`.
        info: facts for the manifest (capacity, steps, wall time).
        steps: per-step profile of a real engine (``engines.hf.STEP_COLUMNS``), or ``None``.
    """

    requests: pd.DataFrame
    kv_peak_bytes: dict[str, float]
    timeline: pd.DataFrame
    info: dict[str, Any]
    steps: pd.DataFrame | None = None


#: Columns of ``timeline.parquet``: per replica, sampled at step ends about once a second.
TIMELINE_COLUMNS = (
    "engine",
    "policy",
    "replica",
    "time_s",
    "kv_hbm_gb",
    "num_waiting",
    "num_running",
)


class RequestOutcome(NamedTuple):
    """What happened to one request, as an engine measured it (instants in s on the run clock).

    Attributes:
        generated_tokens: output tokens produced.
        first_token_s: instant of the first output token (``None``: none came).
        finish_s: instant it ended (``None``: it did not).
        status: ``finished``, ``rejected`` or ``failed``.
        reason: why it was rejected or failed (empty when finished).
        num_preemptions: times it was preempted.
        replica: replica that served it.
        max_itl_ms: largest gap between consecutive output tokens (ms); ``requests_frame``
            empties it (NaN) for a request with under two tokens or that did not finish.
    """

    generated_tokens: int
    first_token_s: float | None
    finish_s: float | None
    status: str
    reason: str
    num_preemptions: int
    replica: int
    max_itl_ms: float


def requests_frame(
    rows: Iterable[tuple[RequestSpec, RequestOutcome]], *, engine: str, policy: str
) -> pd.DataFrame:
    """The requests table (columns ``report.metrics.REQUEST_COLUMNS``) of one cell.

    The latency columns (``ttft_ms``, ``tpot_ms``, ``e2e_ms``, ``met_slo``) come from
    ``report.metrics.add_latency_columns`` (docs/metrics.md).

    Args:
        rows: per request, its spec and what happened to it.
        engine: engine id for the rows.
        policy: policy name for the rows.

    Returns:
        One row per request, in ``rows`` order; ``max_itl_ms`` is NaN for a request with
        under two output tokens or one that did not finish (docs/metrics.md).
    """
    data = [
        (
            engine,
            policy,
            s.request_id,
            s.source,
            s.slo.name,
            s.arrival_s,
            s.prompt_tokens,
            s.output_tokens,
            *outcome,
            s.slo.ttft_ms,
            s.slo.tpot_ms,
            s.slo.deadline_s,
        )
        for s, outcome in rows
    ]
    cols = [c for c in REQUEST_COLUMNS if c not in ("ttft_ms", "tpot_ms", "e2e_ms", "met_slo")]
    df = pd.DataFrame(data, columns=cols)
    for col in ("first_token_s", "finish_s", "slo_ttft_ms", "slo_tpot_ms", "slo_deadline_s"):
        df[col] = df[col].astype(float)
    # a gap needs two tokens, and latencies are empty for requests that did not finish
    no_gap = (df["status"] != "finished") | (df["generated_tokens"] < 2)
    df["max_itl_ms"] = df["max_itl_ms"].astype(float).mask(no_gap)
    return add_latency_columns(df)[list(REQUEST_COLUMNS)]
