"""The ``superinfer`` command."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from superinfer.adapters.manager import UnknownPolicyError, available_policies
from superinfer.harness.errors import UserError
from superinfer.policy_core.validation import PolicyError

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console

    from superinfer.harness.bench import BenchConfig

__all__ = ["cli", "main"]

DEFAULT_OUT = Path("results/default")
#: Run directory of a bench on the real CPU engine (and its simulator profile) only.
HF_OUT = Path("results/hf")
#: Run directory of a bench of a live server (engine http) only.
HTTP_OUT = Path("results/http")


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


def _key_values(pairs: tuple[str, ...], flag: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint=flag)
        out[key.strip()] = value.strip()
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="superinfer")
def cli() -> None:
    """superinfer: an SLO-aware policy layer for LLM inference engines, and its benchmark."""


@cli.command()
@click.option(
    "--workload",
    default=None,
    help="Workload spec: a built-in name (azure-mixed, mooncake-chat, sharegpt-poisson; "
    "`superinfer workloads` lists them) or a path to a TOML spec (docs/workloads.md). A spec's "
    "[bench] table sets defaults for --model/--gpu/--tp/--replicas/--engines/--policies; options "
    "given here win.  [default: azure-mixed]",
)
@click.option(
    "--trace",
    default=None,
    help="Instead of --workload: azure (conv=chat + code=batch; the same requests as "
    "azure-mixed), azure-conv, azure-code, or a path to a CSV in the Azure trace format.",
)
@click.option(
    "--engines",
    "--engine",
    "engines",
    default="sim:vllm",
    show_default=True,
    help="Comma-separated engine ids; each runs every policy.",
)
@click.option(
    "--model",
    default="llama-3.1-70b",
    show_default=True,
    help="Model: llama-3.1-8b or llama-3.1-70b.",
)
@click.option(
    "--gpu", default="a100-80gb", show_default=True, help="GPU: a100-80gb, h100-80gb or h200."
)
@click.option(
    "--tp",
    default=4,
    show_default=True,
    type=int,
    help="Tensor-parallel degree (GPUs per replica).",
)
@click.option(
    "--replicas",
    default=4,
    show_default=True,
    type=int,
    help="Replicas behind the router.",
)
@click.option(
    "--router",
    default="round_robin",
    show_default=True,
    type=click.Choice(["round_robin", "least_tokens", "slo_aware", "cache_aware"]),
    help="How arrivals are spread over replicas.",
)
@click.option(
    "--cpu-kv-ratio",
    default=None,
    type=float,
    help="CPU-tier KV capacity as a multiple of HBM KV capacity [default: the engine profile's; "
    "0 disables swap and prefix offload].",
)
@click.option(
    "--kv-policy",
    default=None,
    help="Prefix-cache placement policy: lru, lfu or reuse (the learned reuse predictor) "
    "[default: the engine's own eviction order].",
)
@click.option(
    "--kv-quant/--no-kv-quant",
    default=False,
    show_default=True,
    help="Per-request KV precision from the quantization planner (fp16 -> int8 -> int4 under "
    "memory pressure, chat never below int8); off: every request stores FP16 KV.",
)
@click.option(
    "--kv-quant-opt",
    "kv_quant_opts",
    multiple=True,
    metavar="KEY=VALUE",
    help="With --kv-quant: a planner setting, repeatable (int8_pressure, int4_pressure, "
    "hysteresis, floors such as 'chat=int8,batch=int4', default_floor, count_waiting; "
    "docs/kv_quant.md).",
)
@click.option(
    "--policies",
    default=None,
    help="Comma-separated policy names [default: every registered policy].",
)
@click.option(
    "--rate-scale",
    default=None,
    type=float,
    help="Arrival-rate multiplier (2 = twice the trace's request rate) "
    "[default: 1; 0.05 with engine hf or sim:hf-cpu].",
)
@click.option(
    "--duration-s",
    default=None,
    type=float,
    help="Keep only the first DURATION_S seconds (after rate scaling) "
    "[default: all; 200 with engine hf or sim:hf-cpu].",
)
@click.option(
    "--start-s",
    default=None,
    type=float,
    help="Skip the trace's first START_S seconds (before rate scaling) "
    "[default: 0; 100 with engine hf or sim:hf-cpu].",
)
@click.option(
    "--length-scale",
    default=None,
    type=float,
    help="Multiply prompt and output lengths by this factor "
    "[default: 1; 0.125 with engine hf or sim:hf-cpu].",
)
@click.option(
    "--max-prompt-tokens",
    default=None,
    type=int,
    help="Cap prompt lengths after scaling [default: none; 256 with engine hf or sim:hf-cpu].",
)
@click.option(
    "--max-output-tokens",
    default=None,
    type=int,
    help="Cap output lengths after scaling [default: none; 64 with engine hf or sim:hf-cpu].",
)
@click.option(
    "--engine-option",
    "engine_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Engine setting, repeatable (hf, sim:hf-cpu: num_blocks, max_batch_tokens, "
    "max_num_seqs, page_size_tokens, num_threads, drain_s, stall_s, step_time_file; http: "
    "endpoint, model, prompt, timeout_s, connect_timeout_s, retries, retry_backoff_s, "
    "max_connections, send_slo, send_priority, eos_token_ids, exact_output, include_usage).",
)
@click.option(
    "--url",
    default=None,
    help="engine http: base URL of the OpenAI-compatible server to benchmark "
    "(http://127.0.0.1:8000).",
)
@click.option(
    "--backend",
    default="openai",
    show_default=True,
    type=click.Choice(["sglang", "vllm", "trtllm", "openai"]),
    help="engine http: the server's kind, which sets how SLO, priority and forced output "
    "lengths are sent (docs/serve.md).",
)
@click.option(
    "--policy-opt",
    "policy_opt",
    multiple=True,
    metavar="[POLICY.]KEY=VALUE",
    help="Policy hyperparameter; repeatable. KEY=VALUE sets it on every selected policy that "
    "has it, POLICY.KEY=VALUE on that policy only (list them: superinfer policies --options).",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of every random choice.")
@click.option(
    "--out",
    default=None,
    type=click.Path(),
    help=f"Run directory to write [default: {DEFAULT_OUT}; {HF_OUT} when every engine is hf "
    f"or sim:hf-cpu; {HTTP_OUT} when every engine is http].",
)
@click.option(
    "--suite",
    type=click.Choice(["headline", "rotation"]),
    default=None,
    help="Run a fixed experiment instead of one run. headline: every policy on every engine "
    "over a load sweep (defaults: the seven headline policies, --rate-scale 0.7 as the headline "
    "load) -> results/headline/. rotation: superinfer with rotation through HBM on and off "
    "(needs an engine with a CPU KV tier; defaults: --trace azure-conv, --replicas 1, "
    "--duration-s 600) -> results/rotation/.",
)
@click.option(
    "--rate-scales",
    default=None,
    help="--suite headline: comma-separated loads of the sweep [default: 0.3,0.6,0.8,1.0,1.3,1.6].",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=int,
    help="--suite headline: processes running its loads x engines in parallel (the tables do "
    "not depend on it).",
)
@click.pass_context
def bench(
    ctx: click.Context,
    workload: str | None,
    trace: str | None,
    engines: str,
    model: str,
    gpu: str,
    tp: int,
    replicas: int,
    router: str,
    cpu_kv_ratio: float | None,
    kv_quant: bool,
    kv_quant_opts: tuple[str, ...],
    kv_policy: str | None,
    policies: str | None,
    rate_scale: float | None,
    duration_s: float | None,
    start_s: float | None,
    length_scale: float | None,
    max_prompt_tokens: int | None,
    max_output_tokens: int | None,
    engine_options: tuple[str, ...],
    url: str | None,
    backend: str,
    policy_opt: tuple[str, ...],
    seed: int,
    out: str | None,
    suite: str | None,
    rate_scales: str | None,
    workers: int,
) -> None:
    """Run a workload on an engine under each policy; write the run directory and print the table.

    With no options: the azure-mixed workload (Azure 2023 conv as chat + code as batch, one
    hour) on a simulated Llama-3.1-70B, A100-80GB, TP4, 4 replicas, for every registered
    policy -> results/default/ (tables, report.md and PNG plots). With --engine hf: a 200 s
    slice of the same mix, slowed and shortened to what 2 CPU cores serve, replayed in real
    time on SmolLM2-135M -> results/hf/. With --engine http --url URL: the workload replayed
    in real time against a running OpenAI-compatible server -> results/http/.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from superinfer.harness.bench import BenchConfig, build_bench_workload, run_bench
    from superinfer.harness.engines.registry import default_source, run_dir, shaping_defaults
    from superinfer.harness.report.markdown import as_written, render_markdown, write_plots
    from superinfer.harness.report.results import manifest, write_run
    from superinfer.harness.workload.specs import load_workload_spec

    own = _suite_defaults(ctx, suite, workload is not None or trace is not None) if suite else {}
    trace = own.get("trace", trace)
    workload = own.get("workload", workload)
    rate_scale = own.get("rate_scale", rate_scale)
    duration_s = own.get("duration_s", duration_s)
    if workload is not None and trace is not None:
        raise UserError("give --workload or --trace, not both")
    if kv_quant_opts and not kv_quant:
        raise UserError("--kv-quant-opt needs --kv-quant")
    options: dict[str, Any] = {
        "model": model,
        "gpu": gpu,
        "tp": tp,
        "replicas": replicas,
        "router": router,
        "engines": engines,
        "policies": policies,
    }
    if workload is not None:
        for key, value in load_workload_spec(workload).bench.items():
            if ctx.get_parameter_source(key) == click.core.ParameterSource.DEFAULT:
                options[key] = value
    options.update({k: v for k, v in own.items() if k in options})
    engine_ids = _split(options["engines"])
    if trace is None and workload is None:
        # the real CPU engine replays a shaped slice of the Azure trace (engines.registry)
        kind, name = default_source(engine_ids)
        trace, workload = (name, None) if kind == "trace" else (None, name)
    given = {
        "rate_scale": rate_scale,
        "duration_s": duration_s,
        "start_s": start_s,
        "length_scale": length_scale,
        "max_prompt_tokens": max_prompt_tokens,
        "max_output_tokens": max_output_tokens,
    }
    shaping = shaping_defaults(engine_ids)
    shaping.update({k: v for k, v in given.items() if v is not None})
    config = BenchConfig(
        trace=trace or "azure",
        engines=engine_ids,
        model=options["model"],
        gpu=options["gpu"],
        tp=options["tp"],
        replicas=options["replicas"],
        router=options["router"],
        cpu_kv_ratio=cpu_kv_ratio,
        kv_quant=kv_quant,
        kv_quant_options=_key_values(kv_quant_opts, "--kv-quant-opt"),
        kv_policy=kv_policy,
        policies=_split(options["policies"]),
        policy_opts=policy_opt,
        seed=seed,
        workload=workload,
        engine_options=_key_values(engine_options, "--engine-option"),
        url=url,
        backend=backend,
        **shaping,
    )
    console = Console(stderr=True)
    if suite is not None:
        _run_suite(suite, config, Path(out or f"results/{suite}"), rate_scales, workers, console)
        return
    with console.status(f"loading workload {workload or trace}"):
        wl = build_bench_workload(config)
    if console.is_terminal:
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} runs"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("simulating", total=None)

            def on_cell(done: int, total: int, label: str) -> None:
                text = f"{label}: {len(wl.requests)} requests"
                bar.update(task, completed=done, total=total, description=text)

            result = run_bench(config, workload=wl, on_cell=on_cell)
    else:  # piped or captured: no bars, nothing to clean up
        result = run_bench(config, workload=wl)
    meta = manifest(result.info)
    out_dir = Path(out) if out is not None else Path(run_dir(engine_ids))
    with console.status("drawing plots"):
        plots = write_plots(out_dir, result.summary, result.requests, result.timeline, meta)
    report = render_markdown(as_written(result.summary), meta, plots)
    write_run(out_dir, result.summary, result.requests, meta, report, result.timeline, result.steps)
    _print_table(as_written(result.summary))
    extra = ", steps.parquet" if not result.steps.empty else ""
    console.print(
        f"wrote {out_dir}/ (summary.csv, metrics.csv, requests.parquet, timeline.parquet{extra}, "
        f"manifest.json, report.md, {len(plots)} plots)"
    )


