"""Offline prefix-cache evaluator: replay a trace's KV block hashes through LRU, LFU, the reuse
predictor and Belady's MIN at several capacities, with and without a CPU tier.

Model of the replay (the same for every policy):

- Requests are processed one at a time in arrival order. A request's **prefix hit** is the
  longest leading run of its blocks that are cached (HBM or CPU); a block after the first miss
  is recomputed even if cached, as in vLLM's and SGLang's prefix caches. Then every block of the
  request is in HBM (hits loaded, misses computed), and the policy brings the cache back within
  capacity. The capacity counts blocks kept for reuse; the running request's own KV is not
  counted (all requests are done before the next arrives).
- ``block_hit_rate`` = prefix-hit blocks / blocks requested. ``token_hit_rate`` = sum over
  requests of ``min(k * block_tokens, prompt_tokens)`` / prompt tokens, for a k-block hit (the
  last block is usually partial), as in ``shared/data/traces/README.md``.
- **With a CPU tier** (``cpu_tier = True``), CPU memory holds ``cpu_ratio`` x the HBM capacity.
  HBM evictions go to CPU (exclusive tiers); a CPU hit counts as a hit in both rates (it saves
  the prefill) and costs a PCIe load, counted separately in ``hit_rates_detail.csv``
  (``cpu_block_hit_rate``, ``offloaded_blocks``).
- LRU, LFU and the predictor evict through the same :class:`PlacementPlanner` (leaves only, lowest
  keep-score first, deeper first on ties); they differ only in the score: LRU the last access
  instant, LFU the accesses since insertion (ties by recency), the predictor P(reuse within its
  horizon) after its LRU cold start.
- Belady's MIN (Belady, IBM Systems Journal 1966) keeps the blocks with the nearest next use
  (bypassing blocks never used again), ties broken deeper-first. A block's parent is in every
  request that holds the block, so its next use is never later: MIN's cache is prefix-closed and
  its plain hits are prefix hits; MIN maximizes plain hits, which bound every policy's prefix
  hits, so it is optimal here. With a CPU tier, its HBM holds the ``C_hbm`` nearest next uses
  and the union the ``C_hbm + C_cpu`` nearest (MIN at each capacity; the union may prefetch
  freely), an upper bound for both rates.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import pandas as pd

from superinfer.harness.errors import DataError, UserError
from superinfer.harness.offline.cache_replay import belady_prefix_hits, replay, replay_ordered
from superinfer.harness.offline.cache_report import plot, render_cache_report, targets_table
from superinfer.harness.offline.cache_trace import (
    CACHE_TRACES,
    COLD_START_S,
    DEFAULT_CAPACITY_FRACS,
    DEFAULT_CPU_RATIO,
    HIT_RATE_COLUMNS,
    POLICIES,
    BlockTrace,
    ReplayResult,
    block_trace,
    load_cache_trace,
)
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, manifest, write_atomic
from superinfer.policy_core.reuse import ReusePredictorConfig
from superinfer.policy_core.reuse_adaptive import adaptive_sample_rate

__all__ = [
    "CACHE_TRACES",
    "HIT_RATE_COLUMNS",
    "POLICIES",
    "BlockTrace",
    "CacheEvalConfig",
    "ReplayResult",
    "belady_prefix_hits",
    "cache_eval_config",
    "block_trace",
    "load_cache_trace",
    "replay",
    "replay_ordered",
    "result_line",
    "run_cache_eval",
    "write_cache_eval",
    "write_cache_report",
]

# -------------------------------------------------------------------------------------------------
# The evaluation grid and its files
# -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheEvalConfig:
    """What ``superinfer cache-eval`` runs.

    Attributes:
        trace: ``mooncake``, a generated ``gen-*`` trace or a Mooncake-format ``.jsonl`` path;
            several, comma-separated.
        capacity_fracs: HBM capacities as fractions of the trace's unique blocks.
        cpu_ratio: CPU tier size as a multiple of the HBM capacity (0: no CPU-tier runs).
        policies: policies to replay (of :data:`POLICIES`, or ``adaptive-sN``: the adaptive
            predictor with shadow caches sampled at rate 1/N).
        duration_s: replay only the first ``duration_s`` seconds of arrivals (``None``: all).
        jobs: worker processes.
        seed: the predictor's sampling seed and the generated traces' seed.
    """

    trace: str = "mooncake"
    capacity_fracs: tuple[float, ...] = DEFAULT_CAPACITY_FRACS
    cpu_ratio: float = DEFAULT_CPU_RATIO
    policies: tuple[str, ...] = POLICIES
    duration_s: float | None = None
    jobs: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for p in self.policies:
            if p not in POLICIES and adaptive_sample_rate(p) is None:
                raise UserError(
                    f"unknown cache policy {p!r}; known: {', '.join(POLICIES)}, adaptive-sN"
                )
        if not self.policies:
            raise UserError("--policies is empty")
        if not self.capacity_fracs:
            raise UserError("--capacities is empty")
        for f in self.capacity_fracs:
            if not 0 < f <= 1:
                raise UserError(f"capacity fractions must be in (0, 1], got {f}")
        if not (math.isfinite(self.cpu_ratio) and self.cpu_ratio >= 0):
            raise UserError(f"--cpu-ratio must be >= 0 and finite, got {self.cpu_ratio}")
        if self.jobs < 1:
            raise UserError(f"--jobs must be >= 1, got {self.jobs}")


def _one(args: tuple[BlockTrace, str, float, int, int, int]) -> ReplayResult:
    trace, policy, frac, hbm, cpu, seed = args
    cfg = ReusePredictorConfig(seed=seed) if policy == "predictor" else None
    res = replay(trace, policy, frac, hbm, cpu, predictor_config=cfg)
    res.trace = trace.name
    return res


def run_cache_eval(
    config: CacheEvalConfig, progress: Callable[[str], None] | None = None
) -> tuple[list[BlockTrace], list[ReplayResult]]:
    """Replay every trace x policy x capacity x (with, without CPU tier) of ``config``
    (``config.trace``: one name or several, comma-separated).

    With-CPU-tier runs where HBM + CPU hold every unique block are skipped: nothing is ever
    dropped, so every policy hits every reuse (the infinite-cache rate).

    Returns:
        The traces and the results, ordered by trace, CPU tier, capacity, then policy.
    """
    traces = [
        load_cache_trace(name, duration_s=config.duration_s, seed=config.seed)
        for name in trace_names(config.trace)
    ]
    tiers = [0.0] + ([config.cpu_ratio] if config.cpu_ratio > 0 else [])
    tasks = []
    for trace in traces:
        for ratio in tiers:
            for frac in sorted(config.capacity_fracs):
                hbm = max(1, int(frac * trace.num_unique))
                if ratio and hbm + int(ratio * hbm) >= trace.num_unique:
                    continue  # the tiers hold every block: the infinite-cache rate
                for policy in config.policies:
                    tasks.append((trace, policy, frac, hbm, int(ratio * hbm), config.seed))
    results: list[ReplayResult] = []
    if config.jobs == 1:
        for i, task in enumerate(tasks):
            if progress:
                progress(f"replay {i + 1}/{len(tasks)}: {task[0].name} {task[1]} at {task[2]:g}")
            results.append(_one(task))
    else:
        with ProcessPoolExecutor(max_workers=config.jobs) as pool:
            for i, res in enumerate(pool.map(_one, tasks)):
                if progress:
                    progress(f"replay {i + 1}/{len(tasks)} done")
                results.append(res)
    return traces, results


def trace_names(trace: str) -> list[str]:
    """The comma-separated names of ``--trace`` (at least one).

    Raises:
        UserError: no name.
    """
    names = [t.strip() for t in trace.split(",") if t.strip()]
    if not names:
        raise UserError("--trace is empty")
    return names


def hit_rate_table(results: Sequence[ReplayResult]) -> pd.DataFrame:
    """``hit_rates.csv``: exactly :data:`HIT_RATE_COLUMNS`."""
    return pd.DataFrame(
        [
            (r.trace, r.policy, r.capacity_frac, r.cpu_tier, r.block_hit_rate, r.token_hit_rate)
            for r in results
        ],
        columns=list(HIT_RATE_COLUMNS),
    )


def detail_table(results: Sequence[ReplayResult]) -> pd.DataFrame:
    """``hit_rates_detail.csv``: the HBM / CPU split, transfers, cold start and predictor state."""
    minutes = int(COLD_START_S // 60)
    rows = []
    for r in results:
        cold_b, cold_t = r.window(minutes)
        p = r.predictor or {}
        rows.append(
            {
                **dict(zip(HIT_RATE_COLUMNS, hit_rate_table([r]).iloc[0], strict=True)),
                "hbm_blocks": r.hbm_blocks,
                "cpu_blocks": r.cpu_blocks,
                "hbm_block_hit_rate": (r.hit_blocks - r.cpu_hit_blocks) / r.total_blocks,
                "cpu_block_hit_rate": r.cpu_hit_blocks / r.total_blocks,
                "hbm_token_hit_rate": (r.hit_tokens - r.cpu_hit_tokens) / r.total_tokens,
                "cpu_token_hit_rate": r.cpu_hit_tokens / r.total_tokens,
                "offloaded_blocks": r.offloaded_blocks,
                "cpu_loaded_blocks": r.cpu_hit_blocks,
                "first_10min_block_hit_rate": cold_b,
                "first_10min_token_hit_rate": cold_t,
                "predictor_switched_at_s": p.get("switched_at_s"),
                "predictor_labels": p.get("num_labels"),
                "predictor_horizon_s": p.get("horizon_s"),
                "wall_s": r.wall_s,
                "us_per_request": 1e6 * r.wall_s / max(int(r.minute_requests.sum()), 1),
                "adaptive_leader": p.get("leader"),
                "adaptive_switches": p.get("num_switches"),
            }
        )  # fmt: skip
    return pd.DataFrame(rows)


def minute_table(results: Sequence[ReplayResult]) -> pd.DataFrame:
    """``hit_rates_by_minute.csv``: hit rates per minute of arrival (cold start and drift)."""
    rows = []
    for r in results:
        for m in range(len(r.minute_blocks)):
            b, t = r.minute_blocks[m], r.minute_tokens[m]
            rows.append(
                {
                    "trace": r.trace,
                    "policy": r.policy,
                    "capacity_frac": r.capacity_frac,
                    "cpu_tier": r.cpu_tier,
                    "minute": m,
                    "requests": int(r.minute_requests[m]),
                    "block_hit_rate": r.minute_hit_blocks[m] / b if b else math.nan,
                    "token_hit_rate": r.minute_hit_tokens[m] / t if t else math.nan,
                }
            )
    return pd.DataFrame(rows)


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    df.to_csv(path, index=False, float_format=CSV_FLOAT_FORMAT)


def _write_text(text: str, path: Path) -> None:
    path.write_text(text, encoding="utf-8")


def write_cache_eval(
    out_dir: Path,
    traces: BlockTrace | Sequence[BlockTrace],
    config: CacheEvalConfig,
    results: Sequence[ReplayResult],
    *,
    command: list[str] | None = None,
) -> dict[str, Path]:
    """Write ``hit_rates.csv``, ``hit_rates_detail.csv``, ``hit_rates_by_minute.csv`` and
    ``manifest.json`` into ``out_dir`` (each atomically), then ``targets.csv``, the report and
    the plots from them."""
    traces = [traces] if isinstance(traces, BlockTrace) else list(traces)
    for r in results:
        if not r.trace and len(traces) == 1:
            r.trace = traces[0].name
    info = {
        "config": asdict(config),
        "traces": [
            {
                "name": t.name,
                "requests": t.num_requests,
                "unique_blocks": t.num_unique,
                "block_references": len(t.blocks),
                "block_tokens": t.block_tokens,
                "minutes": float(t.arrival_s[-1] / 60) if t.num_requests else 0.0,
            }
            for t in traces
        ],
        "predictor": {
            f"{r.trace}/{r.capacity_frac:g}/{'cpu' if r.cpu_tier else 'hbm'}/{r.policy}": {
                "hbm_model": r.predictor,
                "cpu_model": r.cpu_predictor,
            }
            for r in results
            if r.predictor and r.policy in ("predictor", "adaptive")
        },
    }
    meta = manifest(info, command=command)
    paths: dict[str, Path] = {}
    for name, df in (
        ("hit_rates.csv", hit_rate_table(results)),
        ("hit_rates_detail.csv", detail_table(results)),
        ("hit_rates_by_minute.csv", minute_table(results)),
    ):
        paths[name] = out_dir / name
        write_atomic(paths[name], partial(_write_csv, df))
    write_atomic(
        out_dir / "manifest.json",
        partial(_write_text, json.dumps(meta, indent=2, default=str) + "\n"),
    )
    write_cache_report(out_dir)
    names = ("report.md", "manifest.json", "hit_rates.png", "targets.csv")
    paths.update({n: out_dir / n for n in names})
    return paths


def write_cache_report(out_dir: Path, trace: BlockTrace | None = None) -> None:
    """(Re)write ``targets.csv``, ``report.md`` and the plots of ``out_dir`` from its CSVs and
    manifest only (``trace`` is ignored: kept for callers).

    Raises:
        DataError: a file of the directory missing or unreadable, ``hit_rates.csv`` without
            one of :data:`HIT_RATE_COLUMNS`, a manifest without ``config.capacity_fracs``;
            the message names the file.
    """
    name = "manifest.json"
    try:  # each file named in its error
        meta = json.loads((out_dir / name).read_text(encoding="utf-8"))
        name = "hit_rates.csv"
        table = pd.read_csv(out_dir / name)
        name = "hit_rates_detail.csv"
        detail = pd.read_csv(out_dir / name)
        name = "hit_rates_by_minute.csv"
        minutes = pd.read_csv(out_dir / name)
    except (OSError, ValueError) as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{out_dir / name}: not a cache-eval directory ({why})") from None
    if missing := [c for c in HIT_RATE_COLUMNS if c not in table.columns]:
        raise DataError(f"{out_dir / 'hit_rates.csv'}:1: field {missing[0]!r}: missing column")
    fracs = (meta.get("config") or {}).get("capacity_fracs") if isinstance(meta, dict) else None
    if not isinstance(fracs, list) or not fracs:
        raise DataError(f"{out_dir / 'manifest.json'}: no config.capacity_fracs (not cache-eval's)")
    target = 0.1 if 0.1 in fracs else sorted(fracs)[0]
    targets = targets_table(table)
    write_atomic(out_dir / "targets.csv", partial(_write_csv, targets))
    plot(table, minutes, out_dir, target)
    report = render_cache_report(table, detail, targets, meta, target)
    write_atomic(out_dir / "report.md", partial(_write_text, report))


def cache_eval_config(
    *,
    trace: str,
    capacities: str,
    cpu_ratio: float,
    policies: str,
    duration_s: float | None,
    jobs: int | None,
    seed: int,
) -> CacheEvalConfig:
    """The evaluation ``superinfer cache-eval`` options describe (``capacities`` and ``policies``
    comma-separated; ``jobs`` ``None``: the CPU count, at most 4).

    Raises:
        UserError: a capacity that is not a number.
    """
    fracs = []
    for text in (t.strip() for t in capacities.split(",")):
        if not text:
            continue
        try:
            fracs.append(float(text))
        except ValueError:
            raise UserError(f"--capacities: {text!r} is not a number") from None
    return CacheEvalConfig(
        trace=trace,
        capacity_fracs=tuple(fracs),
        cpu_ratio=cpu_ratio,
        policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
        duration_s=duration_s,
        jobs=jobs if jobs is not None else max(1, min(4, os.cpu_count() or 1)),
        seed=seed,
    )


def result_line(r: ReplayResult) -> str:
    """One replay's hit rates as a line of text."""
    return (
        f"{r.policy:10s} capacity {r.capacity_frac:<5g} cpu_tier {str(r.cpu_tier):5s} "
        f"blocks {100 * r.block_hit_rate:6.2f}%  tokens {100 * r.token_hit_rate:6.2f}%"
    )
