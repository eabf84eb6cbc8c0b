"""``superinfer conform``: the scenarios (``conform.scenarios``) on one engine under its policies,
and the matrix they fill (``matrix.csv``, ``matrix.md``).

Each engine id resolves to a :class:`Target`: how to run a workload on it (the family runner of
``engines.registry``; local servers from ``engines.peers`` / the SGLang adapter for ``serve``,
``llamacpp`` and ``sglang``, each started once per policy and replayed through the ``http``
engine), the :class:`~superinfer.harness.conform.workloads.Scale` the scenarios are sized to, and
what it exposes. Definitions: docs/conformance.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from superinfer.harness.conform.observe import DecisionLog
from superinfer.harness.conform.scenarios import NOT_OBSERVABLE, SCENARIOS, Outcome, RunResult
from superinfer.harness.conform.workloads import SHORT_PROMPT, Scale, make_workload, request
from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.engines.registry import engine_family
from superinfer.harness.errors import UserError
from superinfer.harness.policies import POLICY_FIELDS, registered_policies, resolve_policy
from superinfer.harness.workload.workload import CHAT_SLO, Workload

__all__ = ["MATRIX_COLUMNS", "PEERS", "conform_rows", "default_policies", "write_matrix"]

#: Columns of ``matrix.csv``.
MATRIX_COLUMNS = ("engine", "policy", "scenario", "passed", "value", "unit", "threshold", "detail")
#: Engine ids ``conform`` starts itself as local servers (then drives over HTTP).
PEERS = ("serve", "llamacpp")
#: The real CPU engines' scenario scale (``superinfer serve`` is started with these limits).
CPU_SCALE = Scale(cap=4, budget=64, kv_tokens=1024, max_prompt=1536)
#: Engine options of the hf engine (and ``serve``) that give :data:`CPU_SCALE`.
CPU_OPTIONS = {
    "max_num_seqs": "4",
    "max_batch_tokens": "64",
    "page_size_tokens": "32",
    "num_blocks": "32",
}


@dataclass
class Target:
    """One engine under one policy, as the scenarios drive it.

    Attributes:
        engine: its column label (``sim:vllm``, ``serve``, ``sglang``, ``http``).
        policy: the policy name (a label for ``http``).
        scale: what the scenarios are sized to.
        run: ``run(workload, kv_tokens) -> RunResult``.
        declared: the request fields the policy is declared to read (``POLICY_FIELDS``),
            ``None`` for a policy not ours.
        observes: ``decisions`` and/or ``cache`` (what the engine exposes beyond per-request
            results).
    """

    engine: str
    policy: str
    scale: Scale
    run: Callable[[Workload, int | None], RunResult]
    declared: frozenset[str] | None
    observes: frozenset[str]


def default_policies(engine: str) -> list[str]:
    """What ``--policy`` defaults to on ``engine``: every registered policy on a simulated engine
    (and ``native`` on a simulated GPU engine; ``oracle`` left out on ``sim:hf-cpu``);
    ``native``, ``priority``, ``superinfer`` on ``sglang``; ``superinfer`` on
    ``serve`` and ``hf`` (``oracle`` needs true lengths they do not feed it); ``server`` (a label)
    on ``http`` and ``llamacpp``."""
    from superinfer.sim.profiles import PROFILES

    if engine in PROFILES:
        return ["native", *registered_policies()]
    kind = _kind(engine)
    if kind == "sim-cpu":  # its runner does not feed oracle the true lengths
        return [p for p in registered_policies() if p != "oracle"]
    if kind == "real-server":
        return ["native", "priority", "superinfer"]
    if kind in ("real-cpu", "serve"):
        return ["superinfer"]
    return ["server"]


def _kind(engine: str) -> str:
    """``serve`` or ``llamacpp`` for the servers conform starts itself, else the engine
    family's report kind (``engines.registry.EngineFamily.kind``)."""
    if engine in PEERS:
        return engine
    try:
        return engine_family(engine).kind
    except UserError:
        known = "sim:<profile>, hf, serve, sglang, llamacpp, http"
        raise UserError(f"unknown engine {engine!r} for conform; engines: {known}") from None


def takes_kv_policy(engine: str) -> bool:
    """Whether ``engine``'s conformance runs can drive a placement plugin (``--kv-policy``): the
    simulated GPU engines, whose prefix cache asks ``superinfer_kv_placement``.

    Raises:
        UserError: an unknown engine.
    """
    return _kind(engine) == "sim-gpu"