def _calibrate_hf(
    engine_options: tuple[str, ...], seed: int, steps_file: str | None, out: str
) -> None:
    """Measure real engine steps and fit the sim:hf-cpu step-time model.

    Runs closed batches of real ShareGPT prompts through the engine, records every step's shape
    and wall time, fits the model of sim/hf_cpu.py and writes the coefficients, the fit error
    and the engine's per-step profile. Use the file with
    `superinfer bench --engine sim:hf-cpu --engine-option step_time_file=PATH`.
    """
    import json

    import pandas as pd

    from superinfer.harness.offline.calibrate_hf import calibrate_hf, fit_steps
    from superinfer.harness.report.results import manifest, write_atomic

    path = Path(out)
    if steps_file is None:
        model, report, steps = calibrate_hf(
            _key_values(engine_options, "--engine-option"), seed=seed
        )
    else:
        source = Path(steps_file)
        try:
            steps = pd.read_parquet(source) if source.suffix == ".parquet" else pd.read_csv(source)
        except (OSError, ValueError) as exc:
            raise UserError(f"{source}: cannot read recorded steps ({exc})") from None
        model, report = fit_steps(steps)
        report["steps_from"] = str(source)
        try:
            previous = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except ValueError:
            previous = {}
        for key in ("grid", "engine", "model", "dtype", "torch_threads", "wall_s", "step_profile"):
            if key in previous:  # what the measurement the steps came from recorded
                report[key] = previous[key]
    meta = manifest({"config": {"seed": seed}})
    doc = {**report, "git_sha": meta["git_sha"], "host": meta["host"], "command": meta["command"]}
    text = json.dumps(doc, indent=2) + "\n"

    def write_doc(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    write_atomic(path, write_doc)
    steps_path = path.with_name(path.stem + "_steps.csv")
    write_atomic(steps_path, lambda p: steps.to_csv(p, index=False, float_format="%.6g"))
    fit = report["fit"]
    click.echo(
        f"fitted on {fit['num_samples']} steps: mean |rel err| {fit['mean_abs_rel_err']:.3f}, "
        f"p90 {fit['p90_abs_rel_err']:.3f}"
    )
    for name, value in model.to_dict().items():
        click.echo(f"  {name:12s} {value:.6g} s")
    click.echo(f"wrote {path} and {steps_path}")


def _suite_defaults(ctx: click.Context, suite: str, workload_given: bool) -> dict[str, Any]:
    """The suite's own defaults for the ``bench`` options the user did not give.

    headline: the Azure hour (conv = chat, code = batch) at the headline load with the seven
    headline policies. rotation: superinfer alone on Mooncake-length chat with fewer replicas
    than the spec's, so live KV exceeds HBM (``harness.suites.ROTATION_DEFAULTS``).
    """
    from click.core import ParameterSource

    from superinfer.harness.suites import (
        HEADLINE_POLICIES,
        HEADLINE_RATE_SCALE,
        ROTATION_DEFAULTS,
    )

    own: dict[str, Any] = {}
    if suite == "headline":
        own.update(rate_scale=HEADLINE_RATE_SCALE, policies=",".join(HEADLINE_POLICIES))
        if not workload_given:
            own["trace"] = "azure"
    else:
        own.update(ROTATION_DEFAULTS)
        if workload_given:
            own.pop("workload", None)
    default = ParameterSource.DEFAULT
    return {
        name: value
        for name, value in own.items()
        if name in ("trace", "workload") or ctx.get_parameter_source(name) is default
    }


def _run_suite(
    suite: str,
    config: BenchConfig,
    out_dir: Path,
    rate_scales: str | None,
    workers: int,
    console: Console,
) -> None:
    import json

    from superinfer.harness.report.results import manifest
    from superinfer.harness.suites import (
        SWEEP_RATE_SCALES,
        run_headline,
        run_rotation,
        write_csv,
        write_headline,
        write_text,
    )

    if suite == "headline":
        try:
            rates = tuple(float(r) for r in _split(rate_scales)) or SWEEP_RATE_SCALES
        except ValueError:
            raise UserError(f"--rate-scales {rate_scales!r}: expected numbers like 0.5,1") from None
        with console.status("running") as status:
            result = run_headline(
                config, rate_scales=rates, progress=status.update, workers=workers
            )
        write_headline(out_dir, result, command=sys.argv)
        _print_table(result.summary)
        console.print(
            f"wrote {out_dir}/ (summary.csv, sweep.csv, starvation.csv, sweep.png, "
            "starvation.png, report.md, manifest.json)"
        )
        return
    with console.status("running") as status:
        table = run_rotation(config, progress=status.update)
    write_csv(out_dir / "summary.csv", table)
    meta = manifest({"suite": "rotation", "config": asdict(config)}, command=sys.argv)
    write_text(out_dir / "manifest.json", json.dumps(meta, indent=2, default=str) + "\n")
    click.echo(table.to_string(index=False))
    console.print(f"wrote {out_dir}/ (summary.csv, manifest.json)")


def _print_table(summary: pd.DataFrame) -> None:
    from rich.console import Console
    from rich.table import Table

    from superinfer.harness.report.markdown import TABLE_COLUMNS, format_value

    cols = [c for c in TABLE_COLUMNS if c in summary and c != "e2e_p99_ms"]
    if summary["engine"].nunique() == 1:
        cols.remove("engine")
    table = Table(title=f"engine {summary['engine'].iloc[0]}" if "engine" not in cols else None)
    for c in cols:
        left = c in ("engine", "policy", "slo_class")
        table.add_column(TABLE_COLUMNS[c], justify="left" if left else "right", no_wrap=left)
    for _, row in summary.iterrows():
        table.add_row(*(format_value(row[c], c) for c in cols))
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=160)
    console.print(table)


