"""The ``superinfer`` command: a shell over the harness (each command parses its options, makes
one harness call and prints what it did)."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import click

from superinfer.adapters.manager import UnknownPolicyError
from superinfer.cli_options import (
    EXECUTOR_OPTIONS,
    ROUTER_OPTION,
    cluster_options,
    engine_option,
    key_values,
    seed_option,
    split_names,
)
from superinfer.harness.errors import UserError
from superinfer.harness.report.terminal import (
    bench_progress,
    print_plan,
    print_summary,
    progress_bar,
    progress_task,
)
from superinfer.policy_core.validation import PolicyError

__all__ = ["cli", "main"]

_HF = "with engine hf or sim:hf-cpu"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="superinfer")
def cli() -> None:
    """superinfer: an SLO-aware policy layer for LLM inference engines, and its benchmark."""


# -- bench ------------------------------------------------------------------------------------


# fmt: off
@cli.command()
@click.option("--workload", default=None,
              help="Workload spec: a built-in name (azure-mixed, mooncake-chat, reasoning-long, "
              "sharegpt-poisson; "
              "`superinfer workloads` lists them) or a path to a TOML spec (docs/workloads.md). "
              "A spec's [bench] table sets defaults for --model/--gpu/--tp/--replicas/--engines/"
              "--policies; options given here win.  [default: azure-mixed]")
@click.option("--trace", default=None,
              help="Instead of --workload: azure (conv=chat + code=batch; the same requests as "
              "azure-mixed), azure-conv, azure-code, or a path to a CSV in the Azure trace format.")
@click.option("--engines", "--engine", "engines", default="sim:vllm", show_default=True,
              help="Comma-separated engine ids; each runs every policy.")
@cluster_options("a100-80gb", ("Model: llama-3.1-8b or llama-3.1-70b.",
                        "GPU: a100-80gb, h100-80gb, h200 or gh200.",
                        "Tensor-parallel degree (GPUs per replica)."))
@click.option("--replicas", default=4, show_default=True, type=int,
              help="Replicas behind the router.")
@ROUTER_OPTION
@click.option("--cpu-kv-ratio", default=None, type=float,
              help="CPU-tier KV capacity as a multiple of HBM KV capacity [default: the engine "
              "profile's; 0 disables swap and prefix offload].")
@click.option("--kv-policy", default=None,
              help="Prefix-cache placement policy: lru, lfu, arc, s3fifo, reuse (the learned "
              "reuse predictor), adaptive (follows the best of lru, s3fifo, arc) or priority "
              "(least urgent SLO class first) [default: the engine's own eviction order].")
@click.option("--kv-quant/--no-kv-quant", default=False, show_default=True,
              help="Per-request KV precision from the quantization planner (fp16 -> int8 -> int4 "
              "under memory pressure, chat never below int8); off: every request stores FP16 KV.")
@click.option("--kv-quant-opt", "kv_quant_opts", multiple=True, metavar="KEY=VALUE",
              help="With --kv-quant: a planner setting, repeatable (int8_pressure, int4_pressure, "
              "hysteresis, floors such as 'chat=int8,batch=int4', default_floor, count_waiting; "
              "docs/kv_quant.md).")
@click.option("--stack", default="none", show_default=True,
              help="full: rotation + reuse-predictor placement + KV quantization planner together "
              "on every engine that supports each (the run says which an engine cannot apply); "
              "or some of them, comma-separated (rotation, reuse, quant).")
@click.option("--policies", default=None, help="Comma-separated policy names [default: every "
              "registered policy; hf: all but oracle; sglang: native,lpm,priority,superinfer].")
@click.option("--rate-scale", default=None, type=float,
              help=f"Arrival-rate multiplier (2 = twice the trace's request rate) [default: 1; "
              f"0.05 {_HF}].")
@click.option("--duration-s", default=None, type=float,
              help=f"Keep only the first DURATION_S seconds (after rate scaling) [default: all; "
              f"200 {_HF}].")
@click.option("--start-s", default=None, type=float,
              help=f"Skip the trace's first START_S seconds (before rate scaling) [default: 0; "
              f"100 {_HF}].")
@click.option("--length-scale", default=None, type=float,
              help=f"Multiply prompt and output lengths by this factor [default: 1; 0.125 {_HF}].")
@click.option("--max-prompt-tokens", default=None, type=int,
              help=f"Cap prompt lengths after scaling [default: none; 256 {_HF}].")
@click.option("--max-output-tokens", default=None, type=int,
              help=f"Cap output lengths after scaling [default: none; 64 {_HF}].")
@engine_option("Engine setting, repeatable (hf, sim:hf-cpu: num_blocks, max_batch_tokens, "
                "max_num_seqs, page_size_tokens, num_threads, drain_s, stall_s, step_time_file, "
                "mechanics, step_spread, step_spread_seed; "
                "http: endpoint, model, prompt, timeout_s, connect_timeout_s, retries, "
                "retry_backoff_s, max_connections, send_slo, send_priority, eos_token_ids, "
                "exact_output, include_usage).")
@click.option("--url", default=None,
              help="engine http: base URL of the OpenAI-compatible server to benchmark "
              "(http://127.0.0.1:8000).")
@click.option("--backend", default="openai", show_default=True,
              type=click.Choice(["sglang", "vllm", "trtllm", "openai"]),
              help="engine http: the server's kind, which sets how SLO, priority and forced "
              "output lengths are sent (docs/serve.md).")
@click.option("--policy-opt", "policy_opt", multiple=True, metavar="[POLICY.]KEY=VALUE",
              help="Policy hyperparameter; repeatable. KEY=VALUE sets it on every selected policy "
              "that has it, POLICY.KEY=VALUE on that policy only (list them: superinfer policies "
              "--options).")
@seed_option()
@click.option("--out", default=None, type=click.Path(),
              help="Run directory to write [default: results/default; results/hf when every engine "
              "is hf or sim:hf-cpu; results/http when every engine is http].")
@click.option("--suite", type=click.Choice(["headline", "rotation", "seed", "engines"]),
              default=None,
              help="Run a fixed experiment instead of one run. headline: every policy on every "
              "engine over a load sweep (defaults: the seven headline policies, --rate-scale 0.6 "
              "as the headline load) -> results/headline/. rotation: superinfer with rotation "
              "through HBM on and off (needs an engine with a CPU KV tier; defaults: --workload "
              "mooncake-chat, --replicas 6, --duration-s 600) -> results/rotation/. seed: native "
              "vs superinfer --stack full on the 3 sim engines, the Azure hour at 0.6x (the "
              "committed results/seed is --duration-s 900; --policy-opt: superinfer's and "
              "oracle's, not native's) -> results/seed/. engines: SmolLM2 on "
              "hf, sglang and llama.cpp (+ sim rows), options --engine-option suite.KEY=VALUE "
              "(--policy-opt: superinfer's, on every engine) -> results/engines-cpu/.")
@click.option("--rate-scales", default=None,
              help="--suite headline: comma-separated loads of the sweep [default: "
              "0.3,0.6,0.8,1.0,1.3,1.6].")
@click.option("--workers", default=1, show_default=True, type=int,
              help="--suite headline: processes running its loads x engines in parallel (the "
              "tables do not depend on it).")
@click.pass_context
# fmt: on
def bench(ctx: click.Context, /, **params: Any) -> None:
    """Run a workload on an engine under each policy; write the run directory and print the table.

    With no options: the azure-mixed workload (Azure 2023 conv as chat + code as batch, one
    hour) on a simulated Llama-3.1-70B, A100-80GB, TP4, 4 replicas, for every registered
    policy -> results/default/ (tables, report.md and PNG plots). With --engine hf: a 200 s
    slice of the same mix, slowed and shortened to what 2 CPU cores serve, replayed in real
    time on SmolLM2-135M -> results/hf/. With --engine http --url URL: the workload replayed
    in real time against a running OpenAI-compatible server -> results/http/.
    """
    from rich.console import Console

    from superinfer.harness import bench as hb

    default = click.core.ParameterSource.DEFAULT
    given = {k for k in params if ctx.get_parameter_source(k) != default}
    params["kv_quant_opts"] = key_values(params["kv_quant_opts"], "--kv-quant-opt")
    params["engine_options"] = key_values(params["engine_options"], "--engine-option")
    config = hb.bench_config(params, given=given)
    console = Console(stderr=True)
    suite, out = params["suite"], params["out"]
    if suite is not None:
        from superinfer.harness.suites import run_suite

        out_dir = hb.bench_out_dir(config, out, suite=suite)
        with console.status("running") as status:
            table, files = run_suite(suite, config, out_dir, rate_scales=params["rate_scales"],
                                     workers=params["workers"], progress=status.update,
                                     command=sys.argv)  # fmt: skip
        if suite == "headline":
            print_summary(table)
        else:  # long tables: numbers as the reports write them, "–" where a class had none
            from superinfer.harness.report.markdown import format_value

            cell = partial(format_value, column="value", digits=4)
            click.echo(table.to_string(index=False, na_rep="–", float_format=cell))
        console.print(f"wrote {out_dir}/ ({files})")
        return
    hb.bench_out_dir(config, out)  # a bad --out fails now, not after the run
    with console.status(f"loading workload {config.workload or config.trace}"):
        wl = hb.build_bench_workload(config)
    with bench_progress(console, len(wl.requests)) as on_cell:
        result = hb.run_bench(config, workload=wl, on_cell=on_cell)
    with console.status("drawing plots"):
        out_dir, plots, summary = hb.write_bench(result, config, out)
    print_summary(summary)
    for src in wl.absent_sources():  # after the run: an error stays the one line on stderr
        console.print(f"note: no request of source {src.name!r} ({src.slo.name}) in this window: "
                      "its class has no row", highlight=False)  # fmt: skip
    extra = ", steps.parquet" if not result.steps.empty else ""
    console.print(
        f"wrote {out_dir}/ (summary.csv, metrics.csv, requests.parquet, timeline.parquet{extra}, "
        f"manifest.json, report.md, {len(plots)} plots)"
    )


# -- serve ------------------------------------------------------------------------------------

# fmt: off
@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--engine", type=click.Choice(["sglang", "hf"]), required=True,
              help="sglang: SGLang's own server with the policy plugged in (CPU recipe without a "
              "CUDA GPU). hf: an "
              "OpenAI-compatible server on the real CPU engine (SmolLM2-135M, transformers "
              "continuous batching) with the policy deciding every step.")
@click.option("--policy", default=None,
              help="Policy name [sglang: the config's, else fcfs; native, lpm, priority: SGLang's "
              "own scheduling, no plugin; hf: superinfer if registered, else fcfs].")
@click.option("--kv-policy", "serve_kv_policy", default=None,
              help="sglang: prefix-cache placement policy through the plugin (lru, lfu, arc, "
              "s3fifo, reuse, adaptive, priority).")
@click.option("--policy-opt", "policy_opts", multiple=True, metavar="KEY=VALUE",
              help="Policy option; repeatable.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              default=None, help="sglang: adapter configuration (JSON; docs/adapters.md).")
@click.option("--host", default=None,
              help="Address to bind [hf: 127.0.0.1, this machine only; sglang: passed on as "
              "--host].")
@click.option("--port", default=None, type=int,
              help="TCP port [hf: 8000; sglang: passed on as --port].")
@click.option("--priority-convention", type=click.Choice(["vllm", "sglang"]), default="vllm",
              show_default=True,
              help="hf: how a request's `priority` reads: vllm (lower is more urgent) or sglang "
              "(higher is more urgent).")
@click.option("--slo-class", "slo_classes", multiple=True, metavar="CLASS:KEY=VALUE[,KEY=VALUE]",
              help="hf: define or change an SLO class (KEY: ttft_ms, tpot_ms, deadline_s, "
              "priority; `none` drops a target). Repeatable. [default classes: chat (TTFT 1000 "
              "ms, TPOT 100 ms, priority 0), batch (deadline 600 s, priority 1)]")
@click.option("--default-class", default="batch", show_default=True,
              help="hf: class of a request that names none.")
@click.option("--drain-s", type=float, default=30.0, show_default=True,
              help="hf: on SIGTERM or Ctrl-C, how long requests in flight may run on before "
              "they are failed ('server shutdown'), s.")
@engine_option("hf: engine setting, repeatable (num_blocks, max_batch_tokens, max_num_seqs, "
                "page_size_tokens, num_threads, step_time_file).")
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
# fmt: on
def serve(ctx: click.Context, /, engine: str, **p: Any) -> None:
    """Serve with the policy inside.

    \b
    superinfer serve --engine hf [--policy NAME] [--port P]
        OpenAI-compatible /v1/completions and /v1/chat/completions (SSE streaming), /health,
        /metrics (Prometheus) on the real CPU engine; docs/serve.md.
    superinfer serve --engine sglang -- ARGS
        ARGS go to `python -m sglang.launch_server`; superinfer adds the plugin switches
        (SUPERINFER_SGLANG=1, policy, config), --enable-priority-scheduling and its eviction
        policy; --policy native|lpm|priority runs SGLang's own scheduling without the plugin.
        Without a CUDA GPU the CPU recipe is applied (one log line; docs/adapters.md).
    """
    {"hf": _serve_hf, "sglang": _serve_sglang}[engine](ctx, **p)


def _serve_hf(ctx: click.Context, **p: Any) -> None:
    from superinfer.harness.engines.hf_serve import serve_hf

    if p["serve_kv_policy"] is not None:
        raise UserError("--kv-policy applies to serve --engine sglang only")
    given = [k for k in ("config_path", "engine_args") if p[k]]
    if given:
        raise UserError(
            "serve --engine hf takes no --config and no engine ARGS "
            f"(got {'--config' if given[0] == 'config_path' else ' '.join(p['engine_args'])})"
        )
    serve_hf(
        policy=p["policy"], policy_options=key_values(p["policy_opts"], "--policy-opt"),
        host=p["host"], port=p["port"], priority_convention=p["priority_convention"],
        slo_classes=p["slo_classes"], default_class=p["default_class"], drain_s=p["drain_s"],
        engine_options=key_values(p["engine_options"], "--engine-option"),
        log=lambda line: click.echo(line, err=True),
    )  # fmt: skip


def _serve_sglang(ctx: click.Context, **p: Any) -> None:
    for name in ("priority_convention", "slo_classes", "default_class", "drain_s",
                 "engine_options"):  # fmt: skip
        if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT:
            flag = {"slo_classes": "slo-class", "engine_options": "engine-option"}.get(name, name)
            raise UserError(f"--{flag.replace('_', '-')} applies to serve --engine hf only")
    from superinfer.adapters.manager import UnknownPolicyError
    from superinfer.adapters.sglang.config import ConfigError
    from superinfer.adapters.sglang.launch import ServeError, exec_server, launch_command

    passed = tuple(p["engine_args"])
    for flag, value in (("--host", p["host"]), ("--port", p["port"])):
        passed += (flag, str(value)) if value is not None else ()
    options = {k: p[k] for k in ("policy", "policy_opts", "config_path")}
    try:
        exec_server(*launch_command(passed, **options, kv_policy=p["serve_kv_policy"]))
    except (ConfigError, ServeError, UnknownPolicyError) as exc:
        raise click.ClickException(str(exc)) from None


# -- report, workloads, policies --------------------------------------------------------------


@cli.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", default=None, type=click.Path(path_type=Path),
              help="Where to write [default: the run directory itself for one run, "
              "results/compare for several].")  # fmt: skip
@click.option("--sweep", default=None, type=click.Path(path_type=Path),
              help="A load-sweep CSV (rate_scale, engine, policy, slo_class, slo_attainment) to "
              "plot [default: RUN_DIR/sweep.csv when present].")  # fmt: skip
def report_cmd(run_dirs: tuple[Path, ...], out: Path | None, sweep: Path | None) -> None:
    """Rebuild one run's report.md and plots, or compare several runs side by side."""
    from superinfer.harness.report.markdown import compare_runs, rebuild_report
    from superinfer.harness.report.results import check_out_dir

    if out is not None:
        check_out_dir(out)  # a file, or under one: one line before any work
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


