"""``results/engines-cpu/``: the tables, checks, plot and report of ``bench --suite engines``.

Files (:func:`write_engines`): ``summary.csv`` (every run's summary rows, ``engine, policy,
repeat, load`` first), ``aggregate.csv`` (:func:`aggregate`: mean, min, max, sample std over the
repeats of every metric), ``lone.csv`` (each real engine's lone requests), ``checks.csv``
(:func:`policy_checks`: superinfer vs native chat attainment per load), ``fidelity.csv``
(``suites_engines_fidelity``: simulated rows against their real rows), ``host_speed.csv`` (each
real run's host speed against its engine's step-log fit, when there is one:
``suites_engines_checks.host_speed_frame``), ``attainment_vs_load.png``, ``report.md``,
``manifest.json`` and ``MANIFEST.md``.
"""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.report.results import CSV_FLOAT_FORMAT, manifest, staged_dir, write_atomic
from superinfer.harness.suites_engines_checks import host_speed_table, policy_checks
from superinfer.harness.suites_engines_fidelity import (
    FIDELITY_BOUND,
    FIDELITY_BOUND_P99,
    FIDELITY_BOUND_POINTS,
    fidelity,
    fidelity_bound,
    mean_of,
    within_count,
)
from superinfer.harness.suites_engines_options import SIM_OF

__all__ = [
    "ENGINE_NOTES",
    "aggregate",
    "policy_checks",
    "render_engines_report",
    "write_engines",
]

#: Keys of a summary row the repeats are aggregated over.
KEYS = ("engine", "policy", "load", "slo_class")
#: What differs between the engines, next to every number (checked on this machine).
ENGINE_NOTES = {
    "hf": "transformers continuous batching; GGUF dequantized to float32 weights and compute "
    "(`dtype` in manifest.json); KV pages of 32 tokens, 256 pages; 256-token steps (prefill "
    "chunked to fit the step); up to 32 sequences; admission by our policy hook (fcfs = the "
    "engine's own order; superinfer with tpot_plan_share=0.9, prefill_floor_yields=true and "
    "min_prefill_budget_share=0.5 (a 128-token floor) unless --policy-opt says otherwise: "
    "manifest.json superinfer_options)",
    "sglang": "SGLang 0.5.23 server, CPU recipe (torch_native attention); GGUF dequantized to "
    "bfloat16 safetensors, run in bf16 where the CPU has native bf16 math and in fp32 elsewhere "
    "(`--dtype`: the manifest's cpu_recipe); page size 1 token, 4,096-token KV pool; chunked "
    "prefill 512 tokens; 8 running requests; native = `--schedule-policy fcfs`, priority = "
    "`--enable-priority-scheduling`, superinfer = our plugin (min_prefill_tokens=32, "
    "max_preemptions_per_step=0, ttft_seat_reserve=2, serial_whole_prefills=true, "
    "ttft_boost_unmixed=true unless --policy-opt says otherwise: manifest.json "
    "superinfer_options)",
    "llamacpp": "llama.cpp server (llama-cpp-python 0.3.36), the Q4_1 GGUF itself (4-bit weights, "
    "f16 KV cache); n_ctx 2048; one request at a time, the rest queue (FIFO): no batching, no "
    "plugin",
    "sim:hf-cpu": "simulator with hf's mechanics and a step time fitted to this run's hf step "
    "logs, or its lone requests when they hold under 200 steps (hf_step_time.json; or the "
    "calibration file `suite.hf_step_time_file` names)",
    "sim:sglang-cpu": "simulator with SGLang's mechanics (prefill batches alone, PrefillAdder "
    "admission of the whole prompt and output, radix cache) at the server's limits (512-token "
    "steps, 8 sequences, 4,096 tokens in pages of 1) and a step time fitted to this run's SGLang "
    "step logs, or its lone requests when they hold under 200 steps (sglang_step_time.json)",
}


