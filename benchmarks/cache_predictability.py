"""How much of the LRU -> Belady gap a policy could close if it knew, in hindsight, everything
about the *classes* of blocks a cache can observe, but nothing about individual blocks (issue 22).

Both hindsight policies are :class:`~superinfer.policy_core.reuse_hazard.HazardCache` (the
online hazard expert's buckets, request-level eviction and interpolated per-class tables) with
its per-class table computed once, before the replay, from the whole trace's intervals (the
gaps between two accesses of a block; an interval is classed by the block's state when it
opens, and a block's class cannot change between its accesses) and never refitted:

- ``hazard-hindsight``: the hit density ``rho`` (``reuse_hazard.rho_index``) of each class's
  Kaplan-Meier gap law, the intervals never closed censored at the trace's end: the online
  expert's model with no learning lag and no sampling noise.
- ``class-oracle``: Belady's MIN with each block's next use replaced by its class's conditional
  expected time to the next access given its age, ``E[T - a | T > a]`` over the whole trace's
  intervals of the class, an interval never closed counting as a gap of ``dead_gap_s`` (default
  the trace's duration, longer than any gap the trace can show): the block expected to come
  back last is evicted.

Class definitions (``CLASSINGS``), from what a cache sees of a block after its last access:
``accesses`` (``floor(log2(accesses so far))``, capped at 3: the online expert's),
``depth`` (``floor(log2(depth + 1))``, capped at 7), ``children`` (distinct child blocks seen so
far: 0, 1, 2-3, 4+), ``last_gap`` (the gap the last access closed: none, < 4 s, < 16 s, < 64 s,
< 256 s, longer; a block's usual think time), products of these, and ``none`` (one class).

Reference rows from the same trace and capacity: ``lru``, ``lfu``, ``arc``, ``s3fifo``,
``adaptive`` and ``belady`` (``cache_replay.replay``, as ``superinfer cache-eval``) and
``hazard-online`` (``HazardCache`` as shipped). ``gap_closed = (rate - best simple) / (belady -
best simple)``, best simple the best of LRU, LFU, ARC and S3-FIFO. No CPU tier.

Writes ``results/cache/predictability.csv`` (``predictability_<trace>.csv`` for a ``--trace``
other than ``mooncake``).

    python benchmarks/cache_predictability.py [--trace mooncake] [--capacity 0.1,0.02,0.01]
"""

from __future__ import annotations

import argparse
import os
import runpy
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from superinfer.harness.offline.cache_replay import next_use, replay
from superinfer.harness.offline.cache_trace import BlockTrace, load_cache_trace
from superinfer.policy_core.reuse_hazard import AGE_EDGES_S, HazardCache, hazard_tables, rho_index

#: ``belady_threshold`` and ``auc`` of the gap analysis (a script, not a module).
GAP = runpy.run_path(str(Path(__file__).with_name("cache_gap_analysis.py")))
#: Observable features, each as (name, number of buckets).
FEATURES = {"accesses": 4, "depth": 8, "children": 4, "last_gap": 6}
#: Class definitions: the features whose buckets (mixed radix, in this order) make a class.
CLASSINGS: dict[str, tuple[str, ...]] = {
    "none": (),
    "accesses": ("accesses",),
    "depth": ("depth",),
    "children": ("children",),
    "accesses*depth": ("accesses", "depth"),
    "accesses*children": ("accesses", "children"),
    "depth*children": ("depth", "children"),
    "accesses*depth*children": ("accesses", "depth", "children"),
    "last_gap": ("last_gap",),
    "accesses*last_gap": ("accesses", "last_gap"),
    "accesses*depth*children*last_gap": ("accesses", "depth", "children", "last_gap"),
}
SIMPLE = ("lru", "lfu", "arc", "s3fifo")
METHODS = ("hazard-hindsight", "class-oracle")


def class_of(
    classing: Sequence[str], accesses: int, depth: int, children: int, last_gap_s: float
) -> int:
    """The class (0 .. num_classes(classing) - 1) of a block accessed ``accesses`` (>= 1)
    times so far, at ``depth`` (0 = a prompt's first block), with ``children`` distinct child
    blocks seen so far, whose last access closed a gap of ``last_gap_s`` s (< 0: it was the
    first)."""
    g = 0 if last_gap_s < 0 else 1 + sum(last_gap_s >= e for e in (4.0, 16.0, 64.0, 256.0))
    bucket = {
        "accesses": min(accesses.bit_length() - 1, 3),
        "depth": min((depth + 1).bit_length() - 1, 7),
        "children": min(children.bit_length(), 3),
        "last_gap": g,
    }
    c = 0
    for f in classing:
        c = c * FEATURES[f] + bucket[f]
    return c


def num_classes(classing: Sequence[str]) -> int:
    """Classes of ``classing`` (the product of its features' bucket counts; 1 for none)."""
    return int(np.prod([FEATURES[f] for f in classing]))


