"""The ``superinfer`` command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from superinfer.adapters.manager import UnknownPolicyError, available_policies
from superinfer.harness.errors import UserError
from superinfer.policy_core.validation import PolicyError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["cli", "main"]

DEFAULT_OUT = Path("results/default")


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


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
    type=click.Choice(["round_robin", "least_tokens", "slo_aware"]),
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
    "--kv-quant/--no-kv-quant",
    default=False,
    show_default=True,
    help="Per-request KV precision from the quantization planner (fp16 -> int8 -> int4 under "
    "memory pressure, chat never below int8); off: every request stores FP16 KV.",
)
@click.option(
    "--policies",
    default=None,
    help="Comma-separated policy names [default: every registered policy].",
)
@click.option(
    "--rate-scale",
    default=1.0,
    show_default=True,
    type=float,
    help="Arrival-rate multiplier (2 = twice the trace's request rate).",
)
@click.option(
    "--duration-s",
    default=None,
    type=float,
    help="Keep only the first DURATION_S seconds (after rate scaling) [default: all].",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of every random choice.")
@click.option(
    "--out",
    default=str(DEFAULT_OUT),
    show_default=True,
    type=click.Path(),
    help="Run directory to write.",
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
    policies: str | None,
    rate_scale: float,
    duration_s: float | None,
    seed: int,
    out: str,
) -> None:
    """Run a workload on an engine under each policy; write the run directory and print the table.

    With no options: the azure-mixed workload (Azure 2023 conv as chat + code as batch, one
    hour) on a simulated Llama-3.1-70B, A100-80GB, TP4, 4 replicas, for every registered
    policy -> results/default/ (tables, report.md and PNG plots).
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from superinfer.harness.report import as_written, render_markdown, write_plots
    from superinfer.harness.results import manifest, write_run
    from superinfer.harness.runner import BenchConfig, build_bench_workload, run_bench
    from superinfer.harness.specs import load_spec

    if workload is not None and trace is not None:
        raise UserError("give --workload or --trace, not both")
    if trace is None and workload is None:
        workload = "azure-mixed"
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
        for key, value in load_spec(workload).bench.items():
            if ctx.get_parameter_source(key) == click.core.ParameterSource.DEFAULT:
                options[key] = value
    config = BenchConfig(
        trace=trace or "azure",
        engines=_split(options["engines"]),
        model=options["model"],
        gpu=options["gpu"],
        tp=options["tp"],
        replicas=options["replicas"],
        router=options["router"],
        cpu_kv_ratio=cpu_kv_ratio,
        kv_quant=kv_quant,
        policies=_split(options["policies"]),
        rate_scale=rate_scale,
        duration_s=duration_s,
        seed=seed,
        workload=workload,
    )
    console = Console(stderr=True)
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
    out_dir = Path(out)
    with console.status("drawing plots"):
        plots = write_plots(out_dir, result.summary, result.requests, result.timeline, meta)
    report = render_markdown(as_written(result.summary), meta, plots)
    write_run(out_dir, result.summary, result.requests, meta, report, result.timeline)
    _print_table(as_written(result.summary))
    console.print(
        f"wrote {out_dir}/ (summary.csv, metrics.csv, requests.parquet, timeline.parquet, "
        f"manifest.json, report.md, {len(plots)} plots)"
    )


def _print_table(summary: pd.DataFrame) -> None:
    from rich.console import Console
    from rich.table import Table

    from superinfer.harness.report import TABLE_COLUMNS, format_value

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
    "--out",
    default="results/calibration",
    show_default=True,
    type=click.Path(),
    help="Directory for fit_error.csv, fit_error_by_range.csv, params.json, report.md.",
)
@click.option(
    "--install/--no-install",
    default=True,
    show_default=True,
    help="Also write the parameters into the package (sim/calibration.json), where the "
    "simulator reads them.",
)
def calibrate(out: str, install: bool) -> None:
    """Fit the simulator's step-time model to the measured GPU timings in shared/data/profiling."""
    from superinfer.harness.calibrate import calibrate as run_calibration
    from superinfer.harness.calibrate import params_json, render_report
    from superinfer.harness.results import write_atomic

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
    type=click.Choice(["sglang"]),
    required=True,
    help="Engine to serve with the policy plugged in.",
)
@click.option("--policy", default=None, help="Policy name [default: the config's, else fcfs].")
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
    help="Adapter configuration (JSON; docs/adapters.md).",
)
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
def serve(
    engine: str,
    policy: str | None,
    policy_opts: tuple[str, ...],
    config_path: str | None,
    engine_args: tuple[str, ...],
) -> None:
    """Start ENGINE's own server with the policy inside: superinfer serve --engine sglang -- ARGS.

    ARGS go to ``python -m sglang.launch_server``; superinfer adds the plugin switches
    (SUPERINFER_SGLANG=1, policy, config), --enable-priority-scheduling and its eviction policy.
    Needs a CUDA GPU.
    """
    from superinfer.adapters.sglang.config import ConfigError
    from superinfer.adapters.sglang.launch import ServeError, exec_server, launch_command

    try:
        argv, env = launch_command(
            engine_args, policy=policy, policy_opts=policy_opts, config_path=config_path
        )
        exec_server(argv, env)
    except (ConfigError, ServeError) as exc:
        raise click.ClickException(str(exc)) from None


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
    from superinfer.harness.report import compare_runs, rebuild_report

    if len(run_dirs) == 1:
        written = rebuild_report(run_dirs[0], out_dir=out, sweep=sweep)
    else:
        written = compare_runs(list(run_dirs), out or Path("results/compare"), sweep=sweep)
    click.echo(f"wrote {written}")


@cli.command("workloads")
def list_workloads() -> None:
    """List the built-in workload specs."""
    from superinfer.harness.specs import builtin_specs, parse_spec

    for name, text in builtin_specs().items():
        spec = parse_spec(text, path=f"<built-in {name}>")
        first = spec.description.split(". ")[0].rstrip(".")
        click.echo(f"{name:18s} {first}")


@cli.command("policies")
def list_policies() -> None:
    """List the registered scheduling policies."""
    for name, ep in sorted(available_policies().items()):
        click.echo(f"{name:12s} {ep.value}")


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