@cli.command("policies")
@click.option("--options", "show_options", is_flag=True, help="Also list each policy's options.")
def list_policies(show_options: bool) -> None:
    """List the registered scheduling policies (and their --policy-opt options)."""
    from superinfer.harness.policies import policy_listing

    click.echo("\n".join(policy_listing(show_options=show_options)))


# -- sweep and fleet --------------------------------------------------------------------------


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@EXECUTOR_OPTIONS
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="Output directory [default: the spec's `out`, else "
              "results/sweeps/<spec name>].")  # fmt: skip
def sweep(spec: str, **p: Any) -> None:
    """Run a grid of bench cells from SPEC.toml; write sweep.csv (one row per cell x SLO class).

    Cells are cached by a hash of their settings, the workload's files and the code under
    OUT/cells/, so an interrupted sweep resumes where it stopped.
    """
    from rich.console import Console

    from superinfer.harness.grid.sweep import run_sweep

    console = Console(stderr=True)
    with progress_bar(console) as bar:
        run = run_sweep(spec, **p, progress=lambda label: progress_task(bar, label),
                        log=console.print)  # fmt: skip
    console.print(
        f"{run.num_cells} cells ({run.num_run} run, {run.num_cached} cached); "
        f"wrote {run.out_dir}/ (sweep.csv, manifest.json, cells/)"
    )


