"""``superinfer conform``: does an engine keep its priority and SLO promises?

Scenarios, thresholds and sources: docs/conformance.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from superinfer.cli_options import engine_option, key_values, split_names


@click.command()
@click.option(
    "--engine",
    required=True,
    help="sim:<profile> (sim:vllm, sim:sglang, sim:trtllm, sim:hf-cpu), hf (the real CPU "
    "engine), serve (superinfer serve, started here), sglang (SGLang's CPU server, "
    "started here), llamacpp (llama.cpp's server, started here), or http (--url).",
)
@click.option(
    "--policy",
    "policies",
    default=None,
    help="Comma-separated policies [default: every one the engine runs; sim: native "
    "and every registered policy; sglang: native, priority, superinfer; serve, hf: "
    "superinfer]; for http and llamacpp a label.",
)
@click.option("--scenarios", default=None, help="Comma-separated scenarios [default: all].")
@click.option("--url", default=None, help="http: the server's base URL.")
@click.option(
    "--backend",
    default="openai",
    show_default=True,
    type=click.Choice(["sglang", "vllm", "trtllm", "openai"]),
    help="http: how priority and SLO fields are sent.",
)
@engine_option("http: engine setting of the http engine, repeatable (send_priority=true ...).")
@click.option(
    "--kv-policy",
    default=None,
    help="sim:vllm, sim:sglang, sim:trtllm: the prefix-cache placement plugin beside each "
    "policy (e.g. priority, reuse); its columns are labelled POLICY+kv-NAME.",
)
@click.option(
    "--out",
    default="results/conformance",
    show_default=True,
    type=click.Path(),
    help="Folder of matrix.csv / matrix.md (this engine's columns replaced).",
)
def conform(engine: str, policies: str | None, scenarios: str | None, url: str | None,
            backend: str, engine_options: tuple[str, ...], kv_policy: str | None,
            out: str) -> None:  # fmt: skip
    """Run the conformance scenarios on ENGINE under each policy and merge the matrix."""
    from superinfer.harness.conform.manifest import record_runs
    from superinfer.harness.conform.runner import (
        conform_rows,
        default_policies,
        open_target,
        read_matrix,
        takes_kv_policy,
        write_matrix,
    )
    from superinfer.harness.conform.scenarios import scenario_names
    from superinfer.harness.engines.base import BenchConfig
    from superinfer.harness.errors import UserError
    from superinfer.harness.report.results import check_out_dir

    for flag, value in (("--scenarios", scenarios), ("--policy", policies)):
        if value is not None and not split_names(value):  # as bench's --policies ""
            raise UserError(f"{flag} {value!r} names nothing (leave it out for all)")
    read_matrix(check_out_dir(Path(out)))  # before any scenario runs
    names = list(split_names(scenarios)) or None
    if names:
        unknown = [n for n in names if n not in scenario_names()]
        if unknown:
            raise UserError(
                f"unknown scenario {unknown[0]!r}; scenarios: {', '.join(scenario_names())}"
            )
    if kv_policy is not None and not takes_kv_policy(engine):
        raise UserError(
            f"--kv-policy: {engine} has no placement hook the conformance run can drive "
            "(sim:vllm, sim:sglang, sim:trtllm have)"
        )
    base = BenchConfig(cpu_kv_ratio=0.0, url=url, backend=backend, kv_policy=kv_policy,
                       engine_options=key_values(engine_options, "--engine-option"))  # fmt: skip
    rows, columns = [], []
    for policy in split_names(policies) or default_policies(engine):
        label = f"{policy}+kv-{kv_policy}" if kv_policy else policy
        with open_target(engine, policy, base) as target:
            got = conform_rows(target, names, progress=lambda m: click.echo(m, err=True))
        rows += got
        columns.append((target.engine, label))
        for r in got:
            r["policy"] = label
            click.echo(f"{target.engine:10s} {label:11s} {r['scenario']:27s} {r['passed']:15s} "
                       f"{r['value']!s:>8s} {r['unit']}")  # fmt: skip
    out_dir = Path(out)
    write_matrix(rows, out_dir)
    record_runs(out_dir, columns, ["superinfer", *sys.argv[1:]])
    click.echo(f"wrote {out_dir}/matrix.csv, matrix.md, MANIFEST.md, manifest.json")