@cli.command()
@click.option(
    "--engine",
    default="gpu",
    show_default=True,
    help="gpu or hf. gpu: fit the simulated GPU engines' step-time model to the measured "
    "kernel timings in shared/data/profiling; hf: measure the real CPU engine, fit sim:hf-cpu.",
)
@click.option(
    "--engine-option",
    "engine_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="hf: engine setting, repeatable (as for bench).",
)
@click.option(
    "--seed", default=0, show_default=True, type=int, help="hf: seed of the prompt order."
)
@click.option(
    "--steps",
    "steps_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="hf: refit from steps recorded earlier (a *_steps.csv of calibrate, or a run's "
    "steps.parquet) instead of measuring.",
)
@click.option(
    "--out",
    default=None,
    type=click.Path(),
    help="gpu: directory for fit_error.csv, fit_error_by_range.csv, params.json, report.md "
    "[results/calibration]; hf: calibration file, its steps go beside it "
    "[results/hf/step_time_fit.json].",
)
@click.option(
    "--install/--no-install",
    default=True,
    show_default=True,
    help="gpu: also write the parameters into the package (sim/calibration.json), where the "
    "simulator reads them.",
)
def calibrate(
    engine: str,
    engine_options: tuple[str, ...],
    seed: int,
    steps_file: str | None,
    out: str | None,
    install: bool,
) -> None:
    """Fit a step-time model: the simulated GPUs' (default) or the real CPU engine's (hf)."""
    if engine == "hf":
        _calibrate_hf(engine_options, seed, steps_file, out or "results/hf/step_time_fit.json")
    elif engine == "gpu":
        _calibrate_gpu(out or "results/calibration", install)
    else:
        raise UserError(
            f"calibrate fits the simulated GPUs (--engine gpu) or measures the real CPU engine "
            f"(--engine hf), not {engine!r}"
        )


def _calibrate_gpu(out: str, install: bool) -> None:
    """Fit the simulator's step-time model to the measured GPU timings in shared/data/profiling."""
    from superinfer.harness.offline.calibrate import calibrate as run_calibration
    from superinfer.harness.offline.calibrate import params_json, render_report
    from superinfer.harness.report.results import write_atomic

    out_dir = Path(out)
    result = run_calibration()
    text = params_json(result)
    write_atomic(
        out_dir / "fit_error.csv",
        lambda p: result.fit_error.to_csv(p, index=False, float_format="%.5g"),
    )
    write_atomic(
        out_dir / "fit_error_by_range.csv",
        lambda p: result.fit_error_by_range.to_csv(p, index=False, float_format="%.5g"),
    )
    write_atomic(out_dir / "params.json", lambda p: p.write_text(text))
    write_atomic(out_dir / "report.md", lambda p: p.write_text(render_report(result)))
    click.echo(f"wrote {out_dir}/ (fit_error.csv, fit_error_by_range.csv, params.json, report.md)")
    if install:
        import superinfer.sim as sim_pkg

        target = Path(sim_pkg.__file__).parent / "calibration.json"
        write_atomic(target, lambda p: p.write_text(text))
        click.echo(f"wrote {target}")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--engine",
    type=click.Choice(["sglang", "hf"]),
    required=True,
    help="sglang: SGLang's own server with the policy plugged in (CUDA GPU). hf: an "
    "OpenAI-compatible server on the real CPU engine (SmolLM2-135M, transformers continuous "
    "batching) with the policy deciding every step.",
)
@click.option(
    "--policy",
    default=None,
    help="Policy name [sglang: the config's, else fcfs; hf: superinfer if registered, else fcfs].",
)
@click.option(
    "--policy-opt",
    "policy_opts",
    multiple=True,
    metavar="KEY=VALUE",
    help="Policy option; repeatable.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="sglang: adapter configuration (JSON; docs/adapters.md).",
)
@click.option(
    "--host",
    default=None,
    help="Address to bind [hf: 127.0.0.1, this machine only; sglang: passed on as --host].",
)
@click.option(
    "--port", default=None, type=int, help="TCP port [hf: 8000; sglang: passed on as --port]."
)
@click.option(
    "--priority-convention",
    type=click.Choice(["vllm", "sglang"]),
    default="vllm",
    show_default=True,
    help="hf: how a request's `priority` reads: vllm (lower is more urgent) or sglang (higher "
    "is more urgent).",
)
@click.option(
    "--slo-class",
    "slo_classes",
    multiple=True,
    metavar="CLASS:KEY=VALUE[,KEY=VALUE]",
    help="hf: define or change an SLO class (KEY: ttft_ms, tpot_ms, deadline_s, priority; "
    "`none` drops a target). Repeatable. [default classes: chat (TTFT 1000 ms, TPOT 100 ms, "
    "priority 0), batch (deadline 600 s, priority 1)]",
)
@click.option(
    "--default-class",
    default="batch",
    show_default=True,
    help="hf: class of a request that names none.",
)
@click.option(
    "--engine-option",
    "engine_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="hf: engine setting, repeatable (num_blocks, max_batch_tokens, max_num_seqs, "
    "page_size_tokens, num_threads).",
)
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def serve(
    ctx: click.Context,
    engine: str,
    policy: str | None,
    policy_opts: tuple[str, ...],
    config_path: str | None,
    host: str | None,
    port: int | None,
    priority_convention: str,
    slo_classes: tuple[str, ...],
    default_class: str,
    engine_options: tuple[str, ...],
    engine_args: tuple[str, ...],
) -> None:
    """Serve with the policy inside.

    \b
    superinfer serve --engine hf [--policy NAME] [--port P]
        OpenAI-compatible /v1/completions and /v1/chat/completions (SSE streaming), /health,
        /metrics (Prometheus) on the real CPU engine; docs/serve.md.
    superinfer serve --engine sglang -- ARGS
        ARGS go to `python -m sglang.launch_server`; superinfer adds the plugin switches
        (SUPERINFER_SGLANG=1, policy, config), --enable-priority-scheduling and its eviction
        policy. Needs a CUDA GPU.
    """
    if engine == "hf":
        hf_only = ("config_path", "engine_args")
        given = [k for k in hf_only if ctx.params[k]]
        if given:
            raise UserError(
                "serve --engine hf takes no --config and no engine ARGS "
                f"(got {'--config' if given[0] == 'config_path' else ' '.join(engine_args)})"
            )
        _serve_hf(
            policy, policy_opts, host, port, priority_convention, slo_classes, default_class,
            engine_options,
        )  # fmt: skip
        return
    source = click.core.ParameterSource.DEFAULT
    flags = {
        "priority_convention": "--priority-convention",
        "slo_classes": "--slo-class",
        "default_class": "--default-class",
        "engine_options": "--engine-option",
    }
    for name, flag in flags.items():
        if ctx.get_parameter_source(name) != source:
            raise UserError(f"{flag} applies to serve --engine hf only")
    from superinfer.adapters.sglang.config import ConfigError
    from superinfer.adapters.sglang.launch import ServeError, exec_server, launch_command

    passed = tuple(engine_args)
    if host is not None:
        passed += ("--host", host)
    if port is not None:
        passed += ("--port", str(port))
    try:
        argv, env = launch_command(
            passed, policy=policy, policy_opts=policy_opts, config_path=config_path
        )
        exec_server(argv, env)
    except (ConfigError, ServeError) as exc:
        raise click.ClickException(str(exc)) from None


def _serve_hf(
    policy: str | None,
    policy_opts: tuple[str, ...],
    host: str | None,
    port: int | None,
    priority_convention: str,
    slo_classes: tuple[str, ...],
    default_class: str,
    engine_options: tuple[str, ...],
) -> None:
    """``serve --engine hf``: build the configuration, then serve until interrupted."""
    import dataclasses

    from superinfer.harness.engines.hf import hf_options

    try:
        from superinfer.adapters.hf.engine import EngineConfig, ModelNotInstalledError
        from superinfer.adapters.hf.server import DEFAULT_SLO_CLASSES, ServeConfig, serve_forever
    except ImportError as exc:
        raise UserError(
            f"serve --engine hf needs the hf and serve extras ({exc}); run `make install-serve`"
        ) from None
    if policy is None:
        policy = "superinfer" if "superinfer" in available_policies() else "fcfs"
    classes = dict(DEFAULT_SLO_CLASSES)
    keys = ("ttft_ms", "tpot_ms", "deadline_s", "priority")
    for name, changes in _parse_slo(slo_classes, keys=keys, flag="--slo-class").items():
        if "priority" in changes:
            value = changes["priority"]
            if value is None or value != int(value):
                raise UserError(f"--slo-class {name}: priority must be an integer")
            changes["priority"] = int(value)
        base = classes.get(name) or _new_class(name)
        try:
            classes[name] = dataclasses.replace(base, **changes)
        except ValueError as exc:
            raise UserError(f"--slo-class {name}: {exc}") from None
    opts = hf_options(_key_values(engine_options, "--engine-option"))
    try:
        config = ServeConfig(
            host=host or "127.0.0.1",
            port=8000 if port is None else port,
            policy=policy,
            slo_classes=classes,
            default_class=default_class,
            priority_convention=priority_convention,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    engine_config = EngineConfig(
        page_size_tokens=opts.page_size_tokens,
        num_blocks=opts.num_blocks,
        max_batch_tokens=opts.max_batch_tokens,
        max_num_seqs=opts.max_num_seqs,
        num_threads=opts.num_threads,
    )
    try:
        serve_forever(
            config,
            policy_options=_key_values(policy_opts, "--policy-opt"),
            engine_config=engine_config,
            log=lambda line: click.echo(line, err=True),
        )
    except ModelNotInstalledError as exc:
        raise UserError(str(exc)) from None


def _new_class(name: str) -> Any:
    from superinfer.policy_core.types import SLO

    return SLO(name)


@cli.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--out",
    default=None,
    type=click.Path(path_type=Path),
    help="Where to write [default: the run directory itself for one run, results/compare "
    "for several].",
)
@click.option(
    "--sweep",
    default=None,
    type=click.Path(path_type=Path),
    help="A load-sweep CSV (rate_scale, engine, policy, slo_class, slo_attainment) to plot "
    "[default: RUN_DIR/sweep.csv when present].",
)
def report_cmd(run_dirs: tuple[Path, ...], out: Path | None, sweep: Path | None) -> None:
    """Rebuild one run's report.md and plots, or compare several runs side by side."""
    from superinfer.harness.report.markdown import compare_runs, rebuild_report

    if len(run_dirs) == 1:
        written = rebuild_report(run_dirs[0], out_dir=out, sweep=sweep)
    else:
        written = compare_runs(list(run_dirs), out or Path("results/compare"), sweep=sweep)
    click.echo(f"wrote {written}")


@cli.command("workloads")
def list_workloads() -> None:
    """List the built-in workload specs."""
    from superinfer.harness.workload.specs import builtin_specs, parse_spec

    for name, text in builtin_specs().items():
        spec = parse_spec(text, path=f"<built-in {name}>")
        first = spec.description.split(". ")[0].rstrip(".")
        click.echo(f"{name:18s} {first}")


@contextlib.contextmanager
def _progress_bar(console: Any) -> Iterator[Any]:
    """A progress display that shows once its first task is added, and stops on exit."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )
    try:
        yield bar
    finally:
        if bar.live.is_started:
            bar.stop()


def _progress_task(bar: Any, label: str) -> Callable[[int, int, bool], None]:
    bar.start()  # on the first task, so errors found before any cell runs print alone
    task = bar.add_task(label, total=None)

    def update(done: int, total: int, cached: bool) -> None:
        bar.update(task, completed=done, total=total)

    return update


_EXECUTOR_OPTIONS = [
    click.option(
        "--executor",
        default="local",
        show_default=True,
        type=click.Choice(["local", "ray"]),
        help="Run cells in local processes, or as Ray tasks (needs the `ray` extra).",
    ),
    click.option(
        "--address",
        default=None,
        help="Ray cluster address (`auto`, `ray://host:10001`) [default: a local Ray instance "
        "on 127.0.0.1].",
    ),
    click.option(
        "--workers",
        default=None,
        type=int,
        help="Local processes, or CPUs of the local Ray instance [default: all CPUs].",
    ),
    click.option(
        "--fresh",
        is_flag=True,
        help="Ignore cached cells (they are still rewritten).",
    ),
]


def _executor_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_EXECUTOR_OPTIONS):
        fn = option(fn)
    return fn


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@_executor_options
@click.option(
    "--out",
    default=None,
    type=click.Path(file_okay=False),
    help="Output directory [default: the spec's `out`, else results/sweeps/<spec name>].",
)
def sweep(
    spec: str,
    executor: str,
    address: str | None,
    workers: int | None,
    fresh: bool,
    out: str | None,
) -> None:
    """Run a grid of bench cells from SPEC.toml; write sweep.csv (one row per cell x SLO class).

    Cells are cached by a hash of their settings, the workload's files and the code under
    OUT/cells/, so an interrupted sweep resumes where it stopped.
    """
    import json
    import time

    from rich.console import Console

    from superinfer.harness.grid.cells import CellCache, load_workload
    from superinfer.harness.grid.executors import CellRunner
    from superinfer.harness.grid.sweep import load_sweep_spec, sweep_table
    from superinfer.harness.report.results import CSV_FLOAT_FORMAT, manifest, write_atomic

    console = Console(stderr=True)
    parsed = load_sweep_spec(spec)
    cells, notes = parsed.cells()
    for note in notes:
        console.print(f"note: {note}")
    for trace, scale in sorted({(c.trace, c.rate_scale) for c in cells}):
        load_workload(trace, scale)  # a bad trace fails here, once, before any worker starts
    out_dir = Path(out) if out else parsed.out or Path("results/sweeps") / Path(spec).stem
    cache = CellCache(out_dir / "cells", read=not fresh)
    t0 = time.perf_counter()
    with (
        CellRunner(executor, workers=workers, address=address, cache=cache) as runner,
        _progress_bar(console) as bar,
    ):
        outcomes = runner.run(cells, _progress_task(bar, f"sweep {len(cells)} cells"))
    table = sweep_table(cells, outcomes)
    write_atomic(
        out_dir / "sweep.csv",
        lambda p: table.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT),
    )
    meta = manifest(
        {
            "config": {"spec": str(spec), "executor": executor, "address": address},
            "notes": notes,
            "cells": len(cells),
            "cells_run": runner.num_run,
            "cells_cached": runner.num_cached,
            "wall_s": round(time.perf_counter() - t0, 2),
        }
    )
    write_atomic(
        out_dir / "manifest.json", lambda p: p.write_text(json.dumps(meta, indent=2) + "\n")
    )
    console.print(
        f"{len(cells)} cells ({runner.num_run} run, {runner.num_cached} cached); "
        f"wrote {out_dir}/ (sweep.csv, manifest.json, cells/)"
    )


@cli.group()
def fleet() -> None:
    """Fleet planning: how many GPUs meet the SLOs, per engine, policy and layout."""


def _parse_slo(
    values: tuple[str, ...],
    *,
    keys: tuple[str, ...] = ("ttft_ms", "tpot_ms", "deadline_s"),
    flag: str = "--slo",
) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for value in values:
        cls, sep, rest = value.partition(":")
        if not sep or not cls or not rest:
            raise UserError(f"{flag} {value!r}: expected CLASS:KEY=VALUE[,KEY=VALUE]")
        for item in rest.split(","):
            key, eq, raw = item.partition("=")
            key = key.strip()
            if not eq or key not in keys:
                raise UserError(f"{flag} {value!r}: {item!r} is not KEY=VALUE with KEY in {keys}")
            try:
                number = None if raw.strip().lower() == "none" else float(raw)
            except ValueError:
                raise UserError(f"{flag} {value!r}: {key}={raw!r} is not a number") from None
            out.setdefault(cls, {})[key] = number
    return out


def _parse_targets(value: str | None) -> tuple[tuple[str, float], ...]:
    if not value:
        return ()
    out = []
    for item in value.split(","):
        cls, eq, raw = item.partition("=")
        try:
            target = float(raw)
        except ValueError:
            target = math.nan
        if not eq or not cls.strip() or not 0 < target <= 1:
            raise UserError(
                f"--target {item!r}: expected CLASS=ATTAINMENT with 0 < ATTAINMENT <= 1"
            )
        out.append((cls.strip(), target))
    return tuple(out)


@fleet.command("plan")
@click.option(
    "--workload",
    "--trace",
    "workload",
    default="azure",
    show_default=True,
    help="Workload: a --trace name (azure = conv chat + code batch, azure-conv, azure-code) "
    "or an Azure-format CSV.",
)
@click.option(
    "--engines",
    "--engine",
    "engines",
    default="sim:trtllm",
    show_default=True,
    help="Comma-separated sim:* engine ids.",
)
@click.option(
    "--policies",
    default=None,
    help="Comma-separated policies; `native` is each engine's own [default: native,superinfer, "
    "skipping those not registered].",
)
@click.option(
    "--slo",
    multiple=True,
    help="Replace a class's SLO targets: CLASS:KEY=VALUE[,KEY=VALUE] with KEY ttft_ms, tpot_ms "
    "or deadline_s (`none` drops one). Repeatable.",
)
@click.option(
    "--target",
    default=None,
    help="Attainment target per class: CLASS=FRACTION[,...], e.g. chat=0.99,batch=0.99 "
    "[default: 0.99 for every class].",
)
@click.option("--model", default="llama-3.1-70b", show_default=True, help="Model.")
@click.option("--gpu", default="h100-80gb", show_default=True, help="GPU.")
@click.option("--tp", default=4, show_default=True, type=int, help="GPUs per replica (TP).")
@click.option(
    "--router",
    default="round_robin",
    show_default=True,
    type=click.Choice(["round_robin", "least_tokens", "slo_aware", "cache_aware"]),
    help="How arrivals are spread over replicas.",
)
@click.option("--cpu-kv-ratio", default=None, type=float, help="CPU-tier KV over HBM KV.")
@click.option("--rate-scale", default=1.0, show_default=True, type=float, help="Rate multiplier.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of every random choice.")
@click.option(
    "--window-s",
    default="900",
    show_default=True,
    help="Measured window, s, or `full` for the whole workload.",
)
@click.option(
    "--window-start-s",
    default=None,
    type=float,
    help="Start of the window [default: the busiest window by tokens arriving].",
)
@click.option(
    "--warmup-s",
    default=300.0,
    show_default=True,
    type=float,
    help="Traffic before the window simulated but not measured, s.",
)
@click.option(
    "--gpu-price",
    default=2.0,
    show_default=True,
    type=float,
    help="$ per GPU-hour (an assumed price: cost scales linearly with it).",
)
@click.option("--min-replicas", default=1, show_default=True, type=int, help="First count.")
@click.option("--max-replicas", default=64, show_default=True, type=int, help="Last count.")
@click.option(
    "--confirm",
    default=1,
    show_default=True,
    type=int,
    help="Counts above a passing count that must pass too (attainment is not monotone).",
)
@click.option("--split", is_flag=True, help="Also plan separate clusters, one per SLO class.")
@click.option(
    "--check-full",
    is_flag=True,
    help="Re-simulate every plan on the whole workload and report its attainment.",
)
@_executor_options
@click.option(
    "--out",
    default="results/fleet",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory for plan.csv, plan_detail.csv, search.csv, plan.md, manifest.json, cells/.",
)
def fleet_plan(
    workload: str,
    engines: str,
    policies: str | None,
    slo: tuple[str, ...],
    target: str | None,
    model: str,
    gpu: str,
    tp: int,
    router: str,
    cpu_kv_ratio: float | None,
    rate_scale: float,
    seed: int,
    window_s: str,
    window_start_s: float | None,
    warmup_s: float,
    gpu_price: float,
    min_replicas: int,
    max_replicas: int,
    confirm: int,
    split: bool,
    check_full: bool,
    executor: str,
    address: str | None,
    workers: int | None,
    fresh: bool,
    out: str,
) -> None:
    """Find the fewest replicas (x TP = GPUs) meeting every SLO class's attainment target.

    Searches replica counts with the simulator on the busiest window of the workload, per
    engine x policy, for one shared cluster (and, with --split, separate clusters per class);
    reports GPUs, cost per 1M output tokens and utilisation. Same seed, same plan.
    """
    import dataclasses
    import json
    import time

    from rich.console import Console

    from superinfer.adapters.manager import available_policies
    from superinfer.harness.grid.cells import CellCache, load_workload
    from superinfer.harness.grid.executors import CellRunner
    from superinfer.harness.grid.fleet import FleetConfig, plan_fleet, render_plan
    from superinfer.harness.report.results import CSV_FLOAT_FORMAT, manifest, write_atomic

    console = Console(stderr=True)
    notes = []
    if policies is None:
        registered = available_policies()
        names: tuple[str, ...] = tuple(
            p for p in ("native", "superinfer") if p == "native" or p in registered
        )
        if "superinfer" not in names:
            notes.append("policy 'superinfer' is not registered: planned native only")
    else:
        names = _split(policies)
    if window_s.strip().lower() == "full":
        window: float | None = None
    else:
        try:
            window = float(window_s)
        except ValueError:
            raise UserError(
                f"--window-s must be a number of seconds or `full`, got {window_s!r}"
            ) from None
    wl = load_workload(workload, rate_scale)
    base = {r.slo.name: r.slo for r in wl.requests}
    overrides = []
    for cls, changes in _parse_slo(slo).items():
        if cls not in base:
            raise UserError(f"--slo: workload {workload!r} has no SLO class {cls!r}")
        try:
            overrides.append(dataclasses.replace(base[cls], **changes))  # type: ignore[arg-type]
        except ValueError as exc:
            raise UserError(f"--slo {cls}: {exc}") from None
    config = FleetConfig(
        trace=workload,
        engines=_split(engines),
        policies=names,
        model=model,
        gpu=gpu,
        tp=tp,
        router=router,
        cpu_kv_ratio=cpu_kv_ratio,
        rate_scale=rate_scale,
        seed=seed,
        slo=tuple(overrides),
        targets=_parse_targets(target),
        window_s=window,
        window_start_s=window_start_s,
        warmup_s=warmup_s,
        gpu_price=gpu_price,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        confirm=confirm,
        split=split,
        check_full=check_full,
    )
    out_dir = Path(out)
    cache = CellCache(out_dir / "cells", read=not fresh)
    t0 = time.perf_counter()
    with (
        CellRunner(executor, workers=workers, address=address, cache=cache) as runner,
        _progress_bar(console) as bar,
    ):
        result = plan_fleet(
            config,
            wl,
            runner,
            progress=lambda label: _progress_task(bar, label),
            log=lambda line: console.print(line),
            notes=notes,
        )
    fmt = CSV_FLOAT_FORMAT
    write_atomic(
        out_dir / "plan.csv", lambda p: result.plan.to_csv(p, index=False, float_format=fmt)
    )
    write_atomic(
        out_dir / "plan_detail.csv",
        lambda p: result.detail.to_csv(p, index=False, float_format=fmt),
    )
    write_atomic(
        out_dir / "search.csv", lambda p: result.search.to_csv(p, index=False, float_format=fmt)
    )
    write_atomic(out_dir / "plan.md", lambda p: p.write_text(render_plan(result, config, wl)))
    meta = manifest(
        {
            "config": {**dataclasses.asdict(config), "executor": executor, "address": address},
            **result.info,
            "cells_run": runner.num_run,
            "cells_cached": runner.num_cached,
            "wall_s": round(time.perf_counter() - t0, 2),
        }
    )
    write_atomic(
        out_dir / "manifest.json",
        lambda p: p.write_text(json.dumps(meta, indent=2, default=str) + "\n"),
    )
    _print_plan(result.detail)
    console.print(
        f"{runner.num_run} cells run, {runner.num_cached} cached; wrote {out_dir}/ (plan.csv, "
        "plan_detail.csv, search.csv, plan.md, manifest.json)"
    )


def _print_plan(detail: pd.DataFrame) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table()
    cols = ["engine", "policy", "layout", "replicas", "gpus", "meets_slo", "chat_attainment",
            "batch_attainment", "busy_fraction", "mfu", "cost_per_mtok"]  # fmt: skip
    for c in cols:
        table.add_column(c, justify="left" if c in ("engine", "policy", "layout") else "right")
    for row in detail.itertuples():
        cells = []
        for c in cols:
            v = getattr(row, c)
            if isinstance(v, float):
                cells.append("n/a" if math.isnan(v) else f"{v:.4g}")
            else:
                cells.append(str(v))
        table.add_row(*cells)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(table)


@cli.command("cache-eval")
@click.option(
    "--trace",
    default="mooncake",
    show_default=True,
    help="mooncake (the Mooncake FAST'25 conversation trace) or a path to a .jsonl in its "
    "format (timestamp, input_length, output_length, hash_ids).",
)
@click.option(
    "--capacities",
    default="0.01,0.02,0.05,0.1,0.2,0.5",
    show_default=True,
    help="Comma-separated HBM capacities, as fractions of the trace's unique blocks.",
)
@click.option(
    "--cpu-ratio",
    default=4.0,
    show_default=True,
    type=float,
    help="CPU tier size as a multiple of the HBM capacity for the with-CPU-tier runs "
    "(0: none). Runs where HBM + CPU hold every unique block are skipped.",
)
@click.option(
    "--policies",
    default="lru,lfu,predictor,belady",
    show_default=True,
    help="Comma-separated cache policies.",
)
@click.option(
    "--duration-s",
    default=None,
    type=float,
    help="Replay only the first DURATION_S seconds of arrivals [default: all].",
)
@click.option(
    "--jobs",
    default=None,
    type=int,
    help="Worker processes [default: the CPU count, at most 4].",
)
@click.option("--seed", default=0, show_default=True, type=int, help="The predictor's seed.")
@click.option(
    "--report-only",
    is_flag=True,
    help="Only rewrite report.md and the plots of --out from its CSVs and manifest.",
)
@click.option(
    "--out",
    default="results/cache",
    show_default=True,
    type=click.Path(),
    help="Directory to write.",
)
def cache_eval(
    trace: str,
    capacities: str,
    cpu_ratio: float,
    policies: str,
    duration_s: float | None,
    jobs: int | None,
    seed: int,
    report_only: bool,
    out: str,
) -> None:
    """Replay a trace's KV block hashes through LRU, LFU, the reuse predictor and Belady's MIN.

    Writes hit_rates.csv (trace, policy, capacity_frac, cpu_tier, block_hit_rate,
    token_hit_rate), hit_rates_detail.csv, hit_rates_by_minute.csv, two plots, report.md and
    manifest.json. Definitions: docs/kv-reuse.md.
    """
    import os

    from rich.console import Console

    from superinfer.harness.offline.cache_eval import (
        CacheEvalConfig,
        run_cache_eval,
        write_cache_eval,
        write_cache_report,
    )

    if report_only:
        write_cache_report(Path(out))
        click.echo(f"wrote {out}/report.md and plots")
        return
    fracs = []
    for text in _split(capacities):
        try:
            fracs.append(float(text))
        except ValueError:
            raise UserError(f"--capacities: {text!r} is not a number") from None
    config = CacheEvalConfig(
        trace=trace,
        capacity_fracs=tuple(fracs),
        cpu_ratio=cpu_ratio,
        policies=_split(policies),
        duration_s=duration_s,
        jobs=jobs if jobs is not None else max(1, min(4, os.cpu_count() or 1)),
        seed=seed,
    )
    console = Console(stderr=True)
    with console.status("replaying") as status:
        loaded, results = run_cache_eval(config, progress=lambda msg: status.update(msg))
    out_dir = Path(out)
    write_cache_eval(out_dir, loaded, config, results, command=sys.argv)
    for r in results:
        click.echo(
            f"{r.policy:10s} capacity {r.capacity_frac:<5g} cpu_tier {str(r.cpu_tier):5s} "
            f"blocks {100 * r.block_hit_rate:6.2f}%  tokens {100 * r.token_hit_rate:6.2f}%"
        )
    console.print(f"wrote {out_dir}/ (hit_rates.csv, hit_rates_detail.csv, report.md, plots)")


@cli.command("policies")
@click.option("--options", "show_options", is_flag=True, help="Also list each policy's options.")
def list_policies(show_options: bool) -> None:
    """List the registered scheduling policies (and their --policy-opt options)."""
    from superinfer.adapters.manager import policy_options

    for name, ep in sorted(available_policies().items()):
        click.echo(f"{name:12s} {ep.value}")
        if not show_options:
            continue
        loaded = ep.load()
        for key, (default, text) in policy_options(
            loaded if isinstance(loaded, type) else type(loaded)
        ).items():
            if key == "output_tokens":
                continue  # set by the harness from the workload, not an option
            click.echo(f"    {key} = {default!r}: {text}")


def main() -> None:
    """Entry point: run the CLI, turning user mistakes into one-line errors (exit status 2)."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (UserError, UnknownPolicyError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except PolicyError as exc:
        click.echo(f"error: policy returned an invalid decision: {exc}", err=True)
        sys.exit(3)
