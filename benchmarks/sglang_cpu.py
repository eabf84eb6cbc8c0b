"""The real SGLang server on CPU: ``superinfer`` vs SGLang's own scheduling at this engine's knee.

Runs the ``sglang-cpu-mix`` workload (short chat prompts beside long batch prompts, Poisson
arrivals; :func:`cpu_mix_workload`) on a fresh ``sglang.launch_server`` per policy and repeat
(``harness/engines/sglang.py``: CPU recipe, tiny-Llama fixture, ``--chunked-prefill-size 512
--context-length 1024``), replayed through the ``http`` engine with ``--backend sglang``, and writes
one run directory per repeat (``OUT/repeat-N/``: summary.csv, requests.parquet, manifest.json with
the plugin's counters, report.md) and ``OUT/aggregate.csv`` (mean, min, max and sample standard
deviation over the repeats of every summary metric)::

    PYTHONPATH=src SUPERINFER_SGLANG_FIXTURE=/tmp/sgfix .venv/bin/python benchmarks/sglang_cpu.py \
        --policies native,superinfer --repeats 3 --out results/sglang-cpu

Repeats interleave the policies (native, superinfer, native, ...) so that a slow spell of a shared
machine lands on both. Every server log is tailed to its last ``--log-tail`` lines next to the run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from superinfer.adapters.sglang.server import exit_on_sigterm
from superinfer.harness.bench import run_bench
from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.engines.sglang import SGLANG_ENGINE
from superinfer.harness.report.markdown import as_written, render_markdown, write_plots
from superinfer.harness.report.results import manifest, write_run
from superinfer.harness.workload.workload import Source, Workload
from superinfer.policy_core.types import SLO
from superinfer.sim.request import RequestSpec

#: Unloaded latency of this engine, measured on the 2-core VM with a lone request
#: (results/sglang-cpu/report.md, "Unloaded latency"): TTFT of a 96-token prompt, and the decode
#: step of one request. The SLOs below are multiples of these.
UNLOADED_SHORT_TTFT_MS = 100.0
UNLOADED_TPOT_MS = 5.0
#: Chat: TTFT <= 5x a lone short prompt's, TPOT <= 5x a lone decode step (room for a few prefill
#: chunks run between its decode steps).
CHAT_SLO = SLO("chat", ttft_ms=5 * UNLOADED_SHORT_TTFT_MS, tpot_ms=5 * UNLOADED_TPOT_MS, priority=0)
#: Batch: done within 120 s of arrival (a lone long request takes ~0.5-1.8 s).
BATCH_SLO = SLO("batch", deadline_s=120.0, priority=1)

#: Token ranges (inclusive) of each class: chat prompts and outputs are short; batch prompts reach
#: the server's 1024-token context with their output (two chunks of 512 at most).
CHAT_PROMPT = (32, 160)
CHAT_OUTPUT = (32, 64)
BATCH_PROMPT = (600, 900)
BATCH_OUTPUT = (64, 112)


def cpu_mix_workload(
    *, chat_rps: float, batch_rps: float, duration_s: float, seed: int
) -> Workload:
    """The ``sglang-cpu-mix`` requests: two Poisson streams on one clock.

    Args:
        chat_rps: chat arrivals per second.
        batch_rps: batch arrivals per second.
        duration_s: arrival window, s.
        seed: seed of every draw (arrivals and lengths, per class).

    Returns:
        The workload, requests in arrival order, ids ``chat-I`` / ``batch-I``.
    """
    specs: list[RequestSpec] = []
    for k, (slo, rps, prompt, output) in enumerate(
        (
            (CHAT_SLO, chat_rps, CHAT_PROMPT, CHAT_OUTPUT),
            (BATCH_SLO, batch_rps, BATCH_PROMPT, BATCH_OUTPUT),
        )
    ):
        rng = np.random.default_rng([seed, k])
        t = 0.0
        i = 0
        while True:
            t += float(rng.exponential(1.0 / rps))
            if t >= duration_s:
                break
            out = int(rng.integers(output[0], output[1] + 1))
            specs.append(
                RequestSpec(
                    request_id=f"{slo.name}-{i}",
                    arrival_s=round(t, 3),
                    prompt_tokens=int(rng.integers(prompt[0], prompt[1] + 1)),
                    output_tokens=out,
                    max_output_tokens=out,
                    slo=slo,
                    source=slo.name,
                )
            )
            i += 1
    specs.sort(key=lambda s: (s.arrival_s, s.request_id))
    sources = (
        Source("chat", "synthetic", CHAT_SLO, CHAT_OUTPUT[1]),
        Source("batch", "synthetic", BATCH_SLO, BATCH_OUTPUT[1]),
    )
    details = {
        "generator": "benchmarks/sglang_cpu.py::cpu_mix_workload",
        "seed": seed,
        "chat": {"rps": chat_rps, "prompt": CHAT_PROMPT, "output": CHAT_OUTPUT},
        "batch": {"rps": batch_rps, "prompt": BATCH_PROMPT, "output": BATCH_OUTPUT},
        "slo_basis": {
            "unloaded_short_ttft_ms": UNLOADED_SHORT_TTFT_MS,
            "unloaded_tpot_ms": UNLOADED_TPOT_MS,
            "chat": "ttft 5x unloaded short TTFT, tpot 5x unloaded decode step",
        },
    }
    return Workload("sglang-cpu-mix", tuple(specs), sources, 1.0, duration_s, details=details)


def _tail(path: Path, lines: int) -> None:
    text = path.read_text(errors="replace").splitlines()
    path.write_text("\n".join(text[-lines:]) + "\n")


def run_one(
    policy: str,
    wl: Workload,
    out: Path,
    *,
    seed: int,
    sglang_args: str,
    policy_opts: Sequence[str],
    adapter_config: str | None,
    log_tail: int,
) -> pd.DataFrame:
    """One policy on a fresh server; writes ``out`` (a run directory); returns its summary."""
    out.mkdir(parents=True, exist_ok=True)
    config = BenchConfig(
        engines=(SGLANG_ENGINE,),
        policies=(policy,),
        policy_options={policy: dict(o.split("=", 1) for o in policy_opts)},
        seed=seed,
        model="tiny-llama (dummy weights)",
        gpu="cpu",
        tp=1,
        replicas=1,
        engine_options={
            "sglang_args": sglang_args,
            "sglang_log_dir": str(out),
            **({"sglang_config": adapter_config} if adapter_config else {}),
        },
        backend="sglang",
    )
    result = run_bench(config, workload=wl)
    meta = manifest(result.info)
    plots = write_plots(out, result.summary, result.requests, result.timeline, meta)
    report = render_markdown(as_written(result.summary), meta, plots)
    write_run(out, result.summary, result.requests, meta, report, result.timeline, result.steps)
    for log in out.glob("sglang-*.log"):
        _tail(log, log_tail)
    return result.summary


def aggregate(summaries: pd.DataFrame) -> pd.DataFrame:
    """Mean, min, max and sample std over repeats of every numeric summary column, per
    (engine, policy, slo_class)."""
    keys = ["engine", "policy", "slo_class"]
    numeric = [c for c in summaries.columns if c not in (*keys, "repeat")]
    numeric = [c for c in numeric if pd.api.types.is_numeric_dtype(summaries[c])]
    rows = []
    for key, grp in summaries.groupby(keys, sort=False):
        for col in numeric:
            vals = grp[col].astype(float)
            rows.append(
                {
                    **dict(zip(keys, key, strict=True)),
                    "metric": col,
                    "n": int(vals.notna().sum()),
                    "mean": vals.mean(),
                    "min": vals.min(),
                    "max": vals.max(),
                    "std": vals.std(ddof=1) if len(vals) > 1 else math.nan,
                }
            )
    return pd.DataFrame(rows)


#: Files of a run directory that are committed (plots, parquet and the stats file stay local).
KEPT = ("summary.csv", "metrics.csv", "manifest.json", "report.md")


def write_manifests(out: Path, command: str, sha: str, machine: str, date: str) -> None:
    """``MANIFEST.md`` in ``out`` and in every run directory under it: one row per kept file
    (tests/test_results_manifests.py), uncommitted outputs removed."""
    row = "| `{f}` | `{c}` | `{s}` | {m} | {d} | {src} |"
    head = (
        "# {title}: manifest\n\nColumns: the command that made the file (from the repository "
        "root), the git sha it ran at, the machine, the date (UTC) and where those facts come "
        "from.\n\n| file | command | git sha | machine | date (UTC) | source |\n"
        "|---|---|---|---|---|---|\n"
    )
    for run in sorted(p for p in out.glob("repeat-*/*") if p.is_dir()):
        for f in run.iterdir():
            if f.is_file() and f.name not in KEPT and not f.name.endswith(".log"):
                f.unlink()
        for log in run.glob("sglang-*.log"):
            log.rename(log.with_suffix(".log.tail"))
        meta = json.loads((run / "manifest.json").read_text())
        full = str(meta.get("git_sha", sha))
        rsha = full[:7] + ("-dirty" if full.endswith("-dirty") else "")
        lines = [
            row.format(f=f.name, c=command, s=rsha, m=machine, d=date, src="`manifest.json`")
            if not f.name.endswith(".tail")
            else row.format(
                f=f.name, c=command, s=rsha, m=machine, d=date,
                src="the server's log, last lines (`--log-tail`)",
            )
            for f in sorted(run.iterdir())
            if f.name != "MANIFEST.md"
        ]  # fmt: skip
        title = f"results/{run.relative_to(out.parent)}"
        (run / "MANIFEST.md").write_text(head.format(title=title) + "\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="native,superinfer")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/sglang-cpu")
    ap.add_argument("--chat-rps", type=float, default=0.5)
    ap.add_argument("--batch-rps", type=float, default=0.45)
    ap.add_argument("--duration-s", type=float, default=180.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sglang-args", default="")
    ap.add_argument("--policy-opt", action="append", default=[])
    ap.add_argument("--adapter-config", default=None, help="SUPERINFER_CONFIG JSON file")
    ap.add_argument("--log-tail", type=int, default=200)
    ap.add_argument("--dry-run", action="store_true", help="print the workload and stop")
    args = ap.parse_args(argv)
    wl = cpu_mix_workload(
        chat_rps=args.chat_rps, batch_rps=args.batch_rps, duration_s=args.duration_s, seed=args.seed
    )
    by = pd.Series([s.slo.name for s in wl.requests]).value_counts().to_dict()
    print(f"sglang-cpu-mix: {len(wl.requests)} requests {by}", flush=True)
    if args.dry_run:
        return 0
    out = Path(args.out)
    frames = []
    for rep in range(args.repeats):
        for policy in args.policies.split(","):
            begin = time.monotonic()
            summary = run_one(
                policy,
                wl,
                out / f"repeat-{rep}" / policy,
                seed=args.seed,
                sglang_args=args.sglang_args,
                policy_opts=args.policy_opt,
                adapter_config=args.adapter_config,
                log_tail=args.log_tail,
            )
            summary.insert(0, "repeat", rep)
            frames.append(summary)
            pd.concat(frames).to_csv(out / "summary.csv", index=False)
            chat = summary[summary["slo_class"] == "chat"].iloc[0]
            print(
                f"repeat {rep} {policy}: chat attainment {chat['slo_attainment']:.3f} "
                f"ttft p99 {chat['ttft_p99_ms']:.0f} ms ({time.monotonic() - begin:.0f} s)",
                flush=True,
            )
    aggregate(pd.concat(frames)).to_csv(out / "aggregate.csv", index=False)
    json.dump({"argv": sys.argv[1:]}, (out / "args.json").open("w"))
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    raise SystemExit(main())