def _declared(engine: str, policy: str) -> frozenset[str] | None:
    kind = _kind(engine)
    if kind in ("live", "llamacpp"):
        return None
    if kind != "serve" and policy in engine_family(engine).engine_policies:
        return None  # the engine's own scheduling (sglang native, lpm, priority)
    name = policy
    if policy == "native":
        try:
            name = resolve_policy(policy, engine)[0]
        except UserError:
            return None
    return POLICY_FIELDS.get(name)


def _sim_target(engine: str, policy: str, base: BenchConfig) -> Target:
    from superinfer.sim.hardware import get_gpu
    from superinfer.sim.profiles import get_profile

    family = engine_family(engine)
    runner = family.load_runner()
    resolved = resolve_policy(policy, engine)[0] if policy == "native" else policy
    if family.kind == "sim-cpu":
        scale = dataclasses.replace(CPU_SCALE, sets_kv=True)
        block = int(CPU_OPTIONS["page_size_tokens"])

        def options(kv: int) -> dict[str, str]:
            return {**CPU_OPTIONS, "num_blocks": str(math.ceil(kv / block))}
    else:
        try:
            profile, gpu = get_profile(engine), get_gpu(base.gpu)
        except KeyError as exc:  # an unknown sim:* id or GPU: its one-line message
            raise UserError(exc.args[0]) from None
        budget = profile.limits(gpu)[0]
        scale = Scale(cap=4, budget=budget, kv_tokens=32 * budget, sets_kv=True)
        block = profile.block_size_tokens

        def options(kv: int) -> dict[str, str]:
            return {"max_num_seqs": str(scale.cap), "num_gpu_blocks": str(math.ceil(kv / block))}

    def run(workload: Workload, kv_tokens: int | None) -> RunResult:
        log = DecisionLog()
        config = dataclasses.replace(
            base,
            engines=(engine,),
            replicas=1,
            engine_options=options(kv_tokens or scale.kv_tokens),
        )
        cell = runner(config, engine, resolved, workload, plugins=[log])
        return RunResult(cell.requests, log, preemptions_observable=True, exact=True)

    return Target(
        engine, policy, scale, run, _declared(engine, policy), frozenset({"decisions", "cache"})
    )


def _http_run(
    base: BenchConfig, url: str, backend: str, label: str, options: dict[str, str]
) -> Callable[[Workload, int | None], RunResult]:
    from superinfer.harness.engines.http import run_http_cell

    def run(workload: Workload, _kv: int | None) -> RunResult:
        config = dataclasses.replace(
            base, engines=("http",), url=url, backend=backend, engine_options=options
        )
        cell = run_http_cell(config, "http", label, workload)
        return RunResult(cell.requests)

    return run


@contextlib.contextmanager
def open_target(
    engine: str,
    policy: str,
    base: BenchConfig,
    *,
    scale: Scale | None = None,
    log_dir: Path | None = None,
) -> Iterator[Target]:
    """The :class:`Target` of ``engine`` under ``policy``, its server up while in the block.

    Args:
        engine: ``sim:*``, ``hf``, ``serve``, ``sglang``, ``llamacpp`` or ``http`` (then
            ``base.url`` and ``base.backend`` name the server).
        policy: a policy name (a label for ``http`` and ``llamacpp``).
        base: the run's settings (model, GPU, URL, backend, engine options for ``http``).
        scale: the scale of an ``http`` server (default :data:`CPU_SCALE`).
        log_dir: where server logs go (default: a temporary folder).

    Raises:
        UserError: an unknown engine, a server that does not start, ``http`` without ``--url``.
    """
    logs = log_dir or Path(tempfile.mkdtemp(prefix="conform-logs-"))
    kind = _kind(engine)
    if kind in ("sim-gpu", "sim-cpu"):
        yield _sim_target(engine, policy, base)
        return
    declared = _declared(engine, policy)
    if kind == "real-cpu":
        runner = engine_family("hf").load_runner()

        def run(workload: Workload, _kv: int | None) -> RunResult:
            config = dataclasses.replace(base, engines=("hf",), engine_options=CPU_OPTIONS)
            cell = runner(config, "hf", policy, workload)
            return RunResult(cell.requests, preemptions_observable=True)

        yield Target("hf", policy, CPU_SCALE, run, declared, frozenset())
        return
    with _server(kind, policy, base, logs) as (url, backend, opts):
        label = "http" if kind == "live" else engine
        replay = _http_run(base, url, backend, policy, opts)
        yield Target(label, policy, scale or CPU_SCALE, replay, declared, frozenset())


