"""``superinfer bench --suite engines``: one real model on three real engines (issue 24).

SmolLM2-135M-Instruct on the transformers engine (``hf``), on the real SGLang CPU server
(``sglang``, the bf16 weights of ``make install-smollm2-sglang``) and on llama.cpp's server
(``llamacpp``, the Q4_1 GGUF, replayed through the ``http`` engine), each under its own policy
and, where our policy plugs in (``hf``, ``sglang``), under ``priority`` and ``superinfer``; beside
them the simulated rows ``sim:hf-cpu`` and ``sim:sglang-cpu`` (the CPU simulator with hf's
mechanics, and with SGLang's at the server's limits), each with a step time fitted on its real
engine's step logs in this run (on its lone requests when the logs hold too few steps).

One workload design for every engine (``suites_engines_workload.mix_workload``): Poisson chat (short
prompts) and batch (long prompts, up to SGLang's 1,024-token context with their output) streams;
repeat ``r`` draws its arrivals with seed ``seed + r``, the same for every policy and engine (the
simulated rows replay each repeat's arrivals too), so a repeat's policies are compared on one sample
and the spread covers the arrivals as well as the machine. Each real engine first serves lone
requests (``lone_workload``: one at a time, far apart): the report states its unloaded TTFT and
TPOT, and its chat TTFT target is a multiple of that TTFT (``suite.chat_ttft_x``; or one absolute
``suite.chat_ttft_ms`` on every engine); then a knee pilot; then 3 loads around its knee (total
req/s) x repeats, the repeats interleaved (repeat 0 of every load and policy, then repeat 1, ...).
Servers are started once per engine and policy and reused across loads and repeats (SGLang's radix
cache is flushed before every run, so a repeat does not reuse the last one's prompts). Every run's
requests are kept (``requests.parquet``) beside the real runs' step logs (``steps.parquet``).

Suite options are ``--engine-option suite.KEY=VALUE`` (``suites_engines_options.SuiteOptions``);
the files are written by :mod:`superinfer.harness.suites_engines_report`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.bench import BenchConfig, run_bench
from superinfer.harness.engines.isolated import IsolatedLatency, engine_isolated_latency
from superinfer.harness.errors import UserError
from superinfer.harness.policies import merge_policy_opts, policy_manager
from superinfer.harness.suites_engines_knee import (
    SGLANG_CHUNK_TOKENS,
    log_fit,
    lone_step_fit,
    pilot_knee,
    request_path_ms,
)
from superinfer.harness.suites_engines_options import (
    CHAT_PROMPT,
    DEFAULT_LOADS,
    ENGINE_POLICIES,
    HF,
    HF_SUPERINFER_OPTS,
    LLAMACPP,
    NATIVE,
    REAL_ENGINES,
    SGLANG,
    SGLANG_ARGS,
    SGLANG_SUPERINFER_OPTS,
    SIM_FOR,
    SIM_HF,
    SIM_OF,
    SIM_SGLANG,
    SuiteOptions,
    engine_loads,
    for_engine,
    relative_chat_ttft,
    scaled_chat_ttft,
    sim_row_limits,
    suite_options,
)
from superinfer.harness.suites_engines_workload import (
    batched_concurrency,
    batched_sizes,
    batched_workload,
    lone_workload,
    mix_workload,
)
from superinfer.harness.workload.workload import Workload
from superinfer.sim.hf_cpu import SIM_HF_CPU

__all__ = [
    "EnginesResult",
    "batched_concurrency",
    "batched_sizes",
    "batched_workload",
    "collect_step_logs",
    "lone_workload",
    "mix_workload",
    "sim_cells",
    "run_engines",
    "run_engines_suite",
]


# -- running ------------------------------------------------------------------------------------

#: Real engine -> (prefill tokens per pass, label) of its ``lone_step_fit``: SGLang's
#: ``--chunked-prefill-size``, the hf engine's ``max_batch_tokens``.
FIT_CHUNK_AND_LABEL = {SGLANG: (SGLANG_CHUNK_TOKENS, "SGLang"), HF: (SIM_HF_CPU.token_budget, "hf")}


@dataclass
class EnginesResult:
    """Everything the suite measured.

    Attributes:
        summary: every run's summary rows with ``engine, policy, repeat, load`` first.
        lone: the lone requests of every real engine (``requests`` rows, ``engine`` column;
            ``concurrency`` 1), then its batched pass's (``concurrency`` = the group size).
        info: manifest facts per run (``<engine>/<policy>/<load>/<repeat>``) and per engine.
        requests: every run's requests (real and simulated; ``BenchResult.requests`` columns
            after ``engine, policy, repeat, load``): one row per request with its outcome
            (``status``, ``reason``), times (``arrival_s``, ``first_token_s``, ``finish_s``, s
            from the run's start) and SLO verdict, so a run can be traced request by request
            beside its step log.
    """

    summary: pd.DataFrame
    lone: pd.DataFrame
    info: dict[str, Any]
    requests: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)


def _base(config: BenchConfig, engine: str, policy: str, **kw: Any) -> BenchConfig:
    return replace(
        config,
        engines=(engine,),
        policies=(policy,),
        policy_opts=(),
        workload=None,
        model="SmolLM2-135M-Instruct",
        gpu="cpu",
        tp=1,
        replicas=1,
        **kw,
    )


def _flush(url: str) -> None:
    with contextlib.suppress(OSError):
        urllib.request.urlopen(
            urllib.request.Request(f"{url}/flush_cache", b"", method="POST"), timeout=30
        ).read()


def superinfer_opts(engine: str, given: Mapping[str, str] | None) -> dict[str, str]:
    """The options ``superinfer`` runs with on ``engine`` (a real engine or its simulated twin):
    the suite's own for it (:data:`HF_SUPERINFER_OPTS`, :data:`SGLANG_SUPERINFER_OPTS`), then
    ``given`` (``--policy-opt``) over them."""
    base = SGLANG_SUPERINFER_OPTS if engine in (SGLANG, SIM_SGLANG) else HF_SUPERINFER_OPTS
    return {**base, **(given or {})}


def _plugin_opts(policy: str, superinfer: Mapping[str, str] | None) -> dict[str, str]:
    """The plugin options of SGLang's ``policy`` server: ``superinfer``'s
    (:func:`superinfer_opts`), none for SGLang's own policies."""
    return superinfer_opts(SGLANG, superinfer) if policy == "superinfer" else {}


@contextlib.contextmanager
def _servers(
    engine: str, opts: SuiteOptions, log_dir: Path, superinfer: Mapping[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """Per policy of ``engine``: ``{"url", "server"}`` (``hf``: nothing to start); SGLang's
    ``superinfer`` server runs :data:`SGLANG_SUPERINFER_OPTS` with ``superinfer`` over them."""
    if engine == HF:
        yield {p: {} for p in ENGINE_POLICIES["hf"]}
        return
    with contextlib.ExitStack() as stack:
        if engine == LLAMACPP:
            from superinfer.harness.engines.peers import llamacpp_server

            url = stack.enter_context(llamacpp_server(log=log_dir / "llamacpp.log"))
            yield {"native": {"url": url}}
            return
        from superinfer.adapters.sglang.extend_rows import ENV_EXTEND_ROWS
        from superinfer.adapters.sglang.real_model import default_real_model_dir
        from superinfer.adapters.sglang.server import ServerStartError, SGLangServer

        model = Path(opts.sglang_model) if opts.sglang_model else default_real_model_dir()
        if not (model / "model.safetensors").is_file():
            raise UserError(
                f"{model}: no SmolLM2 weights for SGLang; run `make install-smollm2-sglang`"
            )
        out: dict[str, Any] = {}
        for policy in ENGINE_POLICIES["sglang"]:
            plugin_opts = _plugin_opts(policy, superinfer)
            server = SGLangServer(
                policy,
                ["--model-path", str(model), *SGLANG_ARGS.split(), *opts.sglang_args.split()],
                policy_opts=[f"{k}={v}" for k, v in plugin_opts.items()],
                log_path=log_dir / f"sglang-{policy}.log",
                step_log_path=log_dir / f"sglang-{policy}.steps.csv",
                env={ENV_EXTEND_ROWS: "1"} if opts.sglang_extend_rows else None,
            )
            stack.callback(server.stop)  # before start: an interrupted start is stopped too
            try:
                server.start()
            except ServerStartError as exc:
                raise UserError(str(exc)) from None
            out[policy] = {"url": server.url, "server": server}
        yield out


def _recipe_line(handles: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The CPU recipe's log line of the first SGLang server in ``handles`` (policy -> handle):
    the flags it added, ``--dtype`` the host's (``adapters.sglang.launch.cpu_dtype``); ``None``
    for servers without one (hf, llama.cpp, SGLang on a GPU)."""
    for handle in handles.values():
        line = getattr(handle.get("server"), "recipe_line", None)
        if line:
            return str(line)
    return None


def _run_cell(
    config: BenchConfig,
    engine: str,
    policy: str,
    wl: Workload,
    handle: Mapping[str, Any],
    opts: SuiteOptions,
    steps_to: Path | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """One real run; ``(summary, requests, info)`` with ``engine``/``policy`` as the suite names
    them. ``steps_to``: where the run's step log goes, if the engine keeps one: ``hf``'s own
    (``steps.parquet``'s columns), or the lines the SGLang server's scheduler appended to its step
    log during the run (``adapters/sglang/steplog.py``); llama.cpp keeps none."""
    if engine == HF:
        sup = superinfer_opts(HF, config.policy_options.get("superinfer"))
        popts = {**config.policy_options, "superinfer": sup}
        cfg = _base(config, "hf", policy, engine_options={}, policy_options=popts)
    else:
        _flush(handle["url"]) if engine == SGLANG else None
        label = "server" if engine == LLAMACPP else policy
        backend = "sglang" if engine == SGLANG else "openai"  # http dialect
        cfg = _base(
            config,
            "http",
            label,
            url=handle["url"],
            backend=backend,
            engine_options={"timeout_s": "600"},
        )
    server = handle.get("server")
    server_log = getattr(server, "step_log_path", None) if steps_to is not None else None
    seen = _step_lines(server_log)
    result = run_bench(cfg, workload=wl)
    steps = result.steps
    if server_log is not None:
        steps = pd.read_csv(server_log).iloc[seen:] if server_log.is_file() else steps
    if steps_to is not None and not steps.empty:
        steps_to.parent.mkdir(parents=True, exist_ok=True)
        steps.assign(engine=engine, policy=policy).to_parquet(steps_to, index=False)
    summary, requests = result.summary.copy(), result.requests.copy()
    for frame in (summary, requests):
        frame["engine"], frame["policy"] = engine, policy
    outcomes = requests.groupby(["slo_class", "status", "reason"], dropna=False).size()
    info: dict[str, Any] = {
        "cells": result.info.get("cells"),
        "outcomes": {"/".join(map(str, k)): int(n) for k, n in outcomes.items()},
    }
    if server is not None and server.plugin:
        info["plugin_stats"] = server.stats()
    return summary, requests, info


def _step_lines(path: Path | None) -> int:
    """Steps already in a server's step log (data lines of the CSV; 0 if none yet)."""
    if path is None or not path.is_file():
        return 0
    with path.open("rb") as f:
        return max(0, sum(1 for _ in f) - 1)


def sim_cells(
    config: BenchConfig,
    engine: str,
    opts: SuiteOptions,
    fit_file: Path,
    progress: Callable[[str], None],
    found: Mapping[str, tuple[float, ...]],
    extra: Mapping[str, str] | None = None,
    req_frames: list[pd.DataFrame] | None = None,
    superinfer_options: Mapping[str, str] | None = None,
    speeds: Mapping[str, float] | None = None,
) -> list[pd.DataFrame]:
    """The simulated rows of ``engine`` (``sim:hf-cpu`` or ``sim:sglang-cpu``) at the loads
    ``found`` for its real engine, one frame per (repeat, load), with step time ``fit_file``;
    ``extra``: more engine options of the simulator (``benchmarks/fidelity_cpu.py --resim``);
    ``req_frames``: where each run's requests go (keyed like its summary), if given.
    ``superinfer`` runs with the options it has on the real engine (:data:`SGLANG_SUPERINFER_OPTS`
    through the SGLang plugin, :data:`HF_SUPERINFER_OPTS` on hf), then ``superinfer_options``
    over them. ``speeds``: each policy's cell runs at its real run's host speed
    (``step_time_scale``; keys are step-log run names, ``<real engine>_<policy>_<load>_<repeat>``:
    ``offline.calibrate_hf.run_speeds``).

    Raises:
        UserError: ``speeds`` lacks a run of these loads and repeats.
    """
    limits = sim_row_limits(opts, engine)
    frames = []
    cfg = replace(
        _base(config, "sim:hf-cpu", "fcfs"),
        policies=ENGINE_POLICIES[engine],
        policy_options={"superinfer": superinfer_opts(engine, superinfer_options)},
    )
    for rep in range(opts.repeats):
        # with step_spread=calibrated, repeat r draws its step-time spread with seed + r (a
        # step_spread_seed in `extra` is taken as given, for every repeat)
        eopts = {
            **limits,
            "step_time_file": str(fit_file),
            "step_spread_seed": str(config.seed + rep),
        }
        cfg = replace(cfg, engine_options={**eopts, **(extra or {})})
        for load in engine_loads(opts, engine, found):
            progress(f"{engine} at {load:g} req/s, repeat {rep}")
            wl = mix_workload(opts, load, config.seed + rep)
            cells = [cfg] if speeds is None else _at_speed(cfg, engine, speeds, load, rep)
            results = [run_bench(c, workload=wl) for c in cells]
            summary = pd.concat([r.summary for r in results], ignore_index=True)
            summary["engine"] = engine
            frames.append(_keyed(summary, rep, load))
            if req_frames is not None:
                req = pd.concat([r.requests for r in results], ignore_index=True)
                req["engine"] = engine
                req_frames.append(_keyed(_engine_first(req), rep, load))
    return frames


def _isolated(config: BenchConfig, engine: str, opts: SuiteOptions, fit: Path) -> IsolatedLatency:
    """The sim row ``engine``'s latency alone on an idle replica, on the step-time fit ``fit``."""
    eopts = {**sim_row_limits(opts, engine), "step_time_file": str(fit)}
    latency = engine_isolated_latency(
        replace(_base(config, SIM_HF, "fcfs"), engine_options=eopts), SIM_HF
    )
    assert latency is not None  # sim:hf-cpu always has one
    return latency


def _at_speed(
    cfg: BenchConfig, engine: str, speeds: Mapping[str, float], load: float, rep: int
) -> list[BenchConfig]:
    """``cfg`` split into one config per policy, each at its real run's host speed."""
    real = SIM_OF[engine]
    out = []
    for policy, ran in zip(ENGINE_POLICIES[engine], ENGINE_POLICIES[real], strict=True):
        run = f"{real}_{ran}_{load:g}_{rep}"
        if run not in speeds:
            raise UserError(f"no host speed for run {run} (its step log is missing)")
        scale = {"step_time_scale": repr(float(speeds[run]))}
        out.append(replace(cfg, policies=(policy,), engine_options={**cfg.engine_options, **scale}))
    return out


def _knee(
    config: BenchConfig,
    engine: str,
    opts: SuiteOptions,
    handle: Mapping[str, Any],
    lones: list[pd.DataFrame],
    info: dict[str, Any],
    tell: Callable[[str], None],
) -> tuple[float, ...]:
    """Pilot ``engine``'s native policy (``opts.probe_s`` of arrivals per probe) to find its knee
    (``suites_engines_knee.find_knee``) from the lone requests' serial capacity; its 3 loads."""
    native = NATIVE[engine]

    def attainment(load: float) -> float:
        tell(f"{engine}: knee pilot at {load:.3g} req/s")
        pilot = replace(opts, duration_s=opts.probe_s or opts.duration_s)
        summary, _, _ = _run_cell(
            config, engine, native, mix_workload(pilot, load, config.seed), handle, opts
        )
        return float(summary.loc[summary["slo_class"] == "chat", "slo_attainment"].iloc[0])

    lone = lones[-1] if lones and set(lones[-1]["engine"]) == {engine} else None
    knee = pilot_knee(attainment, lone, opts.batch_share, DEFAULT_LOADS[engine][1], opts.max_probes)
    info.setdefault("knees", {})[engine] = knee
    return knee["loads"]


def _engine_first(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its ``engine`` and ``policy`` columns first (as the summary's)."""
    first = ["engine", "policy"]
    return frame[first + [c for c in frame.columns if c not in first]]


def _keyed(summary: pd.DataFrame, repeat: int, load: float) -> pd.DataFrame:
    summary.insert(2, "repeat", repeat)
    summary.insert(3, "load", load)
    return summary


def _real_engine(
    config: BenchConfig,
    engine: str,
    opts: SuiteOptions,
    work_dir: Path,
    lones: list[pd.DataFrame],
    batched: dict[str, pd.DataFrame],
    found: dict[str, tuple[float, ...]],
    info: dict[str, Any],
    tell: Callable[[str], None],
    frames: list[pd.DataFrame],
    req_frames: list[pd.DataFrame],
) -> None:
    """One real engine's lone and batched passes, knee pilot and runs (repeats outermost) into
    ``frames`` (summaries) and ``req_frames`` (their requests)."""
    begin = time.monotonic()
    with _servers(engine, opts, work_dir, config.policy_options.get("superinfer")) as handles:
        info["engines"][engine] = {"startup_s": round(time.monotonic() - begin, 1)}
        if recipe := _recipe_line(handles):
            info["engines"][engine]["cpu_recipe"] = recipe
        if engine in (HF, SGLANG):  # what superinfer ran with there (resimulate replays it)
            sup = superinfer_opts(engine, config.policy_options.get("superinfer"))
            info.setdefault("superinfer_options", {})[engine] = sup
        native = NATIVE[engine]
        if opts.lone:
            tell(f"{engine}: lone requests")
            wl = lone_workload(opts, opts.lone_gap_s[engine])
            log = _lone_log(work_dir, engine) if engine == SGLANG else None
            _, req, _ = _run_cell(config, engine, native, wl, handles[native], opts, steps_to=log)
            lones.append(req.assign(concurrency=1))
        if opts.chat_ttft_x:  # this engine's own chat target, from its lone chats
            info["engines"][engine].update(relative_chat_ttft(lones[-1], opts, engine))
            opts = for_engine(opts, info["engines"], engine)
        if batched_sizes(opts) and any(SIM_OF.get(e) == engine for e in opts.engines):
            tell(f"{engine}: batched requests")
            wl = batched_workload(opts, 2 * opts.lone_gap_s[engine])
            _, req, _ = _run_cell(config, engine, native, wl, handles[native], opts)
            batched[engine] = req.assign(concurrency=batched_concurrency(req["request_id"]))
        if engine in opts.auto:
            found[engine] = _knee(config, engine, opts, handles[native], lones, info, tell)
        for rep in range(opts.repeats):
            for load in engine_loads(opts, engine, found):
                wl = mix_workload(opts, load, config.seed + rep)
                for policy in ENGINE_POLICIES[engine]:
                    tell(f"{engine}/{policy} at {load:g} req/s, repeat {rep}")
                    t0 = time.monotonic()
                    log = work_dir / "steps" / f"{engine}_{policy}_{load:g}_{rep}.parquet"
                    summary, req, run = _run_cell(
                        config, engine, policy, wl, handles[policy], opts, steps_to=log
                    )
                    run["wall_s"] = round(time.monotonic() - t0, 1)
                    info["runs"][f"{engine}/{policy}/{load:g}/{rep}"] = run
                    frames.append(_keyed(summary, rep, load))
                    req_frames.append(_keyed(_engine_first(req), rep, load))
                    pd.concat(frames).to_csv(work_dir / "summary.partial.csv", index=False)


def run_engines(
    config: BenchConfig,
    opts: SuiteOptions,
    work_dir: Path,
    *,
    progress: Callable[[str], None] | None = None,
) -> EnginesResult:
    """Run the suite: per real engine (:func:`_real_engine`), then the simulated rows.

    Args:
        config: bench settings (``seed``; the rest the suite sets).
        opts: the suite's options.
        work_dir: where server logs, the ``<engine>_step_time.json`` fits and the runs' step
            logs (``steps/<engine>_<policy>_<load>_<repeat>.parquet``, engines that keep one) go.
        progress: called with a message before every run.
    """
    tell = progress or (lambda _msg: None)
    frames: list[pd.DataFrame] = []
    req_frames: list[pd.DataFrame] = []
    lones: list[pd.DataFrame] = []
    batched: dict[str, pd.DataFrame] = {}
    info: dict[str, Any] = {"suite": "engines", "runs": {}, "engines": {}}
    info.update(config=dataclasses.asdict(config), options=dataclasses.asdict(opts))
    fit_files: dict[str, Path] = {}
    if opts.hf_step_time_file != "lone":
        fit_files[SIM_HF] = Path(opts.hf_step_time_file)
    found: dict[str, tuple[float, ...]] = {}
    work_dir.mkdir(parents=True, exist_ok=True)
    for engine in (e for e in REAL_ENGINES if e in opts.engines):
        try:
            _real_engine(
                config,
                engine,
                opts,
                work_dir,
                lones,
                batched,
                found,
                info,
                tell,
                frames,
                req_frames,
            )
        except UserError as exc:  # an engine that cannot run does not lose the others' runs
            info.setdefault("failed", {})[engine] = str(exc)
            tell(f"{engine} failed: {exc}")
            continue
        sim = SIM_FOR.get(engine)
        if sim is None or sim in fit_files or not opts.lone or sim not in opts.engines:
            continue
        fit = lone_step_fit(lones[-1], *FIT_CHUNK_AND_LABEL[engine], batched.get(engine))
        fit = log_fit(engine, fit, collect_step_logs(work_dir), info, tell)
        if (log := _lone_log(work_dir, engine)).is_file():  # SGLang's request path
            fit["request_latency_ms"] = request_path_ms(lones[-1], pd.read_parquet(log)) or 0.0
        fit_files[sim] = work_dir / f"{engine}_step_time.json"
        fit_files[sim].write_text(json.dumps(fit, indent=2) + "\n")
        info["engines"][sim] = fit
    for engine in (e for e in SIM_OF if e in opts.engines):
        if engine not in fit_files:
            real = SIM_OF[engine]
            raise UserError(f"{engine} is fitted on the lone {real} requests: run {real} too")
        own = info["engines"].get(SIM_OF[engine], {})
        if opts.chat_ttft_x and "chat_ttft_ms" not in own:  # its real engine made none: the fit's
            lone = _isolated(config, engine, opts, fit_files[engine]).prefill_ms(CHAT_PROMPT[1])
            what = f"{engine} step-time fit's lone prefill of {CHAT_PROMPT[1]} tokens"
            info["engines"].setdefault(engine, {}).update(scaled_chat_ttft(opts, lone, what))
        frames += sim_cells(
            config,
            engine,
            for_engine(opts, info["engines"], engine),
            fit_files[engine],
            tell,
            found,
            req_frames=req_frames,
            superinfer_options=config.policy_options.get("superinfer"),
        )
    summary = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    probes = [*lones, *batched.values()]
    lone = pd.concat(probes, ignore_index=True) if probes else pd.DataFrame()
    requests = pd.concat(req_frames, ignore_index=True) if req_frames else pd.DataFrame()
    return EnginesResult(summary, lone, info, requests)


def _lone_log(work_dir: Path, engine: str) -> Path:
    """Where ``engine``'s lone pass keeps its step log (SGLang only: its request path is read
    from it, ``suites_engines_knee.request_path_ms``), apart from the runs' ``steps/``."""
    return work_dir / "lone" / f"{engine}.parquet"


def collect_step_logs(work_dir: Path) -> pd.DataFrame:
    """The real runs' step logs :func:`run_engines` kept under ``work_dir/steps`` as one frame,
    in file-name order, with a ``run`` column (``<engine>_<policy>_<load>_<repeat>``, the file's
    stem) after the engine's own columns; empty if none was kept."""
    files = sorted((work_dir / "steps").glob("*.parquet"))
    frames = [pd.read_parquet(f).assign(run=f.stem) for f in files]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def run_engines_suite(
    config: BenchConfig,
    out_dir: Path,
    *,
    progress: Callable[[str], None] | None = None,
    command: list[str] | None = None,
) -> tuple[pd.DataFrame, str]:
    """``bench --suite engines``: parse ``suite.*`` options, run, write ``out_dir``.

    Server logs go to a temporary folder named in the manifest (``logs``), not to ``out_dir``.

    Returns:
        ``(the policy checks table, the files written as text)``.

    Raises:
        UserError: a bad suite option (before anything runs), or an engine that cannot start.
    """
    import tempfile

    from superinfer.harness.suites_engines_checks import host_speed_table
    from superinfer.harness.suites_engines_report import aggregate, policy_checks, write_engines

    opts = suite_options(config.engine_options)
    if config.policy_opts:  # `--policy-opt`: superinfer's, on every engine it runs on
        merged = merge_policy_opts(config.policy_options, ("superinfer",), config.policy_opts)
        config = replace(config, policy_opts=(), policy_options={**config.policy_options, **merged})
    for engine in (HF, SGLANG):  # a bad value fails here, not after an hour of runs
        try:
            policy_manager(
                "superinfer", superinfer_opts(engine, config.policy_options.get("superinfer"))
            )
        except ValueError as exc:
            raise UserError(f"--policy-opt: {exc}") from None
    work = Path(tempfile.mkdtemp(prefix="engines-cpu-logs-"))
    result = run_engines(replace(config, engine_options={}), opts, work, progress=progress)
    result.info["logs"] = str(work)
    files = write_engines(
        out_dir, result.summary, result.lone, result.info, NATIVE, command or [],
        steps=collect_step_logs(work), requests=result.requests,
    )  # fmt: skip
    speeds = host_speed_table(result.info)
    return policy_checks(aggregate(result.summary), NATIVE, speeds), files