def aggregate(summary: pd.DataFrame, keys: Sequence[str] = KEYS) -> pd.DataFrame:
    """Mean, min, max and sample standard deviation (ddof 1; NaN for one repeat) over repeats of
    every numeric column, per ``keys``; columns ``*keys, metric, n, mean, min, max, std``.

    ``n`` counts the non-NaN values (a latency of a class with no finished request is NaN)."""
    skip = {*keys, "repeat"}
    numeric = [
        c for c in summary.columns if c not in skip and pd.api.types.is_numeric_dtype(summary[c])
    ]
    rows = []
    for key, grp in summary.groupby(list(keys), sort=False):
        for col in numeric:
            vals = grp[col].astype(float).dropna()
            rows.append(
                {
                    **dict(zip(keys, key, strict=True)),
                    "metric": col,
                    "n": len(vals),
                    "mean": vals.mean() if len(vals) else math.nan,
                    "min": vals.min() if len(vals) else math.nan,
                    "max": vals.max() if len(vals) else math.nan,
                    "std": vals.std(ddof=1) if len(vals) > 1 else math.nan,
                }
            )
    return pd.DataFrame(rows, columns=[*keys, "metric", "n", "mean", "min", "max", "std"])


def _fmt(v: float, digits: int = 0) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.{digits}f}"