@contextlib.contextmanager
def _server(
    kind: str, policy: str, base: BenchConfig, logs: Path
) -> Iterator[tuple[str, str, dict[str, str]]]:
    """``(url, backend, http engine options)`` of the server an HTTP-driven ``kind`` replays
    against: started here for ``serve``, ``llamacpp`` and ``real-server`` (SGLang, per
    ``policy``) and stopped on exit, or ``base.url`` for ``live``."""
    ours = {"send_priority": "true"}
    if kind == "live":
        if not base.url:
            raise UserError("--engine http needs --url (and --backend)")
        yield base.url, base.backend, dict(base.engine_options)
    elif kind == "serve":
        from superinfer.harness.engines.peers import superinfer_server

        extra = [a for k, v in CPU_OPTIONS.items() for a in ("--engine-option", f"{k}={v}")]
        with superinfer_server(policy, log=logs / f"serve-{policy}.log", extra=extra) as url:
            yield url, "openai", ours
    elif kind == "llamacpp":
        from superinfer.harness.engines.peers import llamacpp_server

        with llamacpp_server(log=logs / "llamacpp.log") as url:
            yield url, "openai", ours
    elif kind == "real-server":
        with _sglang(policy, logs) as url:
            yield url, "sglang", {}
    else:
        raise UserError(f"engine kind {kind!r} cannot run the conformance scenarios")


@contextlib.contextmanager
def _sglang(policy: str, logs: Path) -> Iterator[str]:
    """SGLang's CPU server for ``policy`` (its own scheduling for ``native``, ``lpm``,
    ``priority``, the adapter adding their flags; else our plugin), sized as :data:`CPU_SCALE`,
    once for every scenario."""
    from superinfer.adapters.manager import UnknownPolicyError
    from superinfer.adapters.sglang.config import ConfigError
    from superinfer.adapters.sglang.launch import ServeError
    from superinfer.adapters.sglang.server import ServerStartError, SGLangServer

    args = [
        "--max-running-requests",
        str(CPU_SCALE.cap),
        "--chunked-prefill-size",
        str(CPU_SCALE.budget),
        "--max-total-tokens",
        str(4 * CPU_SCALE.kv_tokens),
    ]
    try:
        server = SGLangServer(policy, args, log_path=logs / f"sglang-{policy}.log")
        server.start()
    except (ConfigError, UnknownPolicyError, ServeError, ServerStartError) as exc:
        raise UserError(str(exc)) from None
    try:
        yield server.url
    finally:
        server.stop()


def _probe(target: Target) -> Scale:
    """``target.scale`` with ``unit_s`` and ``ttft0_s`` from one lone short request."""
    wl = make_workload("probe", [request("probe", 0.0, SHORT_PROMPT, 8, CHAT_SLO)])
    row = target.run(wl, None).requests.iloc[0]
    if row["status"] != "finished":
        raise UserError(f"{target.engine}: the probe request did not finish ({row['reason']})")
    tpot = float(row["tpot_ms"]) / 1e3
    ttft = float(row["ttft_ms"]) / 1e3
    return dataclasses.replace(target.scale, unit_s=max(tpot, 1e-4), ttft0_s=max(ttft, 1e-4))


def conform_rows(
    target: Target,
    scenarios: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, object]]:
    """Run the scenarios (``scenarios``: names, default all) on ``target``: one
    ``matrix.csv`` row each (:data:`MATRIX_COLUMNS`)."""
    scale = _probe(target)
    cache: dict[object, dict[str, RunResult]] = {}
    rows: list[dict[str, object]] = []
    for sc in SCENARIOS:
        if scenarios is not None and sc.name not in scenarios:
            continue
        missing = sorted(sc.needs - target.observes)
        if missing:
            why = {
                "decisions": "needs the engine's scheduling decisions (preemptions, "
                "re-admissions), which only an in-process engine exposes",
                "cache": "needs per-request prefix-cache hits, which this engine does not report",
            }
            out = Outcome(NOT_OBSERVABLE, None, "", "", "; ".join(why[m] for m in missing))
        else:
            if progress:
                progress(f"{target.engine} x {target.policy}: {sc.name}")
            if sc.build not in cache:
                cache[sc.build] = {
                    v.name: target.run(v.workload, v.kv_tokens) for v in sc.build(scale)
                }
            out = sc.check(cache[sc.build], scale, target.declared)
        rows.append(
            {
                "engine": target.engine,
                "policy": target.policy,
                "scenario": sc.name,
                "passed": out.passed,
                "value": out.value,
                "unit": out.unit,
                "threshold": out.threshold,
                "detail": out.detail,
            }
        )
    return rows