@cli.group()
def fleet() -> None:
    """Fleet planning: how many GPUs meet the SLOs, per engine, policy and layout."""


# fmt: off
@fleet.command("plan")
@click.option("--workload", "--trace", "workload", default="azure", show_default=True,
              help="Workload: a --trace name (azure = conv chat + code batch, azure-conv, "
              "azure-code) or an Azure-format CSV.")
@click.option("--engines", "--engine", "engines", default="sim:trtllm", show_default=True,
              help="Comma-separated sim:* engine ids.")
@click.option("--policies", default=None,
              help="Comma-separated policies; `native` is each engine's own [default: "
              "native,superinfer, skipping those not registered].")
@click.option("--slo", multiple=True,
              help="Replace a class's SLO targets: CLASS:KEY=VALUE[,KEY=VALUE] with KEY ttft_ms, "
              "tpot_ms or deadline_s (`none` drops one). Repeatable.")
@click.option("--target", default=None,
              help="Attainment target per class: CLASS=FRACTION[,...], e.g. chat=0.99,batch=0.99 "
              "[default: 0.99 for every class].")
@cluster_options("h100-80gb", ("Model.", "GPU.", "GPUs per replica (TP)."))
@ROUTER_OPTION
@click.option("--cpu-kv-ratio", default=None, type=float, help="CPU-tier KV over HBM KV.")
@click.option("--rate-scale", default=1.0, show_default=True, type=float, help="Rate multiplier.")
@seed_option()
@click.option("--window-s", default="900", show_default=True,
              help="Measured window, s, or `full` for the whole workload.")
