"""``superinfer bench --suite engines``: one real model on three real engines (issue 24).

SmolLM2-135M-Instruct on the transformers engine (``hf``), on the real SGLang CPU server
(``sglang``, the bf16 weights of ``make install-smollm2-sglang``) and on llama.cpp's server
(``llamacpp``, the Q4_1 GGUF, replayed through the ``http`` engine), each under its own policy
and, where our policy plugs in (``hf``, ``sglang``), under ``priority`` and ``superinfer``; beside
them the simulated rows ``sim:hf-cpu`` and ``sim:sglang-cpu`` (the hf-cpu simulator, at SGLang's
limits for the latter), each with a step time fitted to this run's lone requests on its real engine.

One workload design for every engine (:func:`mix_workload`): Poisson chat (short prompts) and
batch (long prompts, up to SGLang's 1,024-token context with their output) streams, the same
absolute SLOs on every engine; repeat ``r`` draws its arrivals with seed ``seed + r``, the same
for every policy and engine (the simulated rows replay each repeat's arrivals too), so a
repeat's policies are compared on one sample and the spread covers the arrivals as well as the
machine. Each real engine first serves lone requests
(:func:`lone_workload`: one at a time, far apart) so that the report states its unloaded TTFT and
TPOT; then a knee pilot; then 3 loads around its knee (total req/s) x repeats, the
repeats interleaved (repeat 0 of every load and policy, then repeat 1, ...). Servers are started
once per engine and policy and reused across loads and repeats (SGLang's radix cache is flushed
before every run, so a repeat does not reuse the last one's prompts).

Suite options are ``--engine-option suite.KEY=VALUE`` (:class:`SuiteOptions`); the files are
written by :mod:`superinfer.harness.suites_engines_report`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from superinfer.harness.bench import BenchConfig, run_bench
from superinfer.harness.errors import UserError
from superinfer.harness.suites_engines_knee import lone_step_fit, pilot_knee, sglang_step_fit
from superinfer.harness.workload.workload import Source, Workload
from superinfer.policy_core.types import SLO
from superinfer.sim.hf_cpu import SIM_HF_CPU
from superinfer.sim.request import RequestSpec

__all__ = [
    "DEFAULT_LOADS",
    "ENGINE_POLICIES",
    "NATIVE",
    "REAL_ENGINES",
    "SIM_OF",
    "SuiteOptions",
    "engine_loads",
    "lone_workload",
    "mix_workload",
    "run_engines",
    "suite_options",
]

#: The suite's engine names (``llamacpp`` and ``sim:sglang-cpu`` are its own: they run through
#: the ``http`` and ``sim:hf-cpu`` engines of the registry).
#: The real engines are in run order.
REAL_ENGINES = HF, SGLANG, LLAMACPP = ("hf", "sglang", "llamacpp")
SIM_HF, SIM_SGLANG = "sim:hf-cpu", "sim:sglang-cpu"
#: Policies per engine; the first is the engine's own (``native`` column of the report).
ENGINE_POLICIES: Mapping[str, tuple[str, ...]] = {
    "hf": ("fcfs", "priority", "superinfer"),
    "sglang": ("native", "priority", "superinfer"),
    "llamacpp": ("native",),
    "sim:hf-cpu": ("fcfs", "priority", "superinfer"),
    "sim:sglang-cpu": ("fcfs", "priority", "superinfer"),
}
#: Each engine's own policy.
NATIVE = {engine: policies[0] for engine, policies in ENGINE_POLICIES.items()}
#: Simulated engine -> the real engine whose loads it replays and whose rows it models.
SIM_OF = {"sim:hf-cpu": "hf", "sim:sglang-cpu": "sglang"}
#: Total offered load (chat + batch req/s) per real engine: around each one's knee, from short
#: pilots of its native policy (results/engines-cpu/report.md says which).
DEFAULT_LOADS: Mapping[str, tuple[float, ...]] = {
    "hf": (0.3, 0.45, 0.6),
    "sglang": (0.6, 0.9, 1.2),
    "llamacpp": (1.0, 1.5, 2.0),
}
#: A run's arrival window is long enough for this many requests on average.
MIN_EXPECTED = 8
#: Token ranges (inclusive) per class: chat prompts and outputs short; batch prompts long, with
#: their output inside SGLang's 1,024-token context (two 512-token chunks at most).
CHAT_PROMPT = (32, 160)
CHAT_OUTPUT = (16, 48)
BATCH_PROMPT = (600, 900)
BATCH_OUTPUT = (32, 96)
#: SGLang server arguments for the real model (the CPU recipe adds the rest; docs/adapters.md).
SGLANG_ARGS = "--context-length 1024 --chunked-prefill-size 512 --max-running-requests 8"
#: Policy options of ``superinfer`` through the SGLang plugin (docs/adapters.md: the knee run of
#: results/sglang-cpu): no recompute preemption, a 32-token prefill floor per pass.
SGLANG_SUPERINFER_OPTS = {"min_prefill_tokens": "32", "max_preemptions_per_step": "0"}
#: SGLang's limits in the ``sim:sglang-cpu`` profile (hf-cpu mechanics): a 512-token step
#: (``--chunked-prefill-size``), 8 running requests, a 4,096-token pool in 16-token pages.
SIM_SGLANG_LIMITS = {
    "page_size_tokens": "16",
    "num_blocks": "256",
    "max_batch_tokens": "512",
    "max_num_seqs": "8",
}


@dataclass(frozen=True)
class SuiteOptions:
    """``--engine-option suite.KEY=VALUE`` settings of the suite.

    Attributes:
        engines: engines to run, of :data:`ENGINE_POLICIES` (sim rows need their real engine's
            lone run only for ``sim:sglang-cpu``'s fit).
        loads: per real engine, total offered req/s (``suite.loads.hf=0.3,0.45,0.6``), used for
            the engines not in ``auto``.
        auto: real engines whose 3 loads come from a knee pilot before their runs
            (``suite.loads.hf=auto``; ``harness.suites_engines_knee``); all by default.
        probe_s: arrival window of a pilot run, s (default: ``duration_s``; a shorter probe
            builds less backlog past the knee than the runs do, so its knee lies above theirs:
            20 s probes put SGLang's at 1.75 req/s, where 45 s runs attained 0.34).
        max_probes: most pilot runs per engine.
        repeats: repeats of every (engine, policy, load), repeat ``r`` with seed ``seed + r``.
        duration_s: arrival window per run, s.
        batch_share: fraction of the offered load that is batch.
        chat_ttft_ms: chat TTFT target, ms (every engine).
        chat_tpot_ms: chat TPOT target, ms.
        batch_deadline_s: batch end-to-end deadline, s.
        lone: lone requests per class per real engine (0: skip the lone pass).
        lone_gap_s: seconds between lone requests, per real engine.
        hf_step_time_file: the ``sim:hf-cpu`` calibration: ``lone`` (default) fits it on this
            run's lone hf requests like ``sim:sglang-cpu``'s (``lone_step_fit``), so both
            simulated rows see the machine as it was during the runs; else a file of
            ``superinfer calibrate --engine hf`` (e.g. ``results/hf/step_time_fit.json``).
        sglang_model: the SmolLM2 folder for SGLang (default: ``make install-smollm2-sglang``'s).
    """

    engines: tuple[str, ...] = (*REAL_ENGINES, "sim:hf-cpu", "sim:sglang-cpu")
    loads: Mapping[str, tuple[float, ...]] = field(default_factory=lambda: dict(DEFAULT_LOADS))
    auto: tuple[str, ...] = REAL_ENGINES
    probe_s: float | None = None
    max_probes: int = 5
    repeats: int = 3
    duration_s: float = 45.0
    batch_share: float = 0.4
    chat_ttft_ms: float = 1500.0
    chat_tpot_ms: float = 500.0
    batch_deadline_s: float = 120.0
    lone: int = 2
    lone_gap_s: Mapping[str, float] = field(
        default_factory=lambda: {"hf": 12.0, "sglang": 6.0, "llamacpp": 3.0}
    )
    hf_step_time_file: str = "lone"
    sglang_model: str = ""

    def slos(self) -> tuple[SLO, SLO]:
        """``(chat, batch)`` SLOs, the same on every engine."""
        chat = SLO("chat", ttft_ms=self.chat_ttft_ms, tpot_ms=self.chat_tpot_ms, priority=0)
        return chat, SLO("batch", deadline_s=self.batch_deadline_s, priority=1)


def _floats(key: str, raw: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in raw.split(",") if v.strip())
    except ValueError:
        raise UserError(
            f"--engine-option suite.{key}={raw!r}: expected numbers like 0.3,0.6"
        ) from None
    if not vals or any(not (v > 0 and np.isfinite(v)) for v in vals):
        raise UserError(f"--engine-option suite.{key}={raw!r}: needs positive numbers")
    return vals


def suite_options(options: Mapping[str, str]) -> SuiteOptions:
    """Parse the ``suite.*`` keys of ``--engine-option`` (others are refused: the suite sets
    every engine's own options itself).

    Raises:
        UserError: an unknown key or engine, or a bad value; one line naming the key.
    """
    plain = {f.name for f in fields(SuiteOptions)} - {"loads", "lone_gap_s", "engines", "auto"}
    kw: dict[str, Any] = {}
    loads = dict(DEFAULT_LOADS)
    auto = list(REAL_ENGINES)
    gaps = dict(SuiteOptions().lone_gap_s)
    for key, raw in options.items():
        name = key.removeprefix("suite.")
        if name == key:
            raise UserError(f"--suite engines takes only suite.* engine options, got {key!r}")
        head, _, engine = name.partition(".")
        if head in ("loads", "lone_gap_s") and engine:
            if engine not in REAL_ENGINES:
                raise UserError(
                    f"suite.{name}: unknown engine {engine!r}; known: {', '.join(REAL_ENGINES)}"
                )
            if head == "loads" and raw.strip() == "auto":
                auto += [engine] if engine not in auto else []
                continue
            vals = _floats(name, raw)
            if head == "loads":
                loads[engine] = vals
                auto = [e for e in auto if e != engine]
            else:
                gaps[engine] = vals[0]
        elif name == "engines":
            chosen = tuple(e.strip() for e in raw.split(",") if e.strip())
            bad = [e for e in chosen if e not in ENGINE_POLICIES]
            if bad or not chosen:
                raise UserError(
                    f"suite.engines: unknown engine {', '.join(bad) or raw!r}; "
                    f"known: {', '.join(ENGINE_POLICIES)}"
                )
            kw["engines"] = chosen
        elif name in plain:
            kind = SuiteOptions.__dataclass_fields__[name].type
            if kind == "str":
                kw[name] = raw
                continue
            try:
                val = int(raw) if kind == "int" else float(raw)
            except ValueError:
                raise UserError(f"suite.{name}={raw!r}: not a number") from None
            if not val > 0 and not (name == "lone" and val == 0):
                raise UserError(f"suite.{name}={raw!r}: must be > 0")
            if name == "batch_share" and not val < 1:
                raise UserError(f"suite.batch_share={raw!r}: must be below 1")
            kw[name] = val
        else:
            known = sorted(plain | {"engines", "loads.<engine>", "lone_gap_s.<engine>"})
            raise UserError(f"unknown suite option {key!r}; known: suite.{', suite.'.join(known)}")
    return SuiteOptions(loads=loads, lone_gap_s=gaps, auto=tuple(auto), **kw)


def engine_loads(
    opts: SuiteOptions, engine: str, found: Mapping[str, tuple[float, ...]] | None = None
) -> tuple[float, ...]:
    """The loads (total req/s) ``engine`` runs at: its own (``found`` by the knee pilot, else
    ``opts.loads``), or its real engine's for a sim row."""
    real = SIM_OF.get(engine, engine)
    return tuple((found or {}).get(real) or opts.loads[real])


def _spec(i: int, slo: SLO, t: float, prompt: int, out: int) -> RequestSpec:
    return RequestSpec(
        request_id=f"{slo.name}-{i}",
        arrival_s=round(t, 3),
        prompt_tokens=prompt,
        output_tokens=out,
        max_output_tokens=out,
        slo=slo,
        source=slo.name,
    )


def _workload(name: str, specs: list[RequestSpec], opts: SuiteOptions, **details: Any) -> Workload:
    chat, batch = opts.slos()
    specs.sort(key=lambda s: (s.arrival_s, s.request_id))
    sources = (
        Source("chat", "synthetic", chat, CHAT_OUTPUT[1]),
        Source("batch", "synthetic", batch, BATCH_OUTPUT[1]),
    )
    duration = max((s.arrival_s for s in specs), default=0.0)
    details = {
        "generator": f"harness/suites_engines.py::{name}",
        "chat_prompt": CHAT_PROMPT,
        "chat_output": CHAT_OUTPUT,
        "batch_prompt": BATCH_PROMPT,
        "batch_output": BATCH_OUTPUT,
        **details,
    }
    return Workload(name, tuple(specs), sources, 1.0, duration, details=details)


def mix_workload(opts: SuiteOptions, load: float, seed: int) -> Workload:
    """The suite's requests at ``load`` total req/s: two Poisson streams on one clock over
    ``opts.duration_s`` (or ``MIN_EXPECTED / load`` if longer): chat at ``(1 - batch_share) *
    load``, batch at ``batch_share * load``, lengths uniform in the class ranges; ids
    ``chat-I`` / ``batch-I``, in arrival order.

    Raises:
        UserError: no request falls in the window.
    """
    specs: list[RequestSpec] = []
    window = max(opts.duration_s, MIN_EXPECTED / load)
    for k, (slo, share, prompt, output) in enumerate(
        zip(
            opts.slos(),
            (1 - opts.batch_share, opts.batch_share),
            (CHAT_PROMPT, BATCH_PROMPT),
            (CHAT_OUTPUT, BATCH_OUTPUT),
            strict=True,
        )
    ):
        rng = np.random.default_rng([seed, k])
        t, i = 0.0, 0
        while True:
            t += float(rng.exponential(1.0 / (share * load)))
            if t >= window:
                break
            out = int(rng.integers(output[0], output[1] + 1))
            specs.append(_spec(i, slo, t, int(rng.integers(prompt[0], prompt[1] + 1)), out))
            i += 1
    if not specs:
        raise UserError(f"load {load:g} req/s over {window:g} s draws no request")
    return _workload(
        "engines-mix", specs, opts, load_rps=load, seed=seed, batch_share=opts.batch_share
    )


def lone_workload(opts: SuiteOptions, gap_s: float) -> Workload:
    """``opts.lone`` chat then ``opts.lone`` batch requests, ``gap_s`` apart, each of the longest
    prompt of its class (the worst unloaded case) and the middle output length."""
    specs = []
    for n in range(opts.lone):
        specs.append(
            _spec(n, opts.slos()[0], 1.0 + n * gap_s, CHAT_PROMPT[1], sum(CHAT_OUTPUT) // 2)
        )
    for n in range(opts.lone):
        t = 1.0 + (opts.lone + n) * gap_s
        specs.append(_spec(n, opts.slos()[1], t, BATCH_PROMPT[1], sum(BATCH_OUTPUT) // 2))
    return _workload("engines-lone", specs, opts, gap_s=gap_s)


# -- running ------------------------------------------------------------------------------------


@dataclass
class EnginesResult:
    """Everything the suite measured.

    Attributes:
        summary: every run's summary rows with ``engine, policy, repeat, load`` first.
        lone: the lone requests of every real engine (``requests`` rows, ``engine`` column).
        info: manifest facts per run (``<engine>/<policy>/<load>/<repeat>``) and per engine.
    """

    summary: pd.DataFrame
    lone: pd.DataFrame
    info: dict[str, Any]


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


@contextlib.contextmanager
def _servers(engine: str, opts: SuiteOptions, log_dir: Path) -> Iterator[dict[str, Any]]:
    """Per policy of ``engine``: ``{"url", "server"}`` (``hf``: nothing to start)."""
    if engine == HF:
        yield {p: {} for p in ENGINE_POLICIES["hf"]}
        return
    with contextlib.ExitStack() as stack:
        if engine == LLAMACPP:
            from superinfer.harness.engines.peers import llamacpp_server

            url = stack.enter_context(llamacpp_server(log=log_dir / "llamacpp.log"))
            yield {"native": {"url": url}}
            return
        from superinfer.adapters.sglang.real_model import default_real_model_dir
        from superinfer.adapters.sglang.server import ServerStartError, SGLangServer

        model = Path(opts.sglang_model) if opts.sglang_model else default_real_model_dir()
        if not (model / "model.safetensors").is_file():
            raise UserError(
                f"{model}: no SmolLM2 weights for SGLang; run `make install-smollm2-sglang`"
            )
        out: dict[str, Any] = {}
        for policy in ENGINE_POLICIES["sglang"]:
            plugin_opts = SGLANG_SUPERINFER_OPTS if policy == "superinfer" else {}
            server = SGLangServer(
                policy,
                ["--model-path", str(model), *SGLANG_ARGS.split()],
                policy_opts=[f"{k}={v}" for k, v in plugin_opts.items()],
                log_path=log_dir / f"sglang-{policy}.log",
            )
            try:
                server.start()
            except ServerStartError as exc:
                raise UserError(str(exc)) from None
            stack.callback(server.stop)
            out[policy] = {"url": server.url, "server": server}
        yield out


def _run_cell(
    config: BenchConfig,
    engine: str,
    policy: str,
    wl: Workload,
    handle: Mapping[str, Any],
    opts: SuiteOptions,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """One real run; ``(summary, requests, info)`` with ``engine``/``policy`` as the suite names
    them."""
    if engine == HF:
        cfg = _base(config, "hf", policy, engine_options={})
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
    result = run_bench(cfg, workload=wl)
    summary, requests = result.summary.copy(), result.requests.copy()
    for frame in (summary, requests):
        frame["engine"], frame["policy"] = engine, policy
    outcomes = requests.groupby(["slo_class", "status", "reason"], dropna=False).size()
    info: dict[str, Any] = {
        "cells": result.info.get("cells"),
        "outcomes": {"/".join(map(str, k)): int(n) for k, n in outcomes.items()},
    }
    if (server := handle.get("server")) is not None and server.plugin:
        info["plugin_stats"] = server.stats()
    return summary, requests, info


def _sim_cells(
    config: BenchConfig,
    engine: str,
    opts: SuiteOptions,
    fit_file: Path,
    progress: Callable[[str], None],
    found: Mapping[str, tuple[float, ...]],
) -> list[pd.DataFrame]:
    limits = SIM_SGLANG_LIMITS if engine == SIM_SGLANG else {}
    eopts = {**limits, "step_time_file": str(fit_file)}
    frames = []
    cfg = replace(
        _base(config, "sim:hf-cpu", "fcfs", engine_options=eopts),
        policies=ENGINE_POLICIES[engine],
    )
    for rep in range(opts.repeats):
        for load in engine_loads(opts, engine, found):
            progress(f"{engine} at {load:g} req/s, repeat {rep}")
            wl = mix_workload(opts, load, config.seed + rep)
            summary = run_bench(cfg, workload=wl).summary.copy()
            summary["engine"] = engine
            frames.append(_keyed(summary, rep, load))
    return frames


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
    found: dict[str, tuple[float, ...]],
    info: dict[str, Any],
    tell: Callable[[str], None],
    frames: list[pd.DataFrame],
) -> None:
    """One real engine's lone pass, knee pilot and runs (repeats outermost) into ``frames``."""
    begin = time.monotonic()
    with _servers(engine, opts, work_dir) as handles:
        info["engines"][engine] = {"startup_s": round(time.monotonic() - begin, 1)}
        native = NATIVE[engine]
        if opts.lone:
            tell(f"{engine}: lone requests")
            wl = lone_workload(opts, opts.lone_gap_s[engine])
            _, req, _ = _run_cell(config, engine, native, wl, handles[native], opts)
            lones.append(req)
        if engine in opts.auto:
            found[engine] = _knee(config, engine, opts, handles[native], lones, info, tell)
        for rep in range(opts.repeats):
            for load in engine_loads(opts, engine, found):
                wl = mix_workload(opts, load, config.seed + rep)
                for policy in ENGINE_POLICIES[engine]:
                    tell(f"{engine}/{policy} at {load:g} req/s, repeat {rep}")
                    t0 = time.monotonic()
                    summary, _, run = _run_cell(config, engine, policy, wl, handles[policy], opts)
                    run["wall_s"] = round(time.monotonic() - t0, 1)
                    info["runs"][f"{engine}/{policy}/{load:g}/{rep}"] = run
                    frames.append(_keyed(summary, rep, load))
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
        work_dir: where server logs and the ``<engine>_step_time.json`` fits go.
        progress: called with a message before every run.
    """
    tell = progress or (lambda _msg: None)
    frames: list[pd.DataFrame] = []
    lones: list[pd.DataFrame] = []
    info: dict[str, Any] = {"suite": "engines", "runs": {}, "engines": {}}
    info.update(config=dataclasses.asdict(config), options=dataclasses.asdict(opts))
    fit_files: dict[str, Path] = {}
    if opts.hf_step_time_file != "lone":
        fit_files[SIM_HF] = Path(opts.hf_step_time_file)
    found: dict[str, tuple[float, ...]] = {}
    work_dir.mkdir(parents=True, exist_ok=True)
    for engine in (e for e in REAL_ENGINES if e in opts.engines):
        try:
            _real_engine(config, engine, opts, work_dir, lones, found, info, tell, frames)
        except UserError as exc:  # an engine that cannot run does not lose the others' runs
            info.setdefault("failed", {})[engine] = str(exc)
            tell(f"{engine} failed: {exc}")
            continue
        sim = {SGLANG: SIM_SGLANG, HF: SIM_HF}.get(engine)
        if sim is None or sim in fit_files or not opts.lone or sim not in opts.engines:
            continue
        if engine == SGLANG:
            fit = sglang_step_fit(lones[-1])
        else:
            fit = lone_step_fit(lones[-1], SIM_HF_CPU.token_budget, "hf")
        fit_files[sim] = work_dir / f"{engine}_step_time.json"
        fit_files[sim].write_text(json.dumps(fit, indent=2) + "\n")
        info["engines"][sim] = fit
    for engine in (e for e in SIM_OF if e in opts.engines):
        if engine not in fit_files:
            real = SIM_OF[engine]
            raise UserError(f"{engine} is fitted on the lone {real} requests: run {real} too")
        frames += _sim_cells(config, engine, opts, fit_files[engine], tell, found)
    summary = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    lone = pd.concat(lones, ignore_index=True) if lones else pd.DataFrame()
    return EnginesResult(summary, lone, info)


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

    from superinfer.harness.suites_engines_report import aggregate, policy_checks, write_engines

    opts = suite_options(config.engine_options)
    work = Path(tempfile.mkdtemp(prefix="engines-cpu-logs-"))
    result = run_engines(replace(config, engine_options={}), opts, work, progress=progress)
    result.info["logs"] = str(work)
    files = write_engines(out_dir, result.summary, result.lone, result.info, NATIVE, command or [])
    return policy_checks(aggregate(result.summary), NATIVE), files