def read_matrix(out: Path) -> pd.DataFrame | None:
    """The matrix already in ``out/matrix.csv`` (``None`` if there is none), read before the
    scenarios run so a damaged one fails first, not after them.

    Raises:
        UserError: the file is not a CSV with the :data:`MATRIX_COLUMNS`; one line naming it.
    """
    path = out / "matrix.csv"
    if not path.is_file():
        return None
    try:
        old = pd.read_csv(path, keep_default_na=False)
    except (ValueError, UnicodeDecodeError) as exc:  # pandas' ParserError is a ValueError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: not a readable matrix ({first}); move it away") from None
    missing = [c for c in MATRIX_COLUMNS if c not in old.columns]
    if missing:
        raise UserError(f"{path}: no column {missing[0]!r}, not a conformance matrix; move it away")
    return old


def write_matrix(rows: Sequence[dict[str, object]], out: Path) -> pd.DataFrame:
    """Merge ``rows`` into ``out/matrix.csv`` (rows of the same engine x policy replaced) and
    write ``out/matrix.md`` (scenarios as rows, engine / policy as columns); returns the
    matrix.

    Raises:
        UserError: an existing ``matrix.csv`` that is not one (:func:`read_matrix`).
    """
    old = read_matrix(out)
    out.mkdir(parents=True, exist_ok=True)
    new = pd.DataFrame(list(rows), columns=list(MATRIX_COLUMNS))
    path = out / "matrix.csv"
    if old is not None:
        keys = set(zip(new["engine"], new["policy"], strict=True))
        keep = [(e, p) not in keys for e, p in zip(old["engine"], old["policy"], strict=True)]
        new = pd.concat([old[keep], new], ignore_index=True)
    order = {s.name: i for i, s in enumerate(SCENARIOS)}
    new = new.sort_values(
        ["engine", "policy", "scenario"],
        key=lambda c: c.map(order) if c.name == "scenario" else c,
        kind="stable",
    )
    new.to_csv(path, index=False)
    (out / "matrix.md").write_text(render_matrix(new), encoding="utf-8")
    return new


def _cell(row: pd.Series) -> str:
    marks = {
        "pass": "pass",
        "fail": "**fail**",
        "not observable": "n/o",
        "not exercised": "n/e",
        "info": "info",
    }
    mark = marks.get(str(row["passed"]), str(row["passed"]))
    value = row["value"]
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return mark
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{mark} {value}"


def render_matrix(matrix: pd.DataFrame) -> str:
    """``matrix.md``: one row per scenario, one column per engine / policy, then each cell's
    threshold and reason."""
    cols = list(dict.fromkeys(zip(matrix["engine"], matrix["policy"], strict=True)))
    head = ["scenario", *(f"{e} / {p}" for e, p in cols)]
    lines = [
        "# Conformance matrix",
        "",
        "Does an engine keep its priority and SLO promises? Scenarios and thresholds: "
        "docs/conformance.md; every cell's value, unit, threshold and reason: "
        "`matrix.csv`. Marks: pass, fail, n/o (not observable on that engine), n/e (the "
        "workload did not provoke what the scenario tests), info (nothing to pass).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for sc in SCENARIOS:
        cells = []
        for e, p in cols:
            hit = matrix[
                (matrix["engine"] == e) & (matrix["policy"] == p) & (matrix["scenario"] == sc.name)
            ]
            cells.append(_cell(hit.iloc[0]) if len(hit) else "")
        lines.append(f"| `{sc.name}` | " + " | ".join(cells) + " |")
    lines += ["", "## Thresholds", ""]
    for sc in SCENARIOS:
        hit = matrix[(matrix["scenario"] == sc.name) & (matrix["threshold"] != "")]
        thr = f"{hit.iloc[0]['unit']} {hit.iloc[0]['threshold']}" if len(hit) else "-"
        lines.append(f"- `{sc.name}` ({sc.title}): {thr}")
    return "\n".join(lines) + "\n"