@click.option("--window-start-s", default=None, type=float,
              help="Start of the window [default: the busiest window by tokens arriving].")
@click.option("--warmup-s", default=300.0, show_default=True, type=float,
              help="Traffic before the window simulated but not measured, s.")
@click.option("--gpu-price", default=2.0, show_default=True, type=float,
              help="$ per GPU-hour (an assumed price: cost scales linearly with it).")
@click.option("--min-replicas", default=1, show_default=True, type=int, help="First count.")
@click.option("--max-replicas", default=64, show_default=True, type=int, help="Last count.")
@click.option("--confirm", default=1, show_default=True, type=int,
              help="Counts above a passing count that must pass too (attainment is not "
              "monotone).")
@click.option("--split", is_flag=True, help="Also plan separate clusters, one per SLO class.")
@click.option("--check-full", is_flag=True,
              help="Re-simulate every plan on the whole workload and report its attainment.")
@click.option("--stack", default="none", show_default=True,
              help="full: every cell runs the whole stack where the engine supports each part "
              "(rotation, the reuse predictor's placement, the KV quantization planner), as "
              "bench --stack full; or some of the parts, comma-separated.")
@EXECUTOR_OPTIONS
@click.option("--out", default="results/fleet", show_default=True,
              type=click.Path(file_okay=False),
              help="Directory for plan.csv, plan_detail.csv, search.csv, plan.md, manifest.json, "
              "cells/.")
