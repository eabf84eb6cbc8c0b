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
#: Run directory of a bench on the real CPU engine (and its simulator profile) only.
HF_OUT = Path("results/hf")


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
    "max_num_seqs, page_size_tokens, num_threads, drain_s, stall_s, step_time_file).",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of every random choice.")
@click.option(
    "--out",
    default=None,
    type=click.Path(),
    help=f"Run directory to write [default: {DEFAULT_OUT}; {HF_OUT} when every engine is hf "
    "or sim:hf-cpu].",
)
def bench(
    trace: str,
    engines: str,
    model: str,
    gpu: str,
    tp: int,
    replicas: int,
    policies: str | None,
    rate_scale: float | None,
    duration_s: float | None,
    start_s: float | None,
    length_scale: float | None,
    max_prompt_tokens: int | None,
    max_output_tokens: int | None,
    engine_options: tuple[str, ...],
    seed: int,
    out: str | None,
) -> None:
    """Run a workload on an engine under each policy; write the run directory and print the table.

    With no options: the Azure 2023 conv (chat) + code (batch) hour on a simulated
    Llama-3.1-70B, A100-80GB, TP4, 4 replicas, for every registered policy -> results/default/.
    With --engine hf: a 200 s slice of the same mix, slowed and shortened to what 2 CPU cores
    serve, replayed in real time on SmolLM2-135M -> results/hf/.
    """
    from rich.console import Console

    from superinfer.harness.hf_runner import workload_defaults
    from superinfer.harness.report import render_markdown
    from superinfer.harness.results import manifest, write_run
    from superinfer.harness.runner import BenchConfig, run_bench

    console = Console(stderr=True)
    engine_ids = _split(engines)
    given = {
        "rate_scale": rate_scale,
        "duration_s": duration_s,
        "start_s": start_s,
        "length_scale": length_scale,
        "max_prompt_tokens": max_prompt_tokens,
        "max_output_tokens": max_output_tokens,
    }
    shaping = workload_defaults(engine_ids)
    shaping.update({k: v for k, v in given.items() if v is not None})
    config = BenchConfig(
        trace=trace,
        engines=engine_ids,
        model=model,
        gpu=gpu,
        tp=tp,
        replicas=replicas,
        policies=_split(policies),
        seed=seed,
        engine_options=_key_values(engine_options, "--engine-option"),
        **shaping,
    )
    with console.status("running") as status:
        result = run_bench(config, progress=lambda msg: status.update(msg))
    meta = manifest(result.info)
    cpu_only = engine_ids and all(e in ("hf", "sim:hf-cpu") for e in engine_ids)
    out_dir = Path(out) if out is not None else HF_OUT if cpu_only else DEFAULT_OUT
    report = render_markdown(result.summary, meta)
    write_run(out_dir, result.summary, result.requests, meta, report, result.timeline, result.steps)
    _print_table(result.summary)
    extra = ", steps.parquet" if not result.steps.empty else ""
    console.print(
        f"wrote {out_dir}/ (summary.csv, requests.parquet, timeline.parquet{extra}, "
        "manifest.json, report.md)"
    )


@cli.command()
@click.option(
    "--engine",
    default="hf",
    show_default=True,
    help="Engine whose step times to measure (hf: the real CPU engine).",
)
@click.option(
    "--engine-option",
    "engine_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Engine setting, repeatable (as for bench).",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the prompt order.")
@click.option(
    "--steps",
    "steps_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Refit from steps recorded earlier (a *_steps.csv of calibrate, or a run's "
    "steps.parquet) instead of measuring.",
)
@click.option(
    "--out",
    default="results/hf/step_time_fit.json",
    show_default=True,
    type=click.Path(),
    help="Calibration file to write (its steps go beside it, as a CSV).",
)
def calibrate(
    engine: str, engine_options: tuple[str, ...], seed: int, steps_file: str | None, out: str
) -> None:
    """Measure real engine steps and fit the sim:hf-cpu step-time model.

    Runs closed batches of real ShareGPT prompts through the engine, records every step's shape
    and wall time, fits the model of sim/hf_cpu.py and writes the coefficients, the fit error
    and the engine's per-step profile. Use the file with
    `superinfer bench --engine sim:hf-cpu --engine-option step_time_file=PATH`.
    """
    import json

    import pandas as pd

    from superinfer.harness.hf_runner import calibrate_hf, fit_steps
    from superinfer.harness.results import manifest, write_atomic

    if engine != "hf":
        raise UserError(
            f"calibrate measures the real CPU engine only: use --engine hf, not {engine!r}"
        )
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
