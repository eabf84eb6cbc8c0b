"""One simulation cell of a sweep or a fleet search: its spec, its run, and its cache key.

A cell is a window of a workload on one ``sim:*`` engine under one policy at one cluster size.
The simulator draws no randomness it is not given, so a cell's outcome is a function of its spec,
the workload's source files and this package's code; :func:`cell_key` hashes exactly those, and
:class:`CellCache` keeps outcomes under that key so an interrupted sweep resumes where it stopped.

Time windows (all in scaled seconds on the workload clock)::

    | warmup_s  | <---------- duration_s ----------> |
    ^           ^ start_s                            ^ start_s + duration_s
    simulated, not measured    measured: requests arriving here are the cell's metrics
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from superinfer.adapters.hookspecs import hookimpl
from superinfer.harness.bench import engine_stack
from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.engines.isolated import (
    engine_isolated_latency,
    mark_feasible,
    resolve_requests,
)
from superinfer.harness.engines.registry import engine_family, parse_stack
from superinfer.harness.engines.sim import check_kv_fits, run_sim_cell
from superinfer.harness.errors import UserError
from superinfer.harness.policies import registered_policies
from superinfer.harness.report.metrics import summarize
from superinfer.harness.report.results import write_atomic
from superinfer.harness.workload.resolve import resolve_workload
from superinfer.harness.workload.workload import TRACES, Workload
from superinfer.policy_core.types import SLO, RequestView, StepStats
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.profiles import get_profile
from superinfer.sim.request import RequestSpec
from superinfer.sim.routers import ROUTERS

__all__ = [
    "CACHE_SCHEMA",
    "CELL_FIELDS",
    "AttainmentGuard",
    "CellCache",
    "CellSpec",
    "TargetMissed",
    "WindowStats",
    "allowed_misses",
    "attainment",
    "cell_key",
    "check_cell",
    "code_digest",
    "load_workload",
    "met_slo",
    "run_cell",
    "select_requests",
    "slo_bound_s",
    "workload_digest",
]

#: Version of the cached outcome's layout; bump when :func:`run_cell`'s output changes shape.
CACHE_SCHEMA = 1


@dataclass(frozen=True)
class CellSpec:
    """One simulation: a workload window on one engine, under one policy, at one cluster size.

    Attributes:
        trace: workload, a ``--trace`` name (``harness.workload.TRACES``) or an Azure CSV path.
        engine: ``sim:*`` engine id.
        policy: registered policy name (``native`` is resolved before a cell is made).
        model: model name.
        gpu: GPU name.
        tp: tensor-parallel degree (GPUs per replica).
        replicas: replicas behind the router.
        router: one of ``sim.routers.ROUTERS``.
        cpu_kv_ratio: CPU-tier KV capacity as a multiple of HBM's (``None``: the profile's).
        rate_scale: arrival-rate multiplier.
        seed: seed of every random choice (recorded; trace replays draw none).
        start_s: start of the measured window, s.
        duration_s: length of the measured window, s (``None``: to the end of the workload).
        warmup_s: simulated before ``start_s`` and not measured, so the window does not start
            on an empty cluster.
        classes: SLO classes kept (empty: all); a cluster that serves only some classes.
        slo: SLO classes replacing the workload's of the same name.
        targets: ``(class, attainment)`` pairs; when given, the cell stops as soon as a class
            has missed more requests than its target allows (:class:`TargetMissed`), and it
            simulates only until the last instant a measured request could still meet its SLO
            (:func:`slo_bound_s`), which changes no attainment.
        stack: ``"none"`` or ``"full"``: as ``bench --stack`` (``harness.bench.engine_stack``:
            the rotation, the reuse predictor's placement and the KV quantization planner, where
            the engine supports each).
    """

    trace: str = "azure"
    engine: str = "sim:vllm"
    policy: str = "fcfs"
    model: str = "llama-3.1-70b"
    gpu: str = "a100-80gb"
    tp: int = 4
    replicas: int = 4
    router: str = "round_robin"
    cpu_kv_ratio: float | None = None
    rate_scale: float = 1.0
    seed: int = 0
    start_s: float = 0.0
    duration_s: float | None = None
    warmup_s: float = 0.0
    classes: tuple[str, ...] = ()
    slo: tuple[SLO, ...] = ()
    targets: tuple[tuple[str, float], ...] = ()
    stack: str = "none"

    @property
    def gpus(self) -> int:
        """GPUs of the cluster: ``replicas x tp``."""
        return self.replicas * self.tp


#: Fields a sweep spec may set or vary, with the type each takes.
CELL_FIELDS: dict[str, Any] = {
    f.name: f.type for f in fields(CellSpec) if f.name not in ("classes", "slo", "targets")
}


class TargetMissed(Exception):
    """Raised inside a simulation once a class can no longer reach its attainment target.

    Attributes:
        slo_class: the class.
        time_s: simulated instant of the miss that exceeded the budget.
        misses: measured requests of the class that missed their SLO so far.
        allowed: most misses its target allows.
    """

    def __init__(self, slo_class: str, time_s: float, misses: int, allowed: int) -> None:
        super().__init__(f"{slo_class}: {misses} misses > {allowed} allowed at t={time_s:.1f} s")
        self.slo_class, self.time_s, self.misses, self.allowed = slo_class, time_s, misses, allowed

    def as_dict(self) -> dict[str, Any]:
        """The stop as a JSON-able dict."""
        return {
            "slo_class": self.slo_class,
            "time_s": self.time_s,
            "misses": self.misses,
            "allowed": self.allowed,
        }


def allowed_misses(n: int, target: float) -> int:
    """Most misses out of ``n`` requests that keep attainment ``(n - misses) / n >= target``.

    The same float comparison the plan applies to a finished cell, so stopping early never
    disagrees with simulating to the end.
    """
    if n == 0:
        return 0
    m = max(0, min(n, int((1.0 - target) * n)))
    while m < n and (n - m - 1) / n >= target:
        m += 1
    while m > 0 and (n - m) / n < target:
        m -= 1
    return m


def met_slo(request: RequestView, finish_s: float) -> bool:
    """Whether a request that finished at ``finish_s`` met its SLO.

    The formula and float operations of ``metrics.add_latency_columns``, so the two agree
    exactly (docs/metrics.md).
    """
    slo = request.slo
    if request.first_token_s is None:
        return False
    ttft_ms = (request.first_token_s - request.arrival_s) * 1e3
    e2e_ms = (finish_s - request.arrival_s) * 1e3
    if slo.ttft_ms is not None and not ttft_ms <= slo.ttft_ms:
        return False
    decode = request.generated_tokens - 1
    if slo.tpot_ms is not None and decode > 0 and not (e2e_ms - ttft_ms) / decode <= slo.tpot_ms:
        return False
    return slo.deadline_s is None or e2e_ms <= slo.deadline_s * 1e3


class AttainmentGuard:
    """Observer plugin: counts measured SLO misses per class; raises :class:`TargetMissed` once
    a class exceeds its budget (:func:`allowed_misses`).

    Args:
        measured: ids of the measured requests.
        allowed: per class, the misses its target allows.
    """

    def __init__(self, measured: Iterable[str], allowed: Mapping[str, int]) -> None:
        self.measured = frozenset(measured)
        self.allowed = dict(allowed)
        self.misses: dict[str, int] = {}

    def _miss(self, request: RequestView, now_s: float) -> None:
        cls = request.slo.name
        self.misses[cls] = self.misses.get(cls, 0) + 1
        if cls in self.allowed and self.misses[cls] > self.allowed[cls]:
            raise TargetMissed(cls, now_s, self.misses[cls], self.allowed[cls])

    @hookimpl
    def superinfer_request_finished(self, request: RequestView, now_s: float) -> None:
        if request.request_id in self.measured and not met_slo(request, now_s):
            self._miss(request, now_s)

    @hookimpl
    def superinfer_request_aborted(self, request: RequestView, now_s: float, reason: str) -> None:
        if request.request_id in self.measured:
            self._miss(request, now_s)


class WindowStats:
    """Observer plugin: what the replicas did inside ``[start_s, end_s)``.

    A step (or run of repeated steps) that straddles a bound counts in proportion to its overlap.

    Attributes:
        busy_s: replica-seconds spent running steps.
        tokens: prefill + decode tokens run.
    """

    def __init__(self, start_s: float, end_s: float) -> None:
        self.start_s, self.end_s = start_s, end_s
        self.busy_s = 0.0
        self.tokens = 0.0

    @hookimpl
    def superinfer_step_finished(self, stats: StepStats) -> None:
        begin = stats.now_s - stats.duration_s
        lo, hi = max(begin, self.start_s), min(stats.now_s, self.end_s)
        if hi <= lo:
            return
        self.busy_s += hi - lo
        share = (hi - lo) / stats.duration_s if stats.duration_s > 0 else 1.0
        self.tokens += share * (stats.num_prefill_tokens + stats.num_decode_tokens)


def check_cell(cell: CellSpec) -> None:
    """Fail fast, before any simulation, on a cell that cannot run.

    Raises:
        UserError: unknown engine, policy, model, GPU or router; a bad TP degree (one that does
            not divide the KV heads, or whose weights leave no KV memory), replica count, rate
            scale, seed, CPU-tier ratio or window.
    """
    try:
        profile = get_profile(cell.engine)
        model = get_model(cell.model)
        gpu = get_gpu(cell.gpu)
    except KeyError as exc:
        raise UserError(exc.args[0]) from None
    registered = registered_policies()
    if cell.policy not in registered:  # ``native`` included: it is resolved before a cell is made
        known = ", ".join(sorted(registered))
        raise UserError(f"unknown policy {cell.policy!r}; registered: {known}")
    if cell.replicas < 1:
        raise UserError(f"replicas must be >= 1, got {cell.replicas}")
    if cell.tp < 1 or model.num_kv_heads % cell.tp:
        raise UserError(f"tp must divide {model.name}'s {model.num_kv_heads} KV heads")
    check_kv_fits(profile, model, gpu, cell.tp, "tp")
    if cell.router not in ROUTERS:
        raise UserError(f"unknown router {cell.router!r}; known: {', '.join(ROUTERS)}")
    if cell.stack != parse_stack(cell.stack):  # a bad part raises its own one-line error
        raise UserError(f"stack {cell.stack!r} is not canonical: {parse_stack(cell.stack)!r}")
    if not cell.rate_scale > 0:
        raise UserError(f"rate_scale must be > 0, got {cell.rate_scale}")
    if cell.seed < 0:  # numpy's generators take seeds >= 0 only
        raise UserError(f"seed must be >= 0, got {cell.seed}")
    ratio = cell.cpu_kv_ratio
    if ratio is not None and not (math.isfinite(ratio) and ratio >= 0):
        raise UserError(f"cpu_kv_ratio must be >= 0 and finite, got {ratio}")
    if cell.duration_s is not None and not cell.duration_s > 0:
        raise UserError(f"duration_s must be > 0, got {cell.duration_s}")
    for name in ("start_s", "warmup_s"):
        value = getattr(cell, name)
        if not (math.isfinite(value) and value >= 0):
            raise UserError(f"{name} must be >= 0 and finite, got {value}")
    for cls, target in cell.targets:
        if not 0 < target <= 1:
            raise UserError(f"target of {cls!r} must be in (0, 1], got {target}")


@functools.lru_cache(maxsize=4)
def load_workload(trace: str, rate_scale: float, seed: int = 0) -> Workload:
    """The whole workload ``trace`` at ``rate_scale``.

    ``trace`` is a ``--trace`` name or CSV path (``harness.workload.TRACES``), or else a workload
    spec: a built-in name or a TOML path (``harness.workload.specs``), built with ``seed``.

    Raises:
        UserError: unknown trace or spec, or a bad scale; ``TraceFormatError`` for a malformed
            file.
    """
    return resolve_workload(trace, seed=seed, rate_scale=rate_scale)


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.lru_cache(maxsize=16)
def workload_digest(trace: str) -> str:
    """sha256 over the source files of workload ``trace`` (what a cache entry depends on)."""
    from superinfer.harness.workload.data import trace_path

    if trace in TRACES:
        paths = []
        for src in TRACES[trace]:
            path = Path(src.file)
            paths.append(path if path.is_file() else trace_path(src.file))
    elif trace.endswith(".csv"):
        paths = [Path(trace)]
    else:  # a workload spec: its text and the files of its sources
        from superinfer.harness.workload.spec_build import resolve_source_file
        from superinfer.harness.workload.specs import builtin_specs, load_workload_spec

        spec = load_workload_spec(trace)
        text = builtin_specs().get(trace)
        paths = [resolve_source_file(spec, i, src) for i, src in enumerate(spec.sources)]
        h = hashlib.sha256((text if text is not None else Path(trace).read_text()).encode())
        for path in paths:
            h.update(_file_sha256(path).encode())
        return h.hexdigest()
    h = hashlib.sha256()
    for path in paths:
        h.update(_file_sha256(path).encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 over this package's ``.py`` and ``.json`` files: a cached cell is reused only by
    the code that computed it."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def cell_key(cell: CellSpec) -> str:
    """Cache key of ``cell``: a hash of its spec, its workload's files and the package's code."""
    payload = {
        "schema": CACHE_SCHEMA,
        "cell": asdict(cell),
        "workload": workload_digest(cell.trace),
        "code": code_digest(),
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def slo_bound_s(slo: SLO, max_output_tokens: int) -> float | None:
    """Latest finish after arrival at which a request of ``slo`` can still meet it, s.

    ``min(deadline_s, ttft + tpot x (max_output_tokens - 1))`` over the targets set; ``None``
    when neither bound exists (only a TTFT target: a request may decode forever and meet it).
    """
    bounds = []
    if slo.deadline_s is not None:
        bounds.append(slo.deadline_s)
    if slo.ttft_ms is not None and slo.tpot_ms is not None:
        bounds.append((slo.ttft_ms + slo.tpot_ms * max(max_output_tokens - 1, 0)) / 1e3)
    return min(bounds) if bounds else None


def select_requests(
    workload: Workload, cell: CellSpec
) -> tuple[tuple[RequestSpec, ...], frozenset[str]]:
    """The requests ``cell`` simulates (warm-up and window, its classes, SLOs replaced), and
    the ids of those it measures.

    Raises:
        UserError: an SLO or class the workload does not have, or an empty window.
    """
    names = {r.slo.name for r in workload.requests}
    for cls in [*cell.classes, *(s.name for s in cell.slo), *(c for c, _ in cell.targets)]:
        if cls not in names:
            raise UserError(f"workload {cell.trace!r} has no SLO class {cls!r}: {sorted(names)}")
    slos = {s.name: s for s in cell.slo}
    lo = cell.start_s - cell.warmup_s
    end = math.inf if cell.duration_s is None else cell.start_s + cell.duration_s
    kept, measured = [], []
    for req in workload.requests:
        if req.arrival_s < lo or req.arrival_s >= end:
            continue
        if cell.classes and req.slo.name not in cell.classes:
            continue
        if req.slo.name in slos:
            req = replace(req, slo=slos[req.slo.name])
        kept.append(req)
        if req.arrival_s >= cell.start_s:
            measured.append(req.request_id)
    if not measured:
        raise UserError(
            f"workload {cell.trace!r}: no requests in [{cell.start_s}, {end}) s"
            + (f" of classes {list(cell.classes)}" if cell.classes else "")
        )
    return tuple(kept), frozenset(measured)


def _horizon(requests: Sequence[RequestSpec], measured: frozenset[str]) -> float | None:
    latest = 0.0
    for req in requests:
        if req.request_id in measured:
            bound = slo_bound_s(req.slo, req.max_output_tokens)
            if bound is None:
                return None
            latest = max(latest, req.arrival_s + bound)
    return latest + 1.0  # 1 s past the last instant any measured request can still meet its SLO


def _plain(value: Any) -> Any:
    """numpy scalars to Python ones, for JSON."""
    return value.item() if hasattr(value, "item") else value


def run_cell(cell: CellSpec) -> dict[str, Any]:
    """Simulate ``cell``; the outcome as a JSON-able dict (what :class:`CellCache` stores).

    Returns:
        ``summary``: ``summary.csv`` rows (per class, then ``all``) of the measured requests,
        empty if the cell stopped early; ``stopped``: ``None`` or the stop
        (:meth:`TargetMissed.as_dict`); ``n_measured``: measured requests per class;
        ``output_tokens``: tokens generated for measured requests; ``window_s``: the measured
        window's length; ``busy_fraction``: replica-seconds of steps inside the window over
        ``replicas x window_s`` (what ``nvidia-smi`` calls GPU utilisation); ``mfu``: model
        FLOPs utilisation in the window, ``2 N tokens / (gpus x peak FLOP/s x window_s)`` with
        ``N`` parameters and every prefill and decode token run (weights only, attention
        excluded: a lower bound; Kaplan et al. 2020, "Scaling laws", 2N FLOPs per token);
        ``wall_s``, ``num_steps``, ``simulated_s``, ``kv_capacity_gb``.

    Raises:
        UserError: see :func:`check_cell` and :func:`select_requests`.
        PolicyError: the policy returned an inapplicable decision.
    """
    check_cell(cell)
    workload = load_workload(cell.trace, cell.rate_scale, cell.seed)
    requests, measured = select_requests(workload, cell)
    latency = engine_isolated_latency(
        BenchConfig(model=cell.model, gpu=cell.gpu, tp=cell.tp), cell.engine
    )
    requests = resolve_requests(requests, cell.engine, latency)
    counts: dict[str, int] = {}
    for req in requests:
        if req.request_id in measured:
            counts[req.slo.name] = counts.get(req.slo.name, 0) + 1
    last_arrival = max(r.arrival_s for r in requests)
    end_s = cell.start_s + cell.duration_s if cell.duration_s is not None else last_arrival
    window_s = end_s - cell.start_s
    config = BenchConfig(
        trace=cell.trace,
        engines=(cell.engine,),
        model=cell.model,
        gpu=cell.gpu,
        tp=cell.tp,
        replicas=cell.replicas,
        router=cell.router,
        cpu_kv_ratio=cell.cpu_kv_ratio,
        policies=(cell.policy,),
        rate_scale=cell.rate_scale,
        seed=cell.seed,
        horizon_s=_horizon(requests, measured) if cell.targets else None,
        stack=cell.stack,
    )
    config, _ = engine_stack(config, engine_family(cell.engine))
    stats = WindowStats(cell.start_s, end_s)
    plugins: list[object] = [stats]
    if cell.targets:
        budget = {cls: allowed_misses(counts.get(cls, 0), t) for cls, t in cell.targets}
        plugins.append(AttainmentGuard(measured, budget))
    outcome: dict[str, Any] = {
        "summary": [],
        "stopped": None,
        "n_measured": dict(sorted(counts.items())),
        "window_s": window_s,
    }
    t0 = time.perf_counter()
    try:
        result = run_sim_cell(
            config, cell.engine, cell.policy, replace(workload, requests=requests), plugins=plugins
        )
    except TargetMissed as stop:
        outcome["stopped"] = stop.as_dict()
        outcome["wall_s"] = round(time.perf_counter() - t0, 3)
        return outcome
    df = result.requests[result.requests["request_id"].isin(measured)]
    df = mark_feasible(df, requests, latency)
    rows = summarize(df, engine=cell.engine, policy=cell.policy, kv_peak_bytes=result.kv_peak_bytes)
    outcome["summary"] = [{k: _plain(v) for k, v in row.items()} for row in rows]
    model, gpu = get_model(cell.model), get_gpu(cell.gpu)
    flops_s = cell.gpus * gpu.peak_flops * window_s
    outcome.update(
        output_tokens=int(df["generated_tokens"].sum()),
        busy_fraction=stats.busy_s / (cell.replicas * window_s) if window_s > 0 else math.nan,
        mfu=2 * model.num_params * stats.tokens / flops_s if window_s > 0 else math.nan,
        wall_s=round(time.perf_counter() - t0, 3),
        num_steps=result.info["num_steps"],
        simulated_s=result.info["simulated_s"],
        kv_capacity_gb=result.info["kv_capacity_gb"],
    )
    return outcome


def attainment(outcome: Mapping[str, Any]) -> dict[str, float]:
    """SLO attainment per class of a finished cell (empty for one that stopped early)."""
    return {
        row["slo_class"]: row["slo_attainment"]
        for row in outcome["summary"]
        if row["slo_class"] != "all"
    }


class CellCache:
    """Outcomes of finished cells, one JSON file per :func:`cell_key` under ``root``.

    Each file also records the cell's spec, so a cache directory can be read on its own. A file
    that cannot be parsed counts as missing (the cell runs again). ``root=None`` caches nothing;
    ``read=False`` stores outcomes but never returns them (a fresh run that refills the cache).
    """

    def __init__(self, root: Path | None, *, read: bool = True) -> None:
        self.root = root
        self.read = read

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached outcome of ``key``, or ``None``."""
        if self.root is None or not self.read:
            return None
        try:
            entry = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        outcome = entry.get("outcome") if isinstance(entry, dict) else None
        return outcome if isinstance(outcome, dict) else None

    def put(self, key: str, cell: CellSpec, outcome: Mapping[str, Any]) -> None:
        """Store ``outcome`` of ``cell`` under ``key`` (atomically)."""
        if self.root is None:
            return
        text = json.dumps({"key": key, "cell": asdict(cell), "outcome": outcome}, indent=1)
        write_atomic(self._path(key), lambda p: p.write_text(text + "\n"))
