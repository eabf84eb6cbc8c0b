"""Fleet planning: the fewest replicas that meet every SLO class's attainment target.

For each engine x policy, and for each layout (one ``shared`` cluster for every class, or
``separate`` clusters, one per class), a search over replica counts runs the simulator on a
window of the workload and keeps the smallest count whose cell meets every target.

**Window.** Simulating the whole Azure hour at 8 replicas takes tens of seconds per cell; a
search takes several cells per layout and policy. The search therefore runs on the busiest
``window_s`` (default 900 s) of the workload, by tokens arriving (prompt + output, starts on a
60 s grid), after a ``warmup_s`` (default 300 s) of the traffic before it that is simulated but
not measured, so the window does not start on an idle cluster. A fleet sized for its busiest
quarter hour is what a capacity plan provisions; ``check_full`` re-simulates every plan on the
whole workload and reports its attainment there.

**Search.** Attainment is not monotone in the replica count: the router deals requests
differently at every count, so a burst can land on one replica at ``n + 1`` and not at ``n``.
The search (:func:`next_count`) gallops ``lo, 2 lo, 4 lo, ...`` until a count passes, then
scans every count upward from the last failing gallop count; the plan is the first count that
passes **and** whose next ``confirm`` counts pass too (a pass followed by a failure is a fluke
of routing, not a capacity to provision). Counts below the last failing gallop count are not
simulated. Cells stop as soon as a class has missed more requests than its target allows, and
simulate only until the last instant a measured request could still meet its SLO; neither
changes any attainment (``harness.grid.cells``).

**Cost.** ``cost_per_mtok = gpus x gpu_price x window_s / 3600 / (output tokens / 1e6)``: the
fleet's GPU-hours over the window per million output tokens it generated for the requests that
arrived in the window. **Utilisation**, two ways: ``busy_fraction``, replica-seconds of steps in
the window over ``replicas x window_s`` (what ``nvidia-smi`` shows; near 1 whenever decodes are
in flight), and ``mfu``, model FLOPs utilisation (``harness.grid.cells.run_cell``; docs/metrics.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from superinfer.harness.errors import UserError
from superinfer.harness.grid.cells import CellSpec, attainment, check_cell
from superinfer.harness.grid.executors import CellRunner, ProgressFn
from superinfer.harness.policies import resolve_policy
from superinfer.harness.workload.workload import Workload
from superinfer.policy_core.types import SLO

__all__ = [
    "DEFAULT_TARGET",
    "PLAN_COLUMNS",
    "FleetConfig",
    "FleetPlan",
    "next_count",
    "peak_window_start",
    "plan_fleet",
    "render_plan",
]

#: Attainment target of a class the user gave none.
DEFAULT_TARGET = 0.99
#: Start grid of the peak-window search, s.
WINDOW_GRID_S = 60.0

#: Columns of ``plan.csv``, in order (a contract: never rename, only append).
PLAN_COLUMNS = (
    "workload",
    "engine",
    "policy",
    "layout",
    "replicas",
    "tp",
    "gpus",
    "meets_slo",
    "chat_attainment",
    "batch_attainment",
    "cost_per_mtok",
)


@dataclass(frozen=True)
class FleetConfig:
    """What to plan.

    Attributes:
        trace: workload (``--trace`` name or Azure CSV path).
        engines: ``sim:*`` engine ids.
        policies: policy names; ``native`` is each engine's native policy.
        model: model name.
        gpu: GPU name.
        tp: tensor-parallel degree per replica.
        router: router across replicas.
        cpu_kv_ratio: CPU-tier KV capacity as a multiple of HBM's (``None``: the profile's).
        rate_scale: arrival-rate multiplier.
        seed: seed of every random choice.
        slo: SLO classes replacing the workload's of the same name.
        targets: ``(class, attainment)``; a class not listed gets :data:`DEFAULT_TARGET`.
        window_s: measured window, s (``None``: the whole workload, no warm-up).
        window_start_s: its start, s (``None``: the busiest window, :func:`peak_window_start`).
        warmup_s: simulated before the window, not measured, s.
        gpu_price: $ per GPU-hour.
        min_replicas: first count of the search.
        max_replicas: largest count tried; a layout that fails there does not meet its SLO.
        confirm: counts above a passing count that must pass too.
        split: also plan separate clusters, one per SLO class.
        check_full: re-simulate each plan on the whole workload.
        stack: ``"none"`` or ``"full"`` for every cell (:attr:`CellSpec.stack`).
    """

    trace: str = "azure"
    engines: tuple[str, ...] = ("sim:trtllm",)
    policies: tuple[str, ...] = ("native",)
    model: str = "llama-3.1-70b"
    gpu: str = "h100-80gb"
    tp: int = 4
    router: str = "round_robin"
    cpu_kv_ratio: float | None = None
    rate_scale: float = 1.0
    seed: int = 0
    slo: tuple[SLO, ...] = ()
    targets: tuple[tuple[str, float], ...] = ()
    window_s: float | None = 900.0
    window_start_s: float | None = None
    warmup_s: float = 300.0
    gpu_price: float = 2.0
    min_replicas: int = 1
    max_replicas: int = 64
    confirm: int = 1
    split: bool = False
    check_full: bool = False
    stack: str = "none"


def next_count(known: Mapping[int, bool], lo: int, hi: int, confirm: int) -> int | None:
    """The next replica count the search needs, or ``None`` when it is done.

    Args:
        known: pass (True) or fail per count simulated so far.
        lo: first count; hi: last count allowed; confirm: counts above a pass that must pass.

    Returns:
        A count not in ``known``, or ``None``: then :func:`plan_count` gives the answer.
    """
    return _walk(known, lo, hi, confirm)[0]


def plan_count(known: Mapping[int, bool], lo: int, hi: int, confirm: int) -> int | None:
    """The planned count of a finished search (``None``: no count up to ``hi`` meets it)."""
    need, plan = _walk(known, lo, hi, confirm)
    if need is not None:
        raise ValueError("the search is not finished")
    return plan


def _walk(
    known: Mapping[int, bool], lo: int, hi: int, confirm: int
) -> tuple[int | None, int | None]:
    """``(count needed, None)`` while searching; ``(None, plan or None)`` when done."""
    count, last_fail = lo, lo - 1
    while True:  # gallop
        if count not in known:
            return count, None
        if known[count]:
            break
        if count >= hi:
            return None, None
        last_fail, count = count, min(2 * count, hi)
    r = last_fail + 1
    while r <= hi:  # scan upward
        if r not in known:
            return r, None
        if not known[r]:
            r += 1
            continue
        for j in range(r + 1, min(r + confirm, hi) + 1):
            if j not in known:
                return j, None
            if not known[j]:
                r = j + 1
                break
        else:
            return None, r
    return None, None


def peak_window_start(workload: Workload, window_s: float, grid_s: float = WINDOW_GRID_S) -> float:
    """Start (a multiple of ``grid_s``) of the ``window_s`` window with the most tokens arriving
    (prompt + output, all classes); the earliest such start on ties."""
    arrivals = np.array([r.arrival_s for r in workload.requests])
    tokens = np.array([r.prompt_tokens + r.output_tokens for r in workload.requests], dtype=float)
    cum = np.concatenate([[0.0], np.cumsum(tokens)])
    last = float(arrivals.max())
    starts = np.arange(0.0, max(last - window_s, 0.0) + grid_s / 2, grid_s)
    lo = np.searchsorted(arrivals, starts, side="left")
    hi = np.searchsorted(arrivals, starts + window_s, side="left")
    return float(starts[int(np.argmax(cum[hi] - cum[lo]))])


@dataclass
class _Search:
    """One search: an engine x policy x cluster (the classes it serves)."""

    engine: str
    policy: str
    layout: str
    classes: tuple[str, ...]
    targets: tuple[tuple[str, float], ...]
    known: dict[int, bool] = field(default_factory=dict)
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)
    cells: dict[int, CellSpec] = field(default_factory=dict)

    @property
    def cluster(self) -> str:
        return "+".join(self.classes)

    def record(self, count: int, cell: CellSpec, outcome: dict[str, Any]) -> None:
        att = attainment(outcome)
        passed = outcome["stopped"] is None and all(
            att.get(cls, 1.0) >= target for cls, target in self.targets
        )
        self.known[count], self.outcomes[count], self.cells[count] = passed, outcome, cell


@dataclass(frozen=True)
class FleetPlan:
    """A fleet plan.

    Attributes:
        plan: ``plan.csv`` rows (:data:`PLAN_COLUMNS`).
        detail: the plan rows with utilisation, output tokens/s per GPU, the per-cluster split,
            and (with ``check_full``) attainment on the whole workload.
        search: every cell the searches used (one row per engine x policy x cluster x count).
        info: the setup and facts for the manifest and report (window, targets, notes).
    """

    plan: pd.DataFrame
    detail: pd.DataFrame
    search: pd.DataFrame
    info: dict[str, Any]


def _targets(config: FleetConfig, classes: Sequence[str]) -> dict[str, float]:
    given = dict(config.targets)
    for cls in given:
        if cls not in classes:
            raise UserError(f"--target: workload {config.trace!r} has no SLO class {cls!r}")
    return {cls: given.get(cls, DEFAULT_TARGET) for cls in classes}


def _slos(workload: Workload) -> dict[str, SLO]:
    out: dict[str, SLO] = {}
    for req in workload.requests:
        out.setdefault(req.slo.name, req.slo)
    return dict(sorted(out.items()))


def _cell(config: FleetConfig, search: _Search, replicas: int, start_s: float) -> CellSpec:
    return CellSpec(
        trace=config.trace,
        engine=search.engine,
        policy=search.policy,
        model=config.model,
        gpu=config.gpu,
        tp=config.tp,
        replicas=replicas,
        router=config.router,
        cpu_kv_ratio=config.cpu_kv_ratio,
        rate_scale=config.rate_scale,
        seed=config.seed,
        start_s=start_s,
        duration_s=config.window_s,
        warmup_s=config.warmup_s if config.window_s is not None else 0.0,
        classes=search.classes if search.layout == "separate" else (),
        slo=config.slo,
        targets=search.targets,
        stack=config.stack,
    )


def _check(config: FleetConfig) -> None:
    if config.min_replicas < 1 or config.max_replicas < config.min_replicas:
        raise UserError("need 1 <= --min-replicas <= --max-replicas")
    if config.confirm < 0:
        raise UserError(f"--confirm must be >= 0, got {config.confirm}")
    if not config.gpu_price > 0:
        raise UserError(f"--gpu-price must be > 0, got {config.gpu_price}")
    if config.window_s is not None and not config.window_s > 0:
        raise UserError(f"--window-s must be > 0, got {config.window_s}")
    if not config.engines or not config.policies:
        raise UserError("give at least one engine and one policy")


def plan_fleet(
    config: FleetConfig,
    workload: Workload,
    runner: CellRunner,
    *,
    progress: Callable[[str], ProgressFn | None] | None = None,
    log: Callable[[str], None] = lambda _: None,
    notes: Sequence[str] = (),
) -> FleetPlan:
    """Search the smallest fleet per engine x policy x layout (module docstring).

    Args:
        config: what to plan.
        workload: the whole workload ``config.trace`` names at ``config.rate_scale`` (its SLOs
            before ``config.slo``; used for the classes and the peak window).
        runner: runs and caches the cells.
        progress: given a round's label, returns the progress callback of that round.
        log: receives one line per note (fallback policies, non-monotone searches), once every
            setting has been checked.
        notes: notes of the caller's, logged and recorded with these.

    Raises:
        UserError: bad settings, an unknown engine, policy or class.
    """
    _check(config)
    slos = _slos(workload)
    for slo in config.slo:
        if slo.name not in slos:
            raise UserError(f"--slo: workload {config.trace!r} has no SLO class {slo.name!r}")
    slos.update({s.name: s for s in config.slo})
    classes = tuple(slos)
    targets = _targets(config, classes)
    notes = list(notes)
    if config.window_s is None:
        start_s, how = 0.0, "the whole workload"
    elif config.window_start_s is None:
        start_s = peak_window_start(workload, config.window_s)
        how = f"the busiest {config.window_s:g} s by tokens arriving"
    else:
        start_s, how = config.window_start_s, "given"
    searches: list[_Search] = []
    for engine in config.engines:
        for name in config.policies:
            policy, note = resolve_policy(name, engine)
            if note and note not in notes:
                notes.append(note)
            if any(s.engine == engine and s.policy == policy for s in searches):
                continue
            all_targets = tuple(targets.items())
            searches.append(_Search(engine, policy, "shared", classes, all_targets))
            if config.split:
                for cls in classes:
                    searches.append(
                        _Search(engine, policy, "separate", (cls,), ((cls, targets[cls]),))
                    )
    for search in searches:
        check_cell(_cell(config, search, config.min_replicas, start_s))
    for note in notes:
        log(f"note: {note}")
    lo, hi, confirm = config.min_replicas, config.max_replicas, config.confirm
    round_index = 0
    while True:
        needs = [(s, next_count(s.known, lo, hi, confirm)) for s in searches]
        batch = [(s, n) for s, n in needs if n is not None]
        if not batch:
            break
        round_index += 1
        cells = [_cell(config, s, n, start_s) for s, n in batch]
        label = f"round {round_index}: {len(cells)} cells"
        outcomes = runner.run(cells, progress(label) if progress else None)
        for (s, n), cell, outcome in zip(batch, cells, outcomes, strict=True):
            s.record(n, cell, outcome)
    plans = {id(s): plan_count(s.known, lo, hi, confirm) for s in searches}
    for s in searches:
        plan = plans[id(s)]
        odd = [
            n for n, ok in sorted(s.known.items())
            if plan is not None and ((n < plan and ok) or (n > plan and not ok))
        ]  # fmt: skip
        if odd:
            note = (
                f"{s.engine} x {s.policy} x {s.layout} {s.cluster}: attainment not monotone "
                f"around the plan of {plan} replicas (counts {odd})"
            )
            notes.append(note)
            log(f"note: {note}")
    window_s = next(iter(searches[0].outcomes.values()))["window_s"]
    info: dict[str, Any] = {
        "window": {"start_s": start_s, "duration_s": window_s, "how": how},
        "warmup_s": config.warmup_s if config.window_s is not None else 0.0,
        "classes": {name: _slo_dict(slo) for name, slo in slos.items()},
        "targets": targets,
        "notes": notes,
        "rounds": round_index,
    }
    detail = _detail(config, searches, plans, hi)
    if config.check_full:
        detail = _check_full(config, searches, plans, detail, runner, progress)
    plan = detail[list(PLAN_COLUMNS)].copy()
    return FleetPlan(plan, detail, _search_table(config, searches, classes), info)


def _slo_dict(slo: SLO) -> dict[str, Any]:
    return {
        k: getattr(slo, k)
        for k in ("ttft_ms", "tpot_ms", "deadline_s")
        if getattr(slo, k) is not None
    }


def _cost(config: FleetConfig, gpus: int, window_s: float, output_tokens: float) -> float:
    if not output_tokens or math.isnan(output_tokens):
        return math.nan
    return gpus * config.gpu_price * window_s / 3600.0 / (output_tokens / 1e6)


def _detail(
    config: FleetConfig,
    searches: Sequence[_Search],
    plans: Mapping[int, int | None],
    hi: int,
) -> pd.DataFrame:
    rows = []
    keys: list[tuple[str, str, str]] = []
    for s in searches:
        if (s.engine, s.policy, s.layout) not in keys:
            keys.append((s.engine, s.policy, s.layout))
    for engine, policy, layout in keys:
        group = [s for s in searches if (s.engine, s.policy, s.layout) == (engine, policy, layout)]
        replicas = 0
        meets = True
        att: dict[str, float] = {}
        tokens = busy = flops = 0.0
        split = []
        window_s = math.nan
        for s in group:
            plan = plans[id(s)]
            count = plan if plan is not None else hi
            meets &= plan is not None
            outcome = s.outcomes[count]
            window_s = outcome["window_s"]
            replicas += count
            split.append(f"{count} {s.cluster}")
            cls_att = attainment(outcome)
            for cls in s.classes:
                att[cls] = cls_att.get(cls, math.nan)
            tokens += outcome.get("output_tokens", math.nan)
            busy += outcome.get("busy_fraction", math.nan) * count
            flops += outcome.get("mfu", math.nan) * count
        gpus = replicas * config.tp
        rows.append(
            {
                "workload": config.trace,
                "engine": engine,
                "policy": policy,
                "layout": layout,
                "replicas": replicas,
                "tp": config.tp,
                "gpus": gpus,
                "meets_slo": meets,
                "chat_attainment": att.get("chat", math.nan),
                "batch_attainment": att.get("batch", math.nan),
                "cost_per_mtok": _cost(config, gpus, window_s, tokens),
                "split": " + ".join(split) if layout == "separate" else "",
                "busy_fraction": busy / replicas,
                "mfu": flops / replicas,
                "output_tok_s_per_gpu": tokens / window_s / gpus if window_s > 0 else math.nan,
                **{f"{cls}_attainment": v for cls, v in att.items()},
            }
        )
    return pd.DataFrame(rows)


def _check_full(
    config: FleetConfig,
    searches: Sequence[_Search],
    plans: Mapping[int, int | None],
    detail: pd.DataFrame,
    runner: CellRunner,
    progress: Callable[[str], ProgressFn | None] | None,
) -> pd.DataFrame:
    full = replace(config, window_s=None, window_start_s=None)
    todo = [(s, plans[id(s)]) for s in searches if plans[id(s)] is not None]
    cells = [replace(_cell(full, s, n, 0.0), targets=()) for s, n in todo if n is not None]
    outcomes = runner.run(cells, progress("whole workload") if progress else None)
    att: dict[tuple[str, str, str, str], float] = {}
    for (s, _), outcome in zip(todo, outcomes, strict=True):
        for cls, value in attainment(outcome).items():
            att[(s.engine, s.policy, s.layout, cls)] = value
    out = detail.copy()
    for cls in ("chat", "batch"):
        out[f"full_{cls}_attainment"] = [
            att.get((r.engine, r.policy, r.layout, cls), math.nan) for r in out.itertuples()
        ]
    return out


def _search_table(
    config: FleetConfig, searches: Sequence[_Search], classes: Sequence[str]
) -> pd.DataFrame:
    rows = []
    for s in searches:
        for count in sorted(s.known):
            outcome = s.outcomes[count]
            att = attainment(outcome)
            stop = outcome["stopped"]
            window_s = outcome["window_s"]
            tokens = outcome.get("output_tokens", math.nan)
            rows.append(
                {
                    "engine": s.engine,
                    "policy": s.policy,
                    "layout": s.layout,
                    "cluster": s.cluster,
                    "replicas": count,
                    "tp": config.tp,
                    "gpus": count * config.tp,
                    "passed": s.known[count],
                    "stopped_early": (
                        f"{stop['slo_class']} {stop['misses']} > {stop['allowed']} misses "
                        f"at {stop['time_s']:.1f} s"
                        if stop
                        else ""
                    ),
                    **{f"{cls}_attainment": att.get(cls, math.nan) for cls in classes},
                    "busy_fraction": outcome.get("busy_fraction", math.nan),
                    "mfu": outcome.get("mfu", math.nan),
                    "cost_per_mtok": _cost(config, count * config.tp, window_s, tokens),
                    "wall_s": outcome.get("wall_s", math.nan),
                }
            )
    return pd.DataFrame(rows)


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def render_plan(result: FleetPlan, config: FleetConfig, workload: Workload) -> str:
    """``plan.md``: the setup, the plan table, the search and its notes."""
    info = result.info
    win = info["window"]
    slos = "; ".join(
        f"{name}: " + ", ".join(f"{k} {v:g}" for k, v in targets.items())
        for name, targets in info["classes"].items()
    )
    lines = [
        "# Fleet plan",
        "",
        f"- Workload: `{config.trace}` at rate scale {config.rate_scale:g}, "
        f"{len(workload.requests)} requests; SLOs: {slos}.",
        "- Attainment targets: "
        + ", ".join(f"{c} >= {t:g}" for c, t in info["targets"].items())
        + ".",
        f"- Window: {win['duration_s']:g} s from t = {win['start_s']:g} s ({win['how']}), "
        f"after {info['warmup_s']:g} s of warm-up traffic that is simulated but not measured.",
        f"- Replica: {config.model} on {config.gpu}, TP {config.tp}; router `{config.router}`; "
        f"stack `{config.stack}`; GPU price ${config.gpu_price:.2f}/GPU-hour (--gpu-price).",
        f"- Search: replica counts {config.min_replicas}..{config.max_replicas}, gallop then "
        f"upward scan, a plan's next {config.confirm} count(s) must pass too "
        "(src/superinfer/harness/grid/fleet.py).",
        "",
        "| engine | policy | layout | replicas | GPUs | meets SLO | chat att. | batch att. "
        "| busy | MFU | output tok/s/GPU | $/1M output tok |",
        "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result.detail.itertuples():
        reps = f"{r.replicas} ({r.split})" if r.layout == "separate" else str(r.replicas)
        lines.append(
            f"| {r.engine} | {r.policy} | {r.layout} | {reps} | {r.gpus} | {_fmt(r.meets_slo)} "
            f"| {_fmt(r.chat_attainment)} | {_fmt(r.batch_attainment)} "
            f"| {_fmt(r.busy_fraction, 3)} | {_fmt(r.mfu, 3)} | {_fmt(r.output_tok_s_per_gpu, 1)} "
            f"| {_fmt(r.cost_per_mtok, 2)} |"
        )
    if "full_chat_attainment" in result.detail:
        lines += [
            "",
            "On the whole workload (every plan re-simulated over all requests, no warm-up):",
            "",
            "| engine | policy | layout | GPUs | chat att. | batch att. |",
            "|---|---|---|---:|---:|---:|",
        ]
        for r in result.detail.itertuples():
            lines.append(
                f"| {r.engine} | {r.policy} | {r.layout} | {r.gpus} "
                f"| {_fmt(r.full_chat_attainment)} | {_fmt(r.full_batch_attainment)} |"
            )
    lines += ["", "## Search", ""]
    for key, part in result.search.groupby(["engine", "policy", "layout", "cluster"], sort=False):
        trail = ", ".join(
            f"{row.replicas}{'+' if row.passed else '-'}" for row in part.itertuples()
        )
        lines.append(f"- {' x '.join(key)}: {trail}")
    lines.append("")
    lines.append("(`n+`: n replicas met every target; `n-`: missed one.) Every cell: search.csv.")
    if info["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in info["notes"]]
    return "\n".join(lines) + "\n"
