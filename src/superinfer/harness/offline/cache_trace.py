"""The cache evaluation's input and output: a trace's KV block hashes as arrays
(``BlockTrace``), and what one replay counted (``ReplayResult``); model: ``offline.cache_eval``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from superinfer.harness.errors import TraceFormatError, UserError
from superinfer.harness.offline.cache_workloads import GENERATED_TRACES, generate_rows
from superinfer.harness.workload.data import trace_path
from superinfer.harness.workload.traces import MOONCAKE_BLOCK_TOKENS, TraceRow, load_mooncake_jsonl

__all__ = [
    "CACHE_TRACES",
    "COLD_START_S",
    "DEFAULT_CAPACITY_FRACS",
    "DEFAULT_CPU_RATIO",
    "HIT_RATE_COLUMNS",
    "POLICIES",
    "BlockTrace",
    "FloatArray",
    "IntArray",
    "ReplayResult",
    "block_trace",
    "load_cache_trace",
    "prefix_hits",
    "record_hits",
]


POLICIES = ("lru", "lfu", "arc", "s3fifo", "predictor", "adaptive", "belady")
#: The columns of ``hit_rates.csv`` (issue 6), in this order.
HIT_RATE_COLUMNS = (
    "trace",
    "policy",
    "capacity_frac",
    "cpu_tier",
    "block_hit_rate",
    "token_hit_rate",
)
#: ``--trace`` names of traces with block hashes.
CACHE_TRACES = {"mooncake": "conversation_trace.jsonl"}
DEFAULT_CAPACITY_FRACS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
#: CPU tier size as a multiple of the HBM prefix-cache capacity. A DGX H100 has 2 TB of host
#: DRAM for 640 GB of HBM (3.2x), of which weights take a part, so KV space in DRAM is ~4x.
DEFAULT_CPU_RATIO = 4.0
#: The cold-start window reported separately, in s.
COLD_START_S = 600.0

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class BlockTrace:
    """A trace as dense block ids: request r's blocks are ``blocks[offsets[r]:offsets[r+1]]``.

    Attributes:
        name: trace name (the ``trace`` column).
        arrival_s: shape (R,), arrival of each request, s from the first.
        prompt_tokens: shape (R,).
        offsets: shape (R+1,).
        blocks: shape (sum of blocks,), dense block ids 0..U-1 in first-appearance order.
        parent: shape (U,), the block before each block in every prompt holding it, -1 for first.
        depth: shape (U,), the block's index in the prompts holding it.
        tokens: shape (U,), tokens of the block where it first appeared (< block_tokens when it
            was the partial last block).
        block_tokens: tokens per full block.
    """

    name: str
    arrival_s: FloatArray
    prompt_tokens: IntArray
    offsets: IntArray
    blocks: IntArray
    parent: IntArray
    depth: IntArray
    tokens: IntArray
    block_tokens: int

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)

    @property
    def num_unique(self) -> int:
        return len(self.parent)


def block_trace(
    rows: Sequence[TraceRow],
    name: str,
    *,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    source: object = "trace",
) -> BlockTrace:
    """Dense-id form of ``rows`` (sorted by arrival, as loaded).

    Raises:
        TraceFormatError: a request without block hashes, a hash repeated in one request, or a
            hash preceded by different hashes in two requests (not prefix-chained).
    """
    ids: dict[int, int] = {}
    parent: list[int] = []
    depth: list[int] = []
    tokens: list[int] = []
    flat: list[int] = []
    offsets = [0]
    for row in rows:
        if not row.block_hashes:
            raise TraceFormatError(source, row.line, "hash_ids", "no block hashes")
        if len(set(row.block_hashes)) != len(row.block_hashes):
            raise TraceFormatError(source, row.line, "hash_ids", "a hash repeats in one request")
        prev = -1
        last = len(row.block_hashes) - 1
        for d, h in enumerate(row.block_hashes):
            b = ids.get(h)
            if b is None:
                b = ids[h] = len(parent)
                parent.append(prev)
                depth.append(d)
                tokens.append(
                    row.prompt_tokens - block_tokens * last if d == last else block_tokens
                )
            elif parent[b] != prev:
                raise TraceFormatError(
                    source,
                    row.line,
                    "hash_ids",
                    f"hash {h} follows a different block than where it first appeared "
                    "(hashes are not prefix-chained)",
                )
            flat.append(b)
            prev = b
        offsets.append(len(flat))
    t0 = rows[0].arrival_s if rows else 0.0
    return BlockTrace(
        name=name,
        arrival_s=np.array([r.arrival_s - t0 for r in rows], dtype=np.float64),
        prompt_tokens=np.array([r.prompt_tokens for r in rows], dtype=np.int64),
        offsets=np.array(offsets, dtype=np.int64),
        blocks=np.array(flat, dtype=np.int64),
        parent=np.array(parent, dtype=np.int64),
        depth=np.array(depth, dtype=np.int64),
        tokens=np.array(tokens, dtype=np.int64),
        block_tokens=block_tokens,
    )


def load_cache_trace(trace: str, *, duration_s: float | None = None, seed: int = 0) -> BlockTrace:
    """The trace named ``trace`` (``mooncake``, or a generated ``gen-*`` one, made from
    ``seed``; :mod:`superinfer.harness.offline.cache_workloads`) or a Mooncake-format
    ``.jsonl`` path.

    Raises:
        UserError: unknown name, or an empty window.
        DataError: the file is missing.
        TraceFormatError: malformed file.
    """
    block_tokens = MOONCAKE_BLOCK_TOKENS
    if trace in GENERATED_TRACES:
        spec = GENERATED_TRACES[trace]
        rows, name, block_tokens = generate_rows(spec, seed), trace, spec.block_tokens
        path: str | Path = trace
    elif trace in CACHE_TRACES:
        path, name = trace_path(CACHE_TRACES[trace]), trace
    elif Path(trace).is_file():
        path, name = Path(trace), Path(trace).stem
    else:
        known = ", ".join(CACHE_TRACES)
        raise UserError(
            f"unknown trace {trace!r}: give {known} or a Mooncake .jsonl file "
            f"(or a generated trace: {', '.join(GENERATED_TRACES)})"
        )
    if trace not in GENERATED_TRACES:
        rows = load_mooncake_jsonl(Path(path))
    if duration_s is not None:
        if not duration_s > 0:
            raise UserError(f"--duration-s must be > 0, got {duration_s}")
        rows = [r for r in rows if r.arrival_s - rows[0].arrival_s < duration_s]
    if not rows:
        raise UserError(f"trace {trace!r} has no request in the window")
    return block_trace(rows, name, block_tokens=block_tokens, source=path)


@dataclass(slots=True)
class ReplayResult:
    """Counts of one replay; rates are derived properties.

    Attributes:
        policy: ``lru``, ``lfu``, ``predictor`` or ``belady``.
        capacity_frac: HBM capacity as a fraction of the trace's unique blocks.
        hbm_blocks, cpu_blocks: capacities in blocks (``cpu_blocks == 0``: no CPU tier).
        total_blocks, hit_blocks, cpu_hit_blocks: blocks requested, prefix hits (HBM + CPU),
            and of those the ones served from CPU.
        total_tokens, hit_tokens, cpu_hit_tokens: the same in prompt tokens.
        offloaded_blocks: HBM -> CPU copies.
        minute_*: shape (minutes,), the same counts per minute of arrival.
        predictor: the HBM model's :meth:`ReusePredictor.metrics` at the end (predictor only).
        cpu_predictor: the CPU-tier model's metrics (predictor with a CPU tier only).
        wall_s: wall time of the replay, s.
        trace: the trace's name (set by ``run_cache_eval``).
    """

    policy: str
    capacity_frac: float
    hbm_blocks: int
    cpu_blocks: int
    total_blocks: int = 0
    hit_blocks: int = 0
    cpu_hit_blocks: int = 0
    total_tokens: int = 0
    hit_tokens: int = 0
    cpu_hit_tokens: int = 0
    offloaded_blocks: int = 0
    minute_blocks: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    minute_hit_blocks: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    minute_tokens: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    minute_hit_tokens: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    minute_requests: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    predictor: dict[str, Any] | None = None
    cpu_predictor: dict[str, Any] | None = None
    wall_s: float = 0.0
    trace: str = ""

    @property
    def cpu_tier(self) -> bool:
        return self.cpu_blocks > 0

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else math.nan

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.total_tokens if self.total_tokens else math.nan

    def window(self, minutes: int) -> tuple[float, float]:
        """Block and token hit rates over the first ``minutes`` minutes of arrivals."""
        b, hb = self.minute_blocks[:minutes].sum(), self.minute_hit_blocks[:minutes].sum()
        t, ht = self.minute_tokens[:minutes].sum(), self.minute_hit_tokens[:minutes].sum()
        return (hb / b if b else math.nan, ht / t if t else math.nan)


def prefix_hits(tier: Sequence[int], blocks: Sequence[int]) -> tuple[int, int]:
    """One request's prefix hit before it runs: ``(cached, in_hbm)`` blocks.

    Args:
        tier: where each unique block lives now, indexed by block id: ``0`` not cached, ``1`` HBM,
            ``2`` CPU (a ``bytearray`` or list; the replays' own bookkeeping).
        blocks: the request's block ids in prompt order.

    Returns:
        ``cached``: the longest prefix found in either tier; ``in_hbm``: the longest prefix found
        in HBM alone (``in_hbm <= cached``). A prefix stops at the first block missing from the
        tier(s), as a radix cache matches (SGLang ``RadixCache.match_prefix``).
    """
    cached = 0
    while cached < len(blocks) and tier[blocks[cached]]:
        cached += 1
    in_hbm = 0
    while in_hbm < len(blocks) and tier[blocks[in_hbm]] == 1:
        in_hbm += 1
    return cached, in_hbm


def record_hits(res: ReplayResult, trace: BlockTrace, k: IntArray, k_hbm: IntArray) -> None:
    """Fill ``res`` from per-request prefix hits ``k`` (HBM or CPU) and ``k_hbm`` (HBM only)."""
    n = np.diff(trace.offsets)
    bt = trace.block_tokens
    hit_tok = np.minimum(k * bt, trace.prompt_tokens)
    hbm_tok = np.minimum(k_hbm * bt, trace.prompt_tokens)
    res.total_blocks = int(n.sum())
    res.hit_blocks = int(k.sum())
    res.cpu_hit_blocks = int((k - k_hbm).sum())
    res.total_tokens = int(trace.prompt_tokens.sum())
    res.hit_tokens = int(hit_tok.sum())
    res.cpu_hit_tokens = int((hit_tok - hbm_tok).sum())
    minute = (trace.arrival_s // 60.0).astype(np.int64)
    size = int(minute.max()) + 1 if len(minute) else 0
    res.minute_requests = np.bincount(minute, minlength=size)
    res.minute_blocks = np.bincount(minute, weights=n, minlength=size).astype(np.int64)
    res.minute_hit_blocks = np.bincount(minute, weights=k, minlength=size).astype(np.int64)
    res.minute_tokens = np.bincount(minute, weights=trace.prompt_tokens, minlength=size).astype(
        np.int64
    )
    res.minute_hit_tokens = np.bincount(minute, weights=hit_tok, minlength=size).astype(np.int64)