# fmt: on
def fleet_plan(**p: Any) -> None:
    """Find the fewest replicas (x TP = GPUs) meeting every SLO class's attainment target.

    Searches replica counts with the simulator on the busiest window of the workload, per
    engine x policy, for one shared cluster (and, with --split, separate clusters per class);
    reports GPUs, cost per 1M output tokens and utilisation. Same seed, same plan.
    """
    from rich.console import Console

    from superinfer.harness.engines.registry import parse_stack
    from superinfer.harness.grid.fleet_plan import run_fleet_plan

    console = Console(stderr=True)
    run = {k: p.pop(k) for k in ("executor", "address", "workers", "fresh", "out")}
    p["engines"] = split_names(p["engines"])
    p["policies"] = None if p["policies"] is None else split_names(p["policies"])
    p["stack"] = parse_stack(p["stack"])
    with progress_bar(console) as bar:
        result, _, runner, out_dir = run_fleet_plan(
            p, **run, progress=lambda label: progress_task(bar, label), log=console.print
        )
    print_plan(result.detail)
    console.print(
        f"{runner.num_run} cells run, {runner.num_cached} cached; wrote {out_dir}/ (plan.csv, "
        "plan_detail.csv, search.csv, plan.md, manifest.json)"
    )


# -- cache-eval -------------------------------------------------------------------------------

