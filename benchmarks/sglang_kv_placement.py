"""The prefix-cache placement plugins on the real SGLang server, each policy's order against the
others, on a generated trace whose prefix sharing reaches the server's radix cache.

A ``gen-*`` block trace (``harness.offline.cache_workloads``; default ``gen-multi-turn``: users'
sessions of several turns, each turn's prompt the session's history, think times between turns)
is regenerated with ``--block-tokens`` tokens per hashed block (16 by default instead of 64, so
its prompts fit a small CPU model's context), cut to its first ``--window-s`` seconds, and
replayed ``--speedup`` times faster than recorded (3 by default: 900 s of the trace in 300 s)
through the ``sglang`` engine with ``--engine-option prompt=ids``: each
block hash becomes one fixed block of token ids (``workload.prompts.hashed_prompt_ids``), so two
prompts share exactly the tokens their hashes share. The server runs SGLang's CPU recipe (the
tiny-Llama fixture unless ``--model-path``), its radix cache held to ``--max-total-tokens``
tokens so that it must evict, ``--enable-cache-report`` so that each response says how many
prompt tokens came from the cache, and our plugin with ``fcfs`` scheduling; only the placement
policy changes between runs (``--kv-policies``, default ``lru,reuse``: the plugin's LRU order
and the learned reuse predictor, ``policy_core.kv_placement``). Runs alternate the policies
(``lru, reuse, lru, ...``) for ``--repeats`` rounds, so a slow spell of the host lands on both.

First, the same block stream is replayed offline through ``cache-eval``'s block caches
(``replay_blocks``: ``lru``, ``arc``, ``s3fifo``, ``learned``, the reuse predictor's model,
``hazard``, the reuse-hazard expert, and ``adaptive``) at ``--max-total-tokens /
--block-tokens`` blocks (or at each of ``--offline-capacities``), a prediction of each order's
prefix hit rate written to ``OUT/offline.csv`` (``policy, capacity_blocks, prefix_hit_rate``)
before any server runs (``--offline-only`` stops there; ``--rows-from DIR`` instead only
rebuilds ``OUT/runs.csv`` from an earlier run's folders).

Writes ``OUT/runs.csv`` (one row per run: ``kv_policy, repeat, n_requests, n_finished,
n_failed, prompt_tokens, prompt_tokens_cached, prefix_hit_rate, ttft_mean_ms, ttft_p50_ms,
ttft_p99_ms, wall_s``, over the finished requests, then ``placements, placement_us_mean,
placement_us_p50, placement_us_p99``: the plugin's placement calls and the µs each took, from
its stats file; ``hit_q1`` to ``hit_q4``: the prefix hit rate of each quarter of the finished
requests in arrival order) and each run's ``summary.csv`` and
``requests.parquet`` under ``OUT/<kv_policy>-<repeat>/``::

    .venv/bin/python benchmarks/sglang_kv_placement.py --repeats 3 --out results/sglang-kv-placement
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from superinfer.harness.bench import run_bench
from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.offline.cache_replay_blocks import replay_blocks
from superinfer.harness.offline.cache_trace import block_trace
from superinfer.harness.offline.cache_workloads import GENERATED_TRACES, generated_workload
from superinfer.harness.report.metrics import add_latency_columns
from superinfer.harness.workload.traces import TraceRow
from superinfer.harness.workload.workload import Workload

RUN_COLUMNS = ["kv_policy", "repeat", "n_requests", "n_finished", "n_failed", "prompt_tokens",
               "prompt_tokens_cached", "prefix_hit_rate", "ttft_mean_ms", "ttft_p50_ms",
               "ttft_p99_ms", "wall_s", "placements", "placement_us_mean", "placement_us_p50",
               "placement_us_p99", "hit_q1", "hit_q2", "hit_q3", "hit_q4"]  # fmt: skip


OFFLINE_POLICIES = ("lru", "arc", "s3fifo", "learned", "hazard", "adaptive")


def offline_rates(
    workload: Workload, capacity_blocks: int, policies: tuple[str, ...] = OFFLINE_POLICIES
) -> list[dict[str, object]]:
    """Prompt-token prefix hit rate of each offline block cache (``cache-eval``'s
    ``replay_blocks`` over ``block_trace``) on ``workload``'s block stream, at its own arrivals."""
    rows = [TraceRow(r.arrival_s, r.prompt_tokens, r.output_tokens, i + 1, r.block_hashes)
            for i, r in enumerate(workload.requests)]  # fmt: skip
    trace = block_trace(rows, workload.name, block_tokens=workload.requests[0].hash_block_tokens)
    return [
        {"policy": policy, "capacity_blocks": capacity_blocks,
         "prefix_hit_rate": replay_blocks(trace, policy, capacity_blocks / trace.num_unique,
                                          capacity_blocks).token_hit_rate}
        for policy in policies
    ]  # fmt: skip


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The options that make the run's workload (``--trace``, ``--block-tokens``,
    ``--window-s``, ``--speedup``, ``--max-prompt-tokens``, ``--output-tokens``, ``--seed``),
    shared with ``sglang_kv_placement_gaps.py``, which rebuilds a run's workload."""
    parser.add_argument("--trace", default="gen-multi-turn")
    parser.add_argument("--block-tokens", type=int, default=16)
    parser.add_argument("--window-s", type=float, default=900.0, help="of the trace's time")
    parser.add_argument("--speedup", type=float, default=3.0, help="replay this much faster")
    parser.add_argument("--max-prompt-tokens", type=int, default=1900)
    parser.add_argument("--output-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)


def workload_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Workload:
    """The workload :func:`add_workload_args`' options name (an unknown ``--trace`` is a
    parser error)."""
    if args.trace not in GENERATED_TRACES:
        parser.error(f"--trace: one of {', '.join(GENERATED_TRACES)}")
    return generated_workload(args.trace, block_tokens=args.block_tokens,
                              window_s=args.window_s, max_prompt_tokens=args.max_prompt_tokens,
                              output_tokens=args.output_tokens, seed=args.seed,
                              speedup=args.speedup)  # fmt: skip


def run_row(requests: pd.DataFrame) -> dict[str, float]:
    """The ``runs.csv`` figures of one run's requests table (over its finished requests)."""
    reqs = add_latency_columns(requests)
    done = reqs[reqs["status"] == "finished"]
    prompt = float(done["prompt_tokens"].sum())
    cached = float(done["cached_tokens"].sum()) if "cached_tokens" in done else float("nan")
    ttft = done["ttft_ms"].to_numpy(dtype=float)
    ordered = done.sort_values("arrival_s", kind="stable")
    quarters = {}
    for q, part in enumerate(np.array_split(np.arange(len(ordered)), 4), start=1):
        rows = ordered.iloc[part]
        tokens = float(rows["prompt_tokens"].sum())
        hit = (
            float(rows["cached_tokens"].sum()) / tokens
            if tokens and "cached_tokens" in rows
            else float("nan")
        )
        quarters[f"hit_q{q}"] = hit
    return {
        "n_requests": len(reqs), "n_finished": len(done),
        "n_failed": int((reqs["status"] == "failed").sum()),
        "prompt_tokens": prompt, "prompt_tokens_cached": cached,
        "prefix_hit_rate": cached / prompt if prompt else float("nan"),
        "ttft_mean_ms": float(ttft.mean()) if ttft.size else float("nan"),
        "ttft_p50_ms": float(np.percentile(ttft, 50)) if ttft.size else float("nan"),
        "ttft_p99_ms": float(np.percentile(ttft, 99)) if ttft.size else float("nan"),
        **quarters,
    }  # fmt: skip


def placement_cost(info: dict[str, Any]) -> dict[str, float]:
    """The plugin's placement calls and their wall time (``superinfer_kv_placement`` alone, µs:
    mean, and p50 / p99 over the last 4,096) from a run's ``plugin_stats``; NaN without them."""
    cell = next(iter(info.get("cells", {}).values()), {})
    stats = cell.get("sglang", {}).get("plugin_stats") or {}
    us = stats.get("placement_us") or {}
    count = us.get("count") or 0
    nan = float("nan")
    return {
        "placements": stats.get("placements", nan),
        "placement_us_mean": us["sum"] / count if count else nan,
        "placement_us_p50": us.get("p50") or nan,
        "placement_us_p99": us.get("p99") or nan,
    }


def run_record(
    kv_policy: str, repeat: int, wall_s: float, requests: pd.DataFrame, info: dict[str, Any]
) -> dict[str, Any]:
    """One ``runs.csv`` row: the run's names, its wall time, :func:`run_row` and
    :func:`placement_cost`."""
    return {"kv_policy": kv_policy, "repeat": repeat, "wall_s": wall_s, **run_row(requests),
            **placement_cost(info)}  # fmt: skip


def rebuild_rows(runs: Path, policies: list[str], repeats: int, out: Path) -> int:
    """``out/runs.csv`` again from the ``<kv_policy>-<repeat>`` folders of an earlier run
    (``requests.parquet``, ``info.json``; ``wall_s`` from its ``runs.csv``), in run order; a
    missing folder is skipped with a note."""
    old = pd.read_csv(runs / "runs.csv") if (runs / "runs.csv").exists() else pd.DataFrame()
    walls = {(r.kv_policy, r.repeat): r.wall_s for r in old.itertuples()} if len(old) else {}
    rows = []
    for repeat in range(repeats):
        for kv_policy in policies:
            folder = runs / f"{kv_policy}-{repeat}"
            if not (folder / "requests.parquet").exists():
                print(f"{folder}: no requests.parquet, skipped", flush=True)
                continue
            info = json.loads((folder / "info.json").read_text())
            wall = walls.get((kv_policy, repeat), float("nan"))
            requests = pd.read_parquet(folder / "requests.parquet")
            rows.append(run_record(kv_policy, repeat, wall, requests, info))
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows)[RUN_COLUMNS].to_csv(out / "runs.csv", index=False, float_format="%.6g")
    print(f"wrote {out / 'runs.csv'} ({len(rows)} runs)", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(parser)
    parser.add_argument("--max-total-tokens", type=int, default=8192)
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--kv-policies", default="lru,reuse")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--offline-only", action="store_true")
    parser.add_argument("--rows-from", type=Path, default=None,
                        help="rebuild OUT/runs.csv from the run folders of an earlier --out "
                        "(no server runs; wall_s from its runs.csv)")  # fmt: skip
    parser.add_argument("--offline-capacities", default=None,
                        help="comma-separated capacities in blocks for offline.csv [default: "
                        "--max-total-tokens / --block-tokens]")  # fmt: skip
    args = parser.parse_args()
    if args.rows_from is not None:  # no workload, no offline replay, no server
        return rebuild_rows(args.rows_from, args.kv_policies.split(","), args.repeats, args.out)
    workload = workload_from_args(parser, args)
    print(f"{len(workload.requests)} requests, {workload.details['left_out']} left out "
          f"(prompt > {args.max_prompt_tokens})", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    capacities = ([int(c) for c in args.offline_capacities.split(",")] if args.offline_capacities
                  else [args.max_total_tokens // args.block_tokens])  # fmt: skip
    offline = pd.DataFrame([row for c in capacities for row in offline_rates(workload, c)])
    offline.to_csv(args.out / "offline.csv", index=False, float_format="%.6g")
    print(offline.to_string(index=False), flush=True)
    if args.offline_only:
        return 0
    sglang_args = (f"--max-total-tokens {args.max_total_tokens} --enable-cache-report "
                   f"--context-length {args.context_length}")  # fmt: skip
    if args.model_path:
        sglang_args += f" --model-path {args.model_path}"
    rows = []
    for repeat in range(args.repeats):
        for kv_policy in args.kv_policies.split(","):
            config = BenchConfig(
                engines=("sglang",), policies=("fcfs",), kv_policy=kv_policy, seed=args.seed,
                engine_options={"sglang_args": sglang_args, "prompt": "ids"},
            )  # fmt: skip
            start = time.perf_counter()
            result = run_bench(config, workload=workload)
            wall = time.perf_counter() - start
            folder = args.out / f"{kv_policy}-{repeat}"
            folder.mkdir(exist_ok=True)
            result.summary.to_csv(folder / "summary.csv", index=False)
            result.requests.to_parquet(folder / "requests.parquet")
            (folder / "info.json").write_text(json.dumps(result.info, indent=1, default=str))
            rows.append(run_record(kv_policy, repeat, round(wall, 1), result.requests,
                                   result.info))  # fmt: skip
            print(rows[-1], flush=True)
            pd.DataFrame(rows)[RUN_COLUMNS].to_csv(args.out / "runs.csv", index=False,
                                                   float_format="%.6g")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