def intervals(
    trace: BlockTrace, classing: Sequence[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every interval of the trace (one per block reference): ``(cls, length_s, closed)``,
    each of shape (sum of blocks,): the class the reference leaves its block in (accesses
    counted through it, children seen through its request), the gap to the block's next
    reference (``closed``) or the time from it to the last arrival (never referenced again)."""
    nxt = next_use(trace)
    arrival = trace.arrival_s
    r_of = np.repeat(np.arange(trace.num_requests), np.diff(trace.offsets))
    closed = nxt < trace.num_requests
    end = np.where(closed, arrival[np.minimum(nxt, trace.num_requests - 1)], arrival[-1])
    length = end - arrival[r_of]
    count, fan = [0] * trace.num_unique, [0] * trace.num_unique
    last, gap = [0.0] * trace.num_unique, [-1.0] * trace.num_unique
    t = arrival.tolist()
    parent, depth = trace.parent.tolist(), trace.depth.tolist()
    off, flat = trace.offsets.tolist(), trace.blocks.tolist()
    cls = np.zeros(len(flat), dtype=np.int64)
    for r in range(trace.num_requests):
        blocks = flat[off[r] : off[r + 1]]
        for b in blocks:
            if not count[b] and parent[b] >= 0:
                fan[parent[b]] += 1
            gap[b] = t[r] - last[b] if count[b] else -1.0
            last[b] = t[r]
            count[b] += 1
        for o, b in enumerate(blocks, start=off[r]):
            cls[o] = class_of(classing, count[b], depth[b], fan[b], gap[b])
    return cls, length, closed


def _bins(length: np.ndarray) -> np.ndarray:
    edges = np.asarray(AGE_EDGES_S)
    return np.clip(np.searchsorted(edges, length, side="right") - 1, 0, len(edges) - 1)


def hindsight_tables(
    cls: np.ndarray, length: np.ndarray, closed: np.ndarray, k: int, method: str, dead_gap_s: float
) -> np.ndarray:
    """Shape (k, len(AGE_EDGES_S) + 1): each class's score at the points ``x`` of
    :func:`~superinfer.policy_core.reuse_hazard.hazard_tables` (higher = keep): ``rho`` for
    ``hazard-hindsight``, ``-E[T - x | T > x]`` (s) for ``class-oracle`` (module docstring).

    Raises:
        ValueError: an unknown method.
    """
    nb = len(AGE_EDGES_S)
    out = np.zeros((k, nb + 1))
    for c in range(k):
        m = cls == c
        if method == "hazard-hindsight":
            d = np.bincount(_bins(length[m & closed]), minlength=nb)
            _, s, integral = hazard_tables(d, np.bincount(_bins(length[m & ~closed]), minlength=nb))
            out[c] = rho_index(s, integral)
        elif method == "class-oracle":
            gaps = np.where(closed[m], length[m], dead_gap_s)
            _, s, integral = hazard_tables(np.bincount(_bins(gaps), minlength=nb), np.zeros(nb))
            with np.errstate(divide="ignore", invalid="ignore"):
                residual = np.where(s > 0, (integral[-1] - integral) / s, 0.0)
            out[c] = -residual
        else:
            raise ValueError(f"unknown method {method!r}")
    return out


class HindsightCache(HazardCache):
    """:class:`HazardCache` scoring each request's deepest cached block by a fixed per-class
    table (``table[class]`` at the points ``AGE_EDGES_S`` plus one, interpolated in the block's
    age, s; the least is evicted) with classes from :func:`class_of`; never refitted."""

    name = "hindsight"

    def __init__(
        self,
        capacity: int,
        parent: Sequence[int],
        depth: Sequence[int],
        classing: Sequence[str],
        table: np.ndarray,
    ) -> None:
        super().__init__(capacity, parent, depth, classes=len(table))
        self.classing = tuple(classing)
        self.fan = [0] * len(self.parent)
        self.gap = [-1.0] * len(self.parent)  # the gap the block's last access closed, s
        x, _, _ = hazard_tables(np.zeros(len(AGE_EDGES_S)), np.zeros(len(AGE_EDGES_S)))
        self.x, self.rho, self.fitted = x, np.asarray(table, dtype=np.float64), True
        self._x, self._rho = self.x.tolist(), self.rho.tolist()

    def cached_class(self, b: int) -> int:
        return class_of(self.classing, self.count[b], self.depth[b], self.fan[b], self.gap[b])

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        for b in blocks:
            if self.count[b]:
                self.gap[b] = now_s - self.last[b]
            elif self.parent[b] >= 0:
                self.fan[self.parent[b]] += 1
        return super().request(blocks, now_s)

    def _fit(self, now_s: float) -> None:
        """No refit: the table is the whole trace's."""


def block_hit_rate(
    trace: BlockTrace,
    cache: HazardCache,
    thr: np.ndarray | None = None,
    stats: dict[str, float] | None = None,
) -> float:
    """Share of the trace's block references that hit the prefix ``cache`` holds before each
    request (``cache_eval``'s block hit rate with no CPU tier).

    With ``thr`` (shape (R,): after each request, the farthest next use Belady's MIN holds,
    ``cache_gap_analysis.belady_threshold``) and a :class:`HindsightCache`, ``stats`` gets, over
    its evictions: ``kept_share`` (the share whose next use is no later than ``thr``: blocks
    MIN would still hold, as in ``gap_analysis.csv``), ``auc_table`` (AUC of the table's score
    at the eviction for telling those from the rest) and ``auc_bayes_class_age`` (AUC of the
    best score any function of (class, age bin) can give on these evictions: the in-sample
    share kept per cell; an upper bound for the class knowledge on these decisions)."""
    off, flat, arrival = trace.offsets.tolist(), trace.blocks.tolist(), trace.arrival_s.tolist()
    nx = next_use(trace).tolist() if thr is not None else []
    pending = [trace.num_requests] * trace.num_unique
    ev: list[tuple[float, int, float]] = []  # (kept, class, age) per eviction
    hits = 0
    for r in range(trace.num_requests):
        blocks = flat[off[r] : off[r + 1]]
        hits += cache.prefix_hit(blocks)
        victims = cache.request(blocks, arrival[r])
        if thr is not None:
            for o, b in enumerate(blocks, start=off[r]):
                pending[b] = nx[o]
            lim = min(int(thr[r]), trace.num_requests - 1)
            for v in victims:
                ev.append((pending[v] <= lim, cache.cached_class(v), arrival[r] - cache.last[v]))
    if stats is not None and ev:
        kept, cls, age = (np.asarray(a) for a in zip(*ev, strict=True))
        score = np.array(
            [np.interp(a, cache.x, cache.rho[c]) for c, a in zip(cls, age, strict=True)]
        )
        cell = pd.Series(cls * (len(AGE_EDGES_S) + 1) + _bins(age))
        label = kept.astype(bool)
        stats["kept_share"] = float(label.mean())
        stats["auc_table"] = GAP["auc"](score, label)
        stats["auc_bayes_class_age"] = GAP["auc"](
            cell.map(pd.Series(label).groupby(cell).mean()).to_numpy(), label
        )
    return hits / len(flat) if flat else float("nan")


def cell_rows(trace: BlockTrace, frac: float, dead_gap_s: float) -> list[dict[str, object]]:
    """The rows of one (trace, capacity) cell: references, then both methods per classing
    (with :func:`block_hit_rate`'s eviction stats)."""
    cap = max(1, int(frac * trace.num_unique))
    parent, depth = trace.parent.tolist(), trace.depth.tolist()
    thr = GAP["belady_threshold"](trace, next_use(trace), cap)
    rows: list[dict[str, object]] = []

    def add(method: str, classes: str, k: int, cache: HazardCache | None = None) -> None:
        """Replay ``method`` (``cache``, else ``replay``'s policy) and append its row."""
        start, stats = time.process_time(), dict[str, float]()
        if cache is None:
            rate = replay(trace, method, frac, cap).block_hit_rate
        else:
            hindsight = isinstance(cache, HindsightCache)
            rate = block_hit_rate(trace, cache, thr if hindsight else None, stats)
        rows.append({"trace": trace.name, "capacity_frac": frac, "capacity_blocks": cap,
                     "method": method, "classes": classes, "num_classes": k,
                     "block_hit_rate": rate, **stats,
                     "cpu_s": round(time.process_time() - start, 1),
                     "load_avg_1m": os.getloadavg()[0]})  # fmt: skip
        print(rows[-1], flush=True)

    for p in (*SIMPLE, "adaptive", "belady"):
        add(p, "", 0)
    add("hazard-online", "accesses", 4, HazardCache(cap, parent, depth))
    for name, classing in CLASSINGS.items():
        cls, length, closed = intervals(trace, classing)
        k = num_classes(classing)
        for method in METHODS:
            table = hindsight_tables(cls, length, closed, k, method, dead_gap_s)
            add(method, name, k, HindsightCache(cap, parent, depth, classing, table))
    rate = {str(r["method"]): float(str(r["block_hit_rate"])) for r in rows if not r["classes"]}
    best = max(rate[p] for p in SIMPLE)
    span = rate["belady"] - best
    for r in rows:
        r["best_simple_block_hit_rate"] = best
        gain = float(str(r["block_hit_rate"])) - best
        r["gap_closed"] = gain / span if span > 0 else np.nan
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake")
    parser.add_argument("--capacity", default="0.1,0.02,0.01", help="comma list of fractions")
    parser.add_argument(
        "--dead-gap-s", type=float, help="class-oracle's never-closed gap, s (default: duration)"
    )
    parser.add_argument("--out", default="results/cache")
    args = parser.parse_args()
    trace = load_cache_trace(args.trace)
    dead = args.dead_gap_s if args.dead_gap_s is not None else float(trace.arrival_s[-1])
    rows = [r for f in args.capacity.split(",") for r in cell_rows(trace, float(f), dead)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (
        "predictability.csv" if args.trace == "mooncake" else f"predictability_{args.trace}.csv"
    )
    pd.DataFrame(rows).to_csv(path, index=False, float_format="%.6g")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
