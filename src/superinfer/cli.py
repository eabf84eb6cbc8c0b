"""The ``superinfer`` command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

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
    help="Run directory to write.",
)
def bench(
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