# fmt: off
@cli.command("cache-eval")
@click.option("--trace", default="mooncake", show_default=True,
              help="mooncake (the Mooncake FAST'25 conversation trace), a generated trace "
              "(gen-system-prompts, gen-multi-turn, gen-agentic, gen-one-shot, gen-phased; seeded "
              "by --seed) or a path to a .jsonl in Mooncake's format (timestamp, input_length, "
              "output_length, hash_ids); several, comma-separated.")
@click.option("--capacities", default="0.01,0.02,0.05,0.1,0.2,0.5", show_default=True,
              help="Comma-separated HBM capacities, as fractions of the trace's unique blocks.")
@click.option("--cpu-ratio", default=4.0, show_default=True, type=float,
              help="CPU tier size as a multiple of the HBM capacity for the with-CPU-tier runs "
              "(0: none). Runs where HBM + CPU hold every unique block are skipped.")
@click.option("--policies", default="lru,lfu,predictor,belady", show_default=True,
              help="Comma-separated cache policies: lru, lfu, arc, s3fifo, predictor, adaptive, "
              "belady, adaptive-sN (adaptive with shadow caches sampled at rate 1/N).")
@click.option("--duration-s", default=None, type=float,
              help="Replay only the first DURATION_S seconds of arrivals [default: all].")
@click.option("--jobs", default=None, type=int,
              help="Worker processes [default: the CPU count, at most 4].")
@seed_option("The predictor's seed and the generated traces'.")
@click.option("--report-only", is_flag=True,
              help="Only rewrite report.md and the plots of --out from its CSVs and manifest.")
@click.option("--out", default="results/cache", show_default=True, type=click.Path(),
              help="Directory to write.")
# fmt: on
def cache_eval(**p: Any) -> None:
    """Replay traces' KV block hashes through LRU, LFU, ARC, S3-FIFO, reuse predictors, Belady.

    Writes hit_rates.csv (trace, policy, capacity_frac, cpu_tier, block_hit_rate,
    token_hit_rate), hit_rates_detail.csv, hit_rates_by_minute.csv, two plots, report.md and
    manifest.json. Definitions: docs/kv-reuse.md.
    """
    from rich.console import Console

    from superinfer.harness.offline.cache_eval import (
        cache_eval_config,
        result_line,
        run_cache_eval,
        write_cache_eval,
        write_cache_report,
    )

    out_dir = Path(p.pop("out"))
    if p.pop("report_only"):
        write_cache_report(out_dir)
        click.echo(f"wrote {out_dir}/report.md and plots")
        return
    config = cache_eval_config(**p)
    console = Console(stderr=True)
    with console.status("replaying") as status:
        loaded, results = run_cache_eval(config, progress=lambda msg: status.update(msg))
    write_cache_eval(out_dir, loaded, config, results, command=sys.argv)
    for r in results:
        click.echo(result_line(r))
    console.print(f"wrote {out_dir}/ (hit_rates.csv, hit_rates_detail.csv, report.md, plots)")


from superinfer.cli_calibrate import calibrate  # noqa: E402
from superinfer.cli_conform import conform  # noqa: E402

cli.add_command(calibrate)
cli.add_command(conform)


def main() -> None:
    """Entry point: run the CLI, turning user mistakes into one-line errors (exit status 2).

    SIGTERM exits through ``SystemExit`` so a run's ``finally`` blocks stop the servers it started
    (:func:`~superinfer.adapters.sglang.server.exit_on_sigterm`; ``serve`` replaces it with the
    web server's own handler)."""
    from superinfer.adapters.sglang.server import exit_on_sigterm

    exit_on_sigterm()
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
