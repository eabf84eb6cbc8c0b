"""The settings of ``superinfer bench --suite engines``: its engines, policies, default loads,
server arguments and ``--engine-option suite.KEY=VALUE`` options (:class:`SuiteOptions`,
:func:`suite_options`). The suite itself: :mod:`superinfer.harness.suites_engines`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import pandas as pd

from superinfer.harness.errors import UserError
from superinfer.policy_core.types import SLO

__all__ = [
    "DEFAULT_LOADS",
    "ENGINE_POLICIES",
    "NATIVE",
    "REAL_ENGINES",
    "SIM_FOR",
    "SIM_OF",
    "SuiteOptions",
    "engine_loads",
    "for_engine",
    "relative_chat_ttft",
    "scaled_chat_ttft",
    "sim_row_limits",
    "sim_sglang_limits",
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
#: Real engine -> its simulated row.
SIM_FOR = {real: sim for sim, real in SIM_OF.items()}
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
#: results/sglang-cpu): no recompute preemption, a 32-token prefill floor per pass, two of the
#: server's 8 running-request seats kept for chats, one batch prompt's chunks at a time, and the
#: TTFT boost of steps without decodes (the last three are the policy's defaults, written out so
#: that each run's manifest records them: runs from before them ran without,
#: :data:`SGLANG_BEFORE_RECORD`).
SGLANG_SUPERINFER_OPTS = {
    "min_prefill_tokens": "32",
    "max_preemptions_per_step": "0",
    "ttft_seat_reserve": "2",
    "serial_whole_prefills": "true",
    "ttft_boost_unmixed": "true",
}
#: What ``superinfer`` ran with on SGLang in suite runs whose manifest does not record these
#: options (before they existed or were on: ``ttft_seat_reserve`` came with 4620b97,
#: ``serial_whole_prefills`` with 8f46555, ``ttft_boost_unmixed`` went on with cb517f6, and no
#: suite run on the real server recorded it before 2026-12-07).
SGLANG_BEFORE_RECORD = {
    "ttft_seat_reserve": "0",
    "serial_whole_prefills": "false",
    "ttft_boost_unmixed": "false",
}
#: Policy options of ``superinfer`` on the real hf engine (and ``sim:hf-cpu`` beside it): decode
#: allowances planned to 0.9 of the TPOT target. With 1.0, hf's mixed steps converge to the
#: target and its step-time noise pushed chats over it by 0.35-2.67 ms (results/hf/knee-hi, 0.4
#: req/s: 6 chats in 5 repeats); with 0.9 chat attainment there 0.758 -> 0.928 (results/hf/
#: tpot-plan-0.9, 5 repeats each). SGLang (prefill steps alone) showed no such miss.
#: Since 2026-12-07 also ``prefill_floor_yields`` (the 32-token floor made every chat
#: ``superinfer`` missed on hf miss its TPOT: results/engines-cpu/hf-relative-knee) with a
#: 128-token floor (``min_prefill_budget_share`` 0.5 of hf's 256-token step; at 32, batch
#: prompts ran in small chunks, each paying hf's per-prefill cost, and output tok/s was
#: 0.889-0.956x fcfs's at and below the knee; how much of that the chunks caused: not shown).
#: With 128, over six runs: output tok/s 0.999-1.018x at six of eight loads, all three of
#: issue 18's targets met twice at 0.333 req/s, chat TTFT p99 0.66x at the knee suite's in-band
#: load, and at 0.294 req/s with native above the band -0.9 points, 1.25x, 0.931x
#: (results/engines-cpu/README.md, "A 128-token yielding floor on hf").
HF_SUPERINFER_OPTS = {
    "tpot_plan_share": "0.9",
    "prefill_floor_yields": "true",
    "min_prefill_budget_share": "0.5",
}
#: What ``superinfer`` ran with on hf in suite runs whose manifest does not record it (before
#: 9816ae6: the policy's default plan share).
HF_BEFORE_RECORD = {"tpot_plan_share": "1.0"}
#: Options of :data:`HF_SUPERINFER_OPTS` that hf runs recorded before them ran without (the
#: policy's defaults).
HF_UNRECORDED = {"prefill_floor_yields": "false", "min_prefill_budget_share": "0.125"}
#: The ``sim:sglang-cpu`` profile: SGLang's mechanics (``sim.hf_cpu.hf_cpu_sim_config``:
#: prefill batches without decodes, PrefillAdder admission of the whole prompt and output, radix
#: cache) at the CPU server's limits (``SGLANG_ARGS`` and the CPU recipe: a 512-token step,
#: ``--chunked-prefill-size``; 8 running requests; ``--max-total-tokens 4096`` in pages of one
#: token, ``page_size`` 1). Until 2026-12-04 it ran hf's mechanics (mixed steps, no reserve) in
#: 16-token pages, which preempted a mean of 20-54 batch requests per run where the server
#: retracted none.
SIM_SGLANG_LIMITS = {
    "mechanics": "sglang",
    "page_size_tokens": "1",
    "num_blocks": "4096",
    "max_batch_tokens": "512",
    "max_num_seqs": "8",
}


def sim_sglang_limits(sglang_args: str, extend_rows: int = 0) -> dict[str, str]:
    """:data:`SIM_SGLANG_LIMITS` for a run whose SGLang servers had ``sglang_args`` as well
    (:attr:`SuiteOptions.sglang_args`): with ``--enable-mixed-chunk``, ``mixed_batches=1``
    (its prefill batches carry the running decodes); other arguments change nothing simulated.
    ``extend_rows`` (:attr:`SuiteOptions.sglang_extend_rows`): ``1`` adds ``extend_decodes=0``
    (the servers' one-token extends cost as decodes)."""
    limits = dict(SIM_SGLANG_LIMITS)
    if "--enable-mixed-chunk" in sglang_args.split():
        limits["mixed_batches"] = "1"
    if extend_rows:
        limits["extend_decodes"] = "0"
    return limits


@dataclass(frozen=True)
class SuiteOptions:
    """``--engine-option suite.KEY=VALUE`` settings of the suite.

    Attributes:
        engines: engines to run, of :data:`ENGINE_POLICIES` (a sim row needs its real engine
            too: its step time is fitted on that engine's lone requests, unless
            ``hf_step_time_file`` names a calibration for ``sim:hf-cpu``).
        loads: per real engine, total offered req/s (``suite.loads.hf=0.3,0.45,0.6``), used for
            the engines not in ``auto``.
        auto: real engines whose 3 loads come from a knee pilot before their runs
            (``suite.loads.hf=auto``; ``harness.suites_engines_knee``); all by default.
        probe_s: arrival window of a pilot run, s (default: ``duration_s``; a shorter probe
            builds less backlog past the knee than the runs do, so its knee lies above theirs:
            20 s probes put SGLang's at 1.75 req/s, where 45 s runs attained 0.16, mean of 3).
        max_probes: most pilot runs per engine.
        repeats: repeats of every (engine, policy, load), repeat ``r`` with seed ``seed + r``.
        duration_s: arrival window per run, s.
        batch_share: fraction of the offered load that is batch.
        chat_ttft_ms: chat TTFT target, ms, on every engine when ``chat_ttft_x`` is 0 (giving
            it alone sets ``chat_ttft_x`` to 0).
        chat_tpot_ms: chat TPOT target, ms.
        batch_deadline_s: batch end-to-end deadline, s.
        lone: lone requests per class per real engine (0: skip the lone pass).
        batched_max: the largest group of the batched pass (0: skip it): on the engines with a
            simulated row, groups of 2, 4, ... up to this many identical chat requests arrive
            at once, so that their TPOT gives the decode step's cost per extra sequence
            (``lone_step_fit``).
        lone_gap_s: seconds between lone requests, per real engine.
        hf_step_time_file: the ``sim:hf-cpu`` calibration: ``lone`` (default) fits it on this
            run's lone hf requests like ``sim:sglang-cpu``'s (``lone_step_fit``), so both
            simulated rows see the machine as it was during the runs; else a file of
            ``superinfer calibrate --engine hf`` (e.g. ``results/hf/step_time_fit.json``).
        sglang_model: the SmolLM2 folder for SGLang (default: ``make install-smollm2-sglang``'s).
        sglang_args: more ``launch_server`` arguments for every SGLang server of the run, after
            :data:`SGLANG_ARGS` (e.g. ``--enable-mixed-chunk``); recorded in the manifest's
            options. The ``sim:sglang-cpu`` row follows ``--enable-mixed-chunk`` only
            (:func:`sim_sglang_limits`).
        sglang_extend_rows: ``1`` runs every SGLang server of the run with
            ``SUPERINFER_SGLANG_EXTEND_ROWS=1`` (``adapters/sglang/extend_rows.py``: one-token
            extends attend as decodes); ``sim:sglang-cpu`` then times a mixed batch's decodes
            as decodes (``extend_decodes=0``).
        chat_ttft_x: engine-relative chat TTFT (issue 18): per real engine, this multiple of
            its own lone chat requests' median TTFT (the lone pass: the longest chat prompt,
            alone on the idle server, request path included), rounded to 10 ms; its simulated
            row takes the same target (:func:`relative_chat_ttft`, :func:`for_engine`). 0:
            ``chat_ttft_ms`` everywhere. The default 7 is where the absolute targets of the
            real SGLang runs sat: 1.5 s was 5.6-6.6x the lone 227-269 ms on the earlier hosts
            (``results/engines-cpu/sglang-knee3``, ``sglang-serial-0.6-s6``), 3.75 s was
            7.1-7.9x the lone 476-528 ms on the AVX2-only host (``sglang-fp32-*``).
    """

    engines: tuple[str, ...] = (*REAL_ENGINES, SIM_HF, SIM_SGLANG)
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
    batched_max: int = 8
    lone_gap_s: Mapping[str, float] = field(
        default_factory=lambda: {"hf": 12.0, "sglang": 6.0, "llamacpp": 3.0}
    )
    hf_step_time_file: str = "lone"
    sglang_model: str = ""
    sglang_args: str = ""
    sglang_extend_rows: int = 0
    chat_ttft_x: float = 7.0

    def slos(self) -> tuple[SLO, SLO]:
        """``(chat, batch)`` SLOs with the absolute ``chat_ttft_ms`` (an engine's own under
        ``chat_ttft_x``: :func:`for_engine`)."""
        chat = SLO("chat", ttft_ms=self.chat_ttft_ms, tpot_ms=self.chat_tpot_ms, priority=0)
        return chat, SLO("batch", deadline_s=self.batch_deadline_s, priority=1)


def sim_row_limits(opts: SuiteOptions, engine: str) -> dict[str, str]:
    """The simulator's limits for the sim row ``engine``: :func:`sim_sglang_limits` of the run's
    SGLang arguments for ``sim:sglang-cpu``; none for ``sim:hf-cpu`` (its profile's own)."""
    if engine != SIM_SGLANG:
        return {}
    return sim_sglang_limits(opts.sglang_args, opts.sglang_extend_rows)


def _floats(key: str, raw: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in raw.split(",") if v.strip())
    except ValueError:
        raise UserError(
            f"--engine-option suite.{key}={raw!r}: expected numbers like 0.3,0.6"
        ) from None
    if not vals or any(not (v > 0 and math.isfinite(v)) for v in vals):
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
            if name == "sglang_extend_rows" and val not in (0, 1):
                raise UserError(f"suite.{name}={raw!r}: must be 0 or 1")
            zero_ok = ("lone", "batched_max", "sglang_extend_rows", "chat_ttft_x")
            if not val > 0 and not (name in zero_ok and val == 0):
                raise UserError(f"suite.{name}={raw!r}: must be > 0")
            if name == "batch_share" and not val < 1:
                raise UserError(f"suite.batch_share={raw!r}: must be below 1")
            kw[name] = val
        else:
            known = sorted(plain | {"engines", "loads.<engine>", "lone_gap_s.<engine>"})
            raise UserError(f"unknown suite option {key!r}; known: suite.{', suite.'.join(known)}")
    if "chat_ttft_ms" in kw:  # an absolute target given: it holds on every engine
        if kw.setdefault("chat_ttft_x", 0.0):
            raise UserError("suite.chat_ttft_ms and suite.chat_ttft_x: give one")
    real = any(e in REAL_ENGINES for e in kw.get("engines", REAL_ENGINES))
    if real and kw.get("chat_ttft_x", SuiteOptions.chat_ttft_x) and kw.get("lone", 1) == 0:
        raise UserError("suite.chat_ttft_x needs the lone pass: suite.lone > 0 (or chat_ttft_ms)")
    return SuiteOptions(loads=loads, lone_gap_s=gaps, auto=tuple(auto), **kw)


def engine_loads(
    opts: SuiteOptions, engine: str, found: Mapping[str, tuple[float, ...]] | None = None
) -> tuple[float, ...]:
    """The loads (total req/s) ``engine`` runs at: its own (``found`` by the knee pilot, else
    ``opts.loads``), or its real engine's for a sim row."""
    real = SIM_OF.get(engine, engine)
    return tuple((found or {}).get(real) or opts.loads[real])


def relative_chat_ttft(lone: pd.DataFrame, opts: SuiteOptions, engine: str) -> dict[str, Any]:
    """``engine``'s chat TTFT target under ``opts.chat_ttft_x``: that multiple of the median
    TTFT of its lone chat requests (``lone``: the lone pass's ``requests`` rows; batched-pass rows,
    ``concurrency`` > 1, are left out), rounded to 10 ms.

    Returns:
        ``{"chat_ttft_ms": target, "chat_ttft_source": how it was derived}`` (manifest facts).

    Raises:
        UserError: no lone chat request of ``engine`` finished.
    """
    rows = lone[(lone["slo_class"] == "chat") & (lone["status"] == "finished")]
    if "concurrency" in rows:
        rows = rows[rows["concurrency"] == 1]
    ttft = rows["ttft_ms"].dropna()
    if ttft.empty:
        raise UserError(f"{engine}: no lone chat request finished, so no chat TTFT to scale")
    return scaled_chat_ttft(
        opts, float(ttft.median()), f"lone chat TTFT p50 of {len(ttft)} requests of "
        f"{CHAT_PROMPT[1]} prompt tokens",
    )  # fmt: skip


def scaled_chat_ttft(opts: SuiteOptions, lone_ms: float, what: str) -> dict[str, Any]:
    """``opts.chat_ttft_x`` times a lone chat TTFT ``lone_ms`` (ms), rounded to 10 ms (at least
    10), with ``what`` it is in the source line; :func:`relative_chat_ttft`'s dict."""
    target = max(10.0, round(opts.chat_ttft_x * lone_ms / 10.0) * 10.0)
    source = f"{opts.chat_ttft_x:g} x {lone_ms:.0f} ms, the {what}"
    return {"chat_ttft_ms": target, "chat_ttft_source": source}


def for_engine(
    opts: SuiteOptions, engines: Mapping[str, Mapping[str, Any]], engine: str
) -> SuiteOptions:
    """``opts`` with ``engine``'s own chat TTFT target (a sim row: its real engine's) from
    ``engines`` (the manifest's ``engines`` facts, :func:`relative_chat_ttft`'s keys); ``opts``
    itself when ``opts.chat_ttft_x`` is 0.

    Raises:
        UserError: ``engines`` has no target for it (its lone pass did not run).
    """
    if not opts.chat_ttft_x:
        return opts
    real = SIM_OF.get(engine, engine)
    target = engines.get(real, {}).get("chat_ttft_ms") or engines.get(engine, {}).get(
        "chat_ttft_ms"
    )
    if target is None:
        raise UserError(
            f"{engine}: no chat TTFT target of {real}'s lone pass for suite.chat_ttft_x; "
            "run it too, or give suite.chat_ttft_ms"
        )
    return replace(opts, chat_ttft_ms=float(target))