def _table(head: Sequence[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]


def _split_probes(lone: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``lone.csv``'s rows -> (the lone requests, the batched pass's); a table written before
    the batched pass existed has no ``concurrency`` column and only lone rows."""
    if "concurrency" not in lone.columns:
        return lone, lone.iloc[0:0]
    one = lone["concurrency"].fillna(1) == 1
    return lone[one], lone[~one]


def _batched_rows(batched: pd.DataFrame) -> list[list[str]]:
    rows = []
    for (engine, k), g in batched.groupby(["engine", "concurrency"], sort=False):
        rows.append(
            [
                f"`{engine}`",
                str(int(k)),
                f"{int(g['status'].eq('finished').sum())}/{len(g)}",
                _fmt(g["ttft_ms"].median()),
                _fmt(g["tpot_ms"].median(), 1),
                _fmt(g["tpot_ms"].max(), 1),
            ]
        )
    return rows


def _lone_rows(lone: pd.DataFrame) -> list[list[str]]:
    rows = []
    for (engine, cls), g in lone.groupby(["engine", "slo_class"], sort=False):
        rows.append(
            [
                f"`{engine}`",
                cls,
                str(len(g)),
                str(int(g["prompt_tokens"].iloc[0])),
                _fmt(g["ttft_ms"].median()),
                _fmt(g["ttft_ms"].max()),
                _fmt(g["tpot_ms"].median(), 1),
                _fmt(g["tpot_ms"].max(), 1),
                f"{int(g['met_slo'].sum())}/{len(g)}",
            ]
        )
    return rows


def _main_rows(agg: pd.DataFrame) -> list[list[str]]:
    rows = []
    for (engine, policy, load, cls), _ in agg.groupby(list(KEYS), sort=False):

        def m(
            metric: str,
            stat: str = "mean",
            k: tuple[str, str, float, str] = (engine, policy, load, cls),  # noqa: B008
        ) -> float:
            return mean_of(agg, k[0], k[1], k[2], k[3], metric, stat)

        att = (
            f"{m('slo_attainment'):.3f} ({m('slo_attainment', 'min'):.3f}-"
            f"{m('slo_attainment', 'max'):.3f})"
        )
        rows.append(
            [
                f"`{engine}`",
                policy,
                f"{load:g}",
                cls,
                _fmt(m("n_requests")),
                _fmt(m("ttft_p50_ms")),
                _fmt(m("ttft_p99_ms")),
                _fmt(m("tpot_p50_ms"), 1),
                _fmt(m("tpot_p99_ms"), 1),
                att,
                _fmt(m("goodput_rps"), 3),
                _fmt(m("output_tok_s"), 1),
                _fmt(m("kv_peak_gb") * 1e3, 1),
            ]
        )
    return rows


def render_engines_report(
    summary: pd.DataFrame,
    agg: pd.DataFrame,
    lone: pd.DataFrame,
    checks: pd.DataFrame,
    fid: pd.DataFrame,
    meta: dict[str, Any],
) -> str:
    """``report.md``: setup, lone latencies, per engine x policy x load x class table, the
    policy checks, the fidelity of the simulated rows, per-engine notes."""
    opts = meta.get("options", {})
    lines = [
        "# One model on three real engines (`superinfer bench --suite engines`)",
        "",
        f"SmolLM2-135M-Instruct on `hf`, `sglang` and `llamacpp` (real, 2-core CPU host "
        f"`{platform.node()}`), with `sim:hf-cpu` and `sim:sglang-cpu` beside them; git "
        f"`{meta.get('git_sha')}`, seed {meta.get('seed')}, {meta.get('created_utc')}. "
        f"Workload `engines-mix` (harness/suites_engines.py): Poisson, "
        f"{opts.get('duration_s')} s of arrivals per run, batch share "
        f"{opts.get('batch_share')}; chat prompts 32-160 tokens / outputs 16-48, batch "
        f"prompts 600-900 / outputs 32-96 (inside SGLang's 1,024-token context). SLOs: chat "
        f"TTFT <= {_chat_ttft(meta)} and TPOT <= "
        f"{opts.get('chat_tpot_ms'):g} ms; batch done within "
        f"{opts.get('batch_deadline_s'):g} s. Loads are total req/s, per engine around its "
        f"own knee; {opts.get('repeats')} interleaved repeats of every run, repeat r "
        "drawing its arrivals with seed seed + r (the same for every engine and policy).",
        "",
    ]
    if not lone.empty:
        alone, batched = _split_probes(lone)
        lines += ["## Unloaded latency (a lone request at a time)", ""]
        lines += _table(
            [
                "engine",
                "class",
                "n",
                "prompt tokens",
                "TTFT p50 ms",
                "TTFT max ms",
                "TPOT p50 ms",
                "TPOT max ms",
                "met SLO",
            ],
            _lone_rows(alone),
        )
        if opts.get("chat_ttft_x"):
            lines += [
                "A lone chat's SLO here is its TPOT target alone: its engine's TTFT target is "
                "made from these chats.",
                "",
            ]
        if not batched.empty:
            lines += [
                "Batched pass (identical 64-token chat prompts, 32 output tokens, a group "
                "arriving at once; its TPOT is the decode step at that many sequences):",
                "",
            ]
            head = ["engine", "sequences", "finished", "TTFT p50 ms", "TPOT p50 ms", "TPOT max ms"]
            lines += _table(head, _batched_rows(batched))
    for engine, why in meta.get("failed", {}).items():
        lines += [f"**`{engine}` did not run**: {why}", ""]
    knees = meta.get("knees", {})
    if knees:
        lines += ["## Where each engine's knee is (native pilot, before its runs)", ""]
        rows = [
            [
                f"`{e}`",
                f"{k['start']:.3g}",
                ", ".join(f"{ld:.3g} -> {at:.2f}" for ld, at in k["probes"]),
                f"{k['knee']:.3g}",
                ", ".join(f"{x:g}" for x in k["loads"]),
            ]
            for e, k in knees.items()
        ]
        lines += _table(
            [
                "engine",
                "first probe req/s (lone serial capacity)",
                "probes: load -> native chat attainment",
                "knee",
                "loads run",
            ],
            rows,
        )
        lines += [
            f"Each probe: {opts.get('probe_s') or opts.get('duration_s')} s of arrivals of the "
            "same workload, native "
            "policy; the knee is the first probe with attainment in 0.6-0.85, else the "
            "geometric mean of the tightest bracket (harness/suites_engines_knee.py).",
            "",
        ]
    lines += [
        "## Results (mean over repeats; attainment: mean (min-max))",
        "",
        "KV peak in MB; TTFT/TPOT over finished requests. Engine notes below the table "
        "say what differs between the engines (precision, page size, chunking, "
        "admission).",
        "",
    ]
    lines += _table(
        [
            "engine",
            "policy",
            "load req/s",
            "class",
            "req",
            "TTFT p50",
            "TTFT p99",
            "TPOT p50",
            "TPOT p99",
            "SLO attain.",
            "goodput req/s",
            "output tok/s",
            "KV peak MB",
        ],
        _main_rows(agg),
    )
    lines += ["### Engine notes", ""]
    lines += [f"- `{e}`: {n}." for e, n in ENGINE_NOTES.items() if e in set(agg["engine"])]
    lines += [
        "",
        "## superinfer against each engine's own policy (chat attainment; issue 18's targets)",
        "",
    ]
    if not checks.empty:
        rows = [
            [
                f"`{r.engine}`",
                f"{r.load:g}",
                r.native,
                f"{r.native_chat_attainment:.3f}",
                f"{r.superinfer_chat_attainment:.3f}",
                f"{r.points:+.1f}",
                f">= {r.required_points:+.0f}",
                "met" if r.met else "**missed**",
                _fmt(r.gap_closed * 100) + "%",
                _fmt(r.chat_ttft_p99_ratio, 2) + "x",
                _fmt(r.output_tok_s_ratio, 3) + "x",
                "–" if r.issue18_met is None else ("met" if r.issue18_met else "**missed**"),
            ]
            for r in checks.itertuples()
        ]
        lines += _table(
            [
                "engine",
                "load",
                "native",
                "native",
                "superinfer",
                "points",
                "required",
                "",
                "native's gap closed",
                "chat TTFT p99 vs native",
                "output tok/s vs native",
                "issue 18 (0.6-0.8: +15, <= 0.6x, >= 0.95x)",
            ],
            rows,
        )
        lines += _speed_lines(checks)
    lines += [
        "## Simulated rows against their real rows",
        "",
        "rel_err = (sim - real) / real, real and sim = the means over repeats. Bounds (issue "
        f"19's real-engine targets): every p50 within {FIDELITY_BOUND:.0%}, every p99 within "
        f"{FIDELITY_BOUND_P99:.0%}, attainment within {FIDELITY_BOUND_POINTS:g} points; "
        "preemptions and cached prompt tokens are shown, not judged.",
        "",
    ]
    if not fid.empty:
        for sim_engine, part in fid.groupby("sim_engine", sort=False):
            n_in, n_judged = within_count(part)
            rel = part[[fidelity_bound(m)[0] == "rel" for m in part["metric"]]]
            worst = rel.loc[rel["rel_err"].abs().fillna(-1).idxmax()] if len(rel) else None
            text = f"- `{sim_engine}`: within its bound on {n_in} of {n_judged} rows"
            if worst is not None:
                text += (
                    f"; worst {worst.policy} at {worst.load:g} req/s, {worst.slo_class} "
                    f"{worst.metric}: sim {worst.sim:.3g} vs real {worst.real:.3g} "
                    f"(rel_err {worst.rel_err:+.2f})"
                )
            lines.append(text + ".")
        lines.append("")
        rows = [
            [
                f"`{r.sim_engine}`",
                r.policy,
                f"{r.load:g}",
                r.slo_class,
                r.metric,
                f"{r.real:.4g}",
                f"{r.sim:.4g}",
                f"{r.rel_err:+.2f}",
                f"{r.abs_err:+.3f}" if r.metric == "slo_attainment" else _fmt(r.abs_err, 1),
                r.bound,
                "–" if pd.isna(r.within) else ("yes" if r.within else "no"),
            ]
            for r in fid.itertuples()
        ]
        head = ["sim", "policy", "load", "class", "metric", "real", "sim", "rel_err", "abs_err"]
        lines += _table([*head, "bound", "within"], rows)
    for sim in SIM_OF:
        fit = meta.get("engines", {}).get(sim)
        if fit:
            coef = fit["coefficients"]
            per_seq = coef.get("num_seqs", 0.0)
            per_kv = coef.get("kv_tokens", 0.0)
            spill = fit.get("kv_spill") or {}
            lines += [
                f"`{sim}` step time: {coef['intercept'] * 1e3:.2f} ms + "
                f"{coef['num_tokens'] * 1e3:.3f} ms per token of the step"
                + (f" + {per_seq * 1e3:.2f} ms per sequence" if per_seq else "")
                + (f" + {per_kv * 1e3:.4f} ms per key token" if per_kv else "")
                + (
                    f" + {spill['s_per_token'] * 1e3:.4f} ms per key token of a step past "
                    f"{spill['threshold_tokens']:,.0f} (the spill)"
                    if spill
                    else ""
                )
                + f" (every term: {SIM_OF[sim]}_step_time.json), from the {fit['source']}.",
                "",
            ]
    lines += [
        "![attainment vs load](attainment_vs_load.png)",
        "",
        "Chat SLO attainment vs load, one panel per engine; bars: min-max over repeats.",
        "",
    ]
    return "\n".join(lines)


def _plot(agg: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chat = agg[(agg["slo_class"] == "chat") & (agg["metric"] == "slo_attainment")]
    engines = list(chat["engine"].unique())
    fig, axes = plt.subplots(
        1,
        max(len(engines), 1),
        figsize=(3.4 * max(len(engines), 1), 3.2),
        squeeze=False,
        sharey=True,
    )
    for ax, engine in zip(axes[0], engines, strict=False):
        for policy, g in chat[chat["engine"] == engine].groupby("policy", sort=False):
            g = g.sort_values("load")
            err = [(g["mean"] - g["min"]).clip(lower=0), (g["max"] - g["mean"]).clip(lower=0)]
            ax.errorbar(
                g["load"],
                g["mean"],
                yerr=err,
                marker="o",
                capsize=3,
                label=policy,
                linestyle="--" if ":" in engine else "-",
            )
        ax.set_title(engine)
        ax.set_xlabel("load, req/s")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("chat SLO attainment")
    fig.tight_layout()

    def save(tmp: Path) -> None:
        fig.savefig(tmp, format="png", dpi=110)

    write_atomic(path, save)
    plt.close(fig)


#: Files the suite owns in its directory.
OWNED = (
    "summary.csv",
    "aggregate.csv",
    "lone.csv",
    "checks.csv",
    "fidelity.csv",
    "host_speed.csv",
    "sglang_step_time.json",
    "hf_step_time.json",
    "attainment_vs_load.png",
    "steps.parquet",
    "requests.parquet",
    "report.md",
    "manifest.json",
)


def _speed_lines(checks: pd.DataFrame) -> list[str]:
    """The checks' host speeds as one sentence (none without them)."""
    known = checks.dropna(subset=["native_host_speed", "superinfer_host_speed"])
    if known.empty:
        return []
    pairs = "; ".join(
        f"`{r.engine}` {r.load:g} req/s: {r.native_host_speed:.3f} / {r.superinfer_host_speed:.3f}"
        for r in known.itertuples()
    )
    return [
        "Host speed of the runs compared (each run's step time over the step-log fit's, mean "
        "over repeats; 1.10: 10 % slower; native / superinfer; `host_speed.csv`): "
        f"{pairs}.",
        "",
    ]


def _chat_ttft(meta: Mapping[str, Any]) -> str:
    """The chat TTFT target as the header states it: one absolute target on every engine, or
    each engine's own (``suite.chat_ttft_x``, the manifest's ``engines`` facts)."""
    opts = meta.get("options", {})
    if not opts.get("chat_ttft_x"):
        return f"{opts.get('chat_ttft_ms'):g} ms on every engine"
    own = [
        f"`{engine}` {facts['chat_ttft_ms']:,.0f} ms = {facts.get('chat_ttft_source', '?')}"
        for engine, facts in meta.get("engines", {}).items()
        if "chat_ttft_ms" in facts
    ]
    each = "; ".join(own) or "no engine's lone pass ran"
    x = opts["chat_ttft_x"]
    return f"{x:g}x each engine's own lone chat TTFT ({each}; a sim row: its real engine's)"


def write_engines(
    out_dir: Path,
    summary: pd.DataFrame,
    lone: pd.DataFrame,
    info: dict[str, Any],
    natives: dict[str, str],
    command: list[str],
    machine: str = "",
    steps: pd.DataFrame | None = None,
    requests: pd.DataFrame | None = None,
) -> str:
    """Write every file of :data:`OWNED` (staged) and ``MANIFEST.md``; the files, as text.
    ``steps``: the real runs' step logs (``suites_engines.collect_step_logs``), written as
    ``steps.parquet`` when there are any; ``requests``: every run's requests
    (``EnginesResult.requests``), written as ``requests.parquet`` when there are any."""
    speeds = host_speed_table(info)
    meta = manifest(info, command=command)
    agg = aggregate(summary)
    checks, fid = policy_checks(agg, natives, speeds), fidelity(agg)
    written = []
    with staged_dir(out_dir, owned=(*OWNED, "MANIFEST.md")) as stage:
        frames = {
            "summary.csv": summary,
            "aggregate.csv": agg,
            "lone.csv": lone,
            "checks.csv": checks,
            "fidelity.csv": fid,
            **({"host_speed.csv": speeds} if not speeds.empty else {}),
        }
        for name, frame in frames.items():

            def to_csv(p: Path, f: pd.DataFrame = frame) -> None:
                f.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT)

            write_atomic(stage / name, to_csv)
            written.append(name)
        for name, table in (("steps.parquet", steps), ("requests.parquet", requests)):
            if table is not None and not table.empty:

                def to_parquet(p: Path, f: pd.DataFrame = table) -> None:
                    f.to_parquet(p, index=False)

                write_atomic(stage / name, to_parquet)
                written.append(name)
        for sim, real in SIM_OF.items():  # the fits run_engines wrote as <real>_step_time.json
            fit = info.get("engines", {}).get(sim)
            if fit:
                (stage / f"{real}_step_time.json").write_text(json.dumps(fit, indent=2) + "\n")
                written.append(f"{real}_step_time.json")
        try:  # a plot or report bug must not lose the measured tables
            if not agg.empty:
                _plot(agg, stage / "attainment_vs_load.png")
                written.append("attainment_vs_load.png")
            report = render_engines_report(summary, agg, lone, checks, fid, meta)
        except Exception as exc:  # noqa: BLE001
            report = f"# report failed\n\n{type(exc).__name__}: {exc}\n"
        (stage / "report.md").write_text(report, encoding="utf-8")
        (stage / "manifest.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
        written += ["report.md", "manifest.json"]
        sha = str(meta.get("git_sha") or "0000000")
        short = sha[:7] + ("-dirty" if sha.endswith("-dirty") else "")
        date = str(meta["created_utc"])[:16].replace("T", " ")
        where = machine or f"{platform.node()} ({meta['host']['cpu_count']} cores)"
        cmd = " ".join(command)
        rows = [
            f"| `{f}` | `{cmd}` | `{short}` | {where} | {date} | `manifest.json` |"
            for f in sorted(written)
        ]
        (stage / "MANIFEST.md").write_text(
            "# results/engines-cpu: manifest\n\nColumns: the command that made the file (from "
            "the repository root), the git sha it ran at, the machine, the date (UTC) and where "
            "those facts come from.\n\n| file | command | git sha | machine | date (UTC) | "
            "source |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n",
            encoding="utf-8",
        )
    return ", ".join(written + ["MANIFEST.md"])
