"""The ``superinfer`` command."""

from __future__ import annotations

import sys
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

    from superinfer.harness.runner import BenchConfig

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
    "--trace",
    default="azure",
    show_default=True,
    help="Workload: azure (conv=chat + code=batch), azure-conv, azure-code, or a path "
    "to a CSV in the Azure trace format.",
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
    help="Replicas behind the router (round robin).",
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
    default=str(DEFAULT_OUT),
    show_default=True,
    type=click.Path(),
    help="Run directory to write [default with --suite: results/SUITE].",
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
    help="--suite headline: comma-separated loads of the sweep [default: 0.5,0.7,1.0,1.3,1.6].",
)
@click.pass_context
def bench(
    ctx: click.Context,
    trace: str,
    engines: str,
    model: str,
    gpu: str,
    tp: int,
    replicas: int,
    policies: str | None,
    rate_scale: float,
    duration_s: float | None,
    policy_opt: tuple[str, ...],
    seed: int,
    out: str,
    suite: str | None,
    rate_scales: str | None,
) -> None:
    """Run a workload on an engine under each policy; write the run directory and print the table.

    With no options: the Azure 2023 conv (chat) + code (batch) hour on a simulated
    Llama-3.1-70B, A100-80GB, TP4, 4 replicas, for every registered policy -> results/default/.
    """
    from rich.console import Console

    from superinfer.harness.report import render_markdown
    from superinfer.harness.results import manifest, write_run
    from superinfer.harness.runner import BenchConfig, run_bench

    console = Console(stderr=True)
    if suite is not None:
        own = _suite_defaults(ctx, suite)
        trace = own.get("trace", trace)
        replicas = own.get("replicas", replicas)
        duration_s = own.get("duration_s", duration_s)
        rate_scale = own.get("rate_scale", rate_scale)
        policies = own.get("policies", policies)
        out = own.get("out", out)
    config = BenchConfig(
        trace=trace,
        engines=_split(engines),
        model=model,
        gpu=gpu,
        tp=tp,
        replicas=replicas,
        policies=_split(policies),
        rate_scale=rate_scale,
        duration_s=duration_s,
        policy_opts=policy_opt,
        seed=seed,
    )
    if suite is not None:
        _run_suite(suite, config, Path(out), rate_scales, console)
        return
    with console.status("running") as status:
        result = run_bench(config, progress=lambda msg: status.update(msg))
    meta = manifest(result.info)
    out_dir = Path(out)
    report = render_markdown(result.summary, meta)
    write_run(out_dir, result.summary, result.requests, meta, report, result.timeline)
    _print_table(result.summary)
    console.print(
        f"wrote {out_dir}/ (summary.csv, requests.parquet, timeline.parquet, "
        "manifest.json, report.md)"
    )


def _suite_defaults(ctx: click.Context, suite: str) -> dict[str, Any]:
    """The suite's own defaults for the ``bench`` options the user did not give."""
    from click.core import ParameterSource

    from superinfer.harness.suites import HEADLINE_POLICIES, HEADLINE_RATE_SCALE

    own: dict[str, Any] = {"out": f"results/{suite}"}
    if suite == "headline":
        own.update(rate_scale=HEADLINE_RATE_SCALE, policies=",".join(HEADLINE_POLICIES))
    else:
        own.update(trace="azure-conv", replicas=1, duration_s=600.0)
    return {
        name: value
        for name, value in own.items()
        if ctx.get_parameter_source(name) is ParameterSource.DEFAULT
    }


def _run_suite(
    suite: str, config: BenchConfig, out_dir: Path, rate_scales: str | None, console: Console
) -> None:
    import json

    from superinfer.harness.results import manifest
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
            result = run_headline(config, rate_scales=rates, progress=status.update)
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
