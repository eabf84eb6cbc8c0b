"""Scheduling overhead: microseconds per ``schedule`` call, per policy, over queue sizes.

A small engine double drives each policy through a steady state: ``n_running`` requests decode
or prefill (``max_num_seqs = n_running``, so a request is admitted only when one finishes),
``n_waiting`` wait (arrivals top the queue up after every step), every lifecycle hook fires as
an engine would call it, and time advances by a roofline-like step time. Only the ``schedule``
call is timed (``time.perf_counter_ns``); building the state and applying the decision are not.
KV memory is ample, so nothing is preempted.

The double is a saturated engine, not a sized one: the queue is topped up to ``n_waiting``
after every step, so arrivals equal what leaves it (admissions and rejections) and a request
waits ``n_waiting`` / admissions per second, minutes at these sizes: every chat request's TTFT
is out of reach by the time its turn could come (``superinfer`` and ``oracle`` reject them as
hopeless), and the batch requests in ``superinfer``'s queue are mostly aged. That is the
regime the rows time. The step time is ``BASE_STEP_S + PREFILL_TOKEN_S * prefill tokens +
DECODE_SEQ_S * decodes`` at 256 running, with both per-unit costs divided by ``n_running / 256``
above it (a larger engine), so a full batch's step takes as long at every size; the first fill
spreads its arrivals over the ``FILL_SPAN_S`` before the start; and the calls of the first
``--warmup-s`` simulated seconds are not timed (the first fill's chat requests are rejected in
the first calls, and their replacements arrive at one instant, so rejections come in waves
for some seconds). ``--legacy-double`` runs the double as it was before (per-unit costs of the
256 engine at every size: 2,560 decodes took 0.28 s a step, 2.8x the chat TPOT target, and
``superinfer``'s TPOT protection drained the running set to a few hundred; a 60 s fill span and
no ``--warmup-s``, so at 2,560 running the timed calls began 20 calls in, among the
rejection waves). Like every engine here, the double hands the policy
its id -> view map and the change set since its previous state (``StepState.views``,
``queue_of``, ``changes``, decode advances included: ``policy_core.changes.ViewTracker``, issue
21), built outside the timed call.

Writes ``results/benchmarks/policy_overhead.csv`` with columns ``policy, n_running, n_waiting,
median_us, p99_us`` (wall clock, ``time.perf_counter_ns``), then ``cpu_median_us, cpu_p99_us``
(the calling thread's CPU time, ``time.thread_time_ns``: on a shared machine the wall-clock tail
includes time the process spent descheduled), ``mean_us`` and ``calls``; one row per policy and
size. The sizes are 64 / 1,024, 256 running / 4,096 waiting, 1,024 / 16,384 and 2,560 / 40,960
(the issue 21 targets are at the second and the last). Each size and policy is measured
``--repeats`` times (a fresh engine each time, the same seeded requests); the csv keeps the run
with the smallest median (on a shared machine the least disturbed one) and
``policy_overhead_runs.csv`` every run (the same columns plus ``run``). ``policy_overhead.png``
plots the median per call against the waiting-queue size, log-log, one line per policy, with
O(n) and O(log n) slopes for reference (``--plot-only`` redraws it from the csv). ``superinfer``
and ``oracle`` run with
``max_waiting_per_tier`` raised above the queue size, so the rows time scheduling, not load
shedding (with the default bound of 4,096 per tier they would shed at the 10x size).

Usage::

    python benchmarks/policy_overhead.py [--calls 2000] [--repeats 3] [--policies fcfs,superinfer]
        [--sizes 256x4096,2560x40960] [--warmup-s 30] [--legacy-double] [--block-tokens 16]
        [--out DIR] [--plot-only]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import random
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from superinfer.adapters.manager import available_policies, make_policy
from superinfer.policy_core.changes import ViewTracker
from superinfer.policy_core.types import (
    SLO,
    KVLocation,
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)
from superinfer.policy_core.validation import check_decision

CHAT = SLO("chat", ttft_ms=1000.0, tpot_ms=100.0, priority=0)
BATCH = SLO("batch", deadline_s=600.0, priority=1)
BLOCK_TOKENS = 16
SIZES = ((64, 1024), (256, 4096), (1024, 16384), (2560, 40960))
#: Timed calls are ``--calls`` at this many running requests and fewer in proportion above it.
CALLS_AT_RUNNING = 256
#: The double's step time, s: ``BASE_STEP_S + PREFILL_TOKEN_S * prefill tokens + DECODE_SEQ_S *
#: decodes`` at ``REFERENCE_RUNNING`` running requests; both per-unit costs shrink in proportion
#: at larger sizes (a larger engine), so a full batch's step takes as long at every size.
BASE_STEP_S, PREFILL_TOKEN_S, DECODE_SEQ_S = 0.02, 1.4e-4, 1e-4
REFERENCE_RUNNING = 256
#: The first fill's arrivals are spread over this many seconds before the start (a queue
#: built up over time), longer than ``superinfer``'s ``aging_s``: its steady state at these
#: sizes, where the queue never drains, has the oldest requests aged from the start.
FILL_SPAN_S = 180.0
#: Untimed simulated seconds before the timed calls (``--warmup-s``): past the initial queue's
#: transient (module docstring).
WARMUP_S = 30.0
#: Options that make a policy's row time scheduling rather than shedding (module docstring).
BENCH_OPTIONS: dict[str, dict[str, str]] = {
    "superinfer": {"max_waiting_per_tier": str(1 << 20)},
    "oracle": {"max_waiting_per_tier": str(1 << 20)},
}


@dataclass
class _Req:
    rid: str
    arrival_s: float
    prompt: int
    output: int
    slo: SLO
    computed: int = 0
    generated: int = 0
    first_token_s: float | None = None
    view: RequestView | None = None

    def make_view(self) -> RequestView:
        if self.view is None:
            blocks = -(-self.computed // BLOCK_TOKENS)
            self.view = RequestView(
                request_id=self.rid,
                arrival_s=self.arrival_s,
                prompt_tokens=self.prompt,
                max_output_tokens=1024,
                slo=self.slo,
                computed_tokens=self.computed,
                generated_tokens=self.generated,
                first_token_s=self.first_token_s,
                kv_location=KVLocation.HBM if blocks else KVLocation.UNALLOCATED,
                kv_blocks=blocks,
            )
        return self.view


class _Engine:
    """A one-replica engine double: queues, decisions applied exactly, hooks fired."""

    def __init__(
        self,
        policy: Any,
        specs: Iterator[_Req],
        n_running: int,
        n_waiting: int,
        *,
        legacy: bool = False,
    ) -> None:
        self.policy = policy
        # Step costs per token and per decode, s: a full batch costs the same at every size
        # (module docstring); the legacy double kept the 256-running engine's costs at every
        # size, so 2,560 decodes took 0.28 s a step, 2.8x the chat TPOT target.
        scale = 1.0 if legacy else REFERENCE_RUNNING / n_running
        self.fill_span_s = 60.0 if legacy else FILL_SPAN_S
        self.prefill_token_s, self.decode_seq_s = PREFILL_TOKEN_S * scale, DECODE_SEQ_S * scale
        self.specs = iter(specs)
        self.n_running, self.n_waiting = n_running, n_waiting
        self.now = 0.0
        self.running: dict[str, _Req] = {}
        self.waiting: dict[str, _Req] = {}
        self.tracker = ViewTracker()
        for _ in range(n_running):  # start warm: a full running batch, mid-decode
            req = next(self.specs)
            req.computed = req.prompt
            req.generated = 1
            req.first_token_s = 0.0
            self.policy.on_request_arrived(req.make_view(), 0.0)
            req.view = None
            self.running[req.rid] = req
        self._refill()

    def _refill(self) -> None:
        # The first fill spreads arrivals over the past minute, as a queue built up over time
        # would be (all at one instant, they would all age at one instant too).
        first = not self.waiting
        missing = self.n_waiting - len(self.waiting)
        for i in range(missing):
            req = next(self.specs)
            req.arrival_s = self.now - (
                self.fill_span_s * (missing - i) / missing if first else 0.0
            )
            self.waiting[req.rid] = req
            self.policy.on_request_arrived(req.make_view(), req.arrival_s)

    def state(self) -> StepState:
        return self.tracker.stamp(self._state())

    def _state(self) -> StepState:
        return StepState(
            now_s=self.now,
            step_index=0,
            waiting=tuple(r.make_view() for r in self.waiting.values()),
            running=tuple(r.make_view() for r in self.running.values()),
            swapped=(),
            free_hbm_blocks=1 << 30,
            total_hbm_blocks=1 << 30,
            free_cpu_blocks=0,
            total_cpu_blocks=0,
            block_size_tokens=BLOCK_TOKENS,
            token_budget=8 * self.n_running,
            max_num_seqs=self.n_running,
        )

    def apply(self, decision: ScheduleDecision) -> None:
        for rid in decision.reject:
            req = self.waiting.pop(rid)
            self.policy.on_request_aborted(req.make_view(), self.now, decision.reject[rid])
        for rid in decision.preempt:
            req = self.running.pop(rid)
            req.computed, req.view = 0, None
            self.waiting = {rid: req, **self.waiting}
        for rid in decision.admit:
            self.running[rid] = self.waiting.pop(rid)
        prefill = decode = 0
        finished = []
        for rid, n in decision.num_tokens.items():
            req = self.running[rid]
            pending = req.prompt + req.generated - req.computed
            if n == 1 and req.generated:
                decode += 1
            else:
                prefill += n
            req.computed += n
            req.view = None
            if n == pending:
                req.generated += 1
                if req.first_token_s is None:
                    req.first_token_s = self.now
                if req.generated >= req.output:
                    finished.append(req)
        duration = BASE_STEP_S + self.prefill_token_s * prefill + self.decode_seq_s * decode
        self.now += duration
        for req in finished:
            del self.running[req.rid]
            self.policy.on_request_finished(req.make_view(), self.now)
        self.policy.on_step_finished(
            StepStats(
                now_s=self.now,
                step_index=0,
                duration_s=duration,
                num_steps=1,
                num_prefill_tokens=prefill,
                num_decode_tokens=decode,
                num_running=len(decision.num_tokens),
                num_waiting=len(self.waiting),
                used_hbm_blocks=0,
                total_hbm_blocks=1 << 30,
                finished_ids=tuple(r.rid for r in finished),
            )
        )
        self._refill()


class _Specs:
    """An endless, seeded stream of requests (70 % chat, 30 % batch, Azure-like lengths);
    ``lengths`` holds the true output length of every request drawn so far (the oracle's)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lengths: dict[str, int] = {}
        self.count = 0

    def __iter__(self) -> _Specs:
        return self

    def __next__(self) -> _Req:
        rng = self.rng
        chat = rng.random() < 0.7
        prompt = int(rng.lognormvariate(6.8, 0.7)) + 1 if chat else int(rng.uniform(500, 7000))
        output = int(rng.lognormvariate(4.8, 0.9)) + 2 if chat else int(rng.uniform(2, 60))
        rid = f"r{self.count}"
        self.count += 1
        self.lengths[rid] = min(output, 1000)
        return _Req(rid, 0.0, min(prompt, 8000), min(output, 1000), CHAT if chat else BATCH)


def measure(
    name: str,
    n_running: int,
    n_waiting: int,
    calls: int,
    warmup: int,
    *,
    warmup_s: float = 0.0,
    legacy: bool = False,
) -> tuple[list[float], list[float]]:
    """Wall-clock and thread-CPU microseconds of each timed ``schedule`` call of ``name``,
    after ``warmup`` untimed calls and then as many more as it takes to reach ``warmup_s`` of
    simulated time (``legacy``: the double before its step costs scaled with size)."""
    specs = _Specs(seed=0)
    first = next(specs)  # the oracle is built before the engine draws the rest
    cls = available_policies()[name].load()
    extra = {}
    if getattr(cls, "needs_output_lengths", False):
        extra["output_tokens"] = specs.lengths  # filled as requests are drawn
    policy = make_policy(cls, BENCH_OPTIONS.get(name, {}), name, extra=extra)
    engine = _Engine(policy, itertools.chain([first], specs), n_running, n_waiting, legacy=legacy)
    wall: list[float] = []
    cpu: list[float] = []
    i = 0
    while len(wall) < calls:
        state = engine.state()
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        decision = policy.schedule(state)
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        if i < 3:
            check_decision(state, decision)
        if i >= warmup and state.now_s >= warmup_s:
            wall.append((t1 - t0) / 1e3)
            cpu.append((c1 - c0) / 1e3)
        engine.apply(decision)
        i += 1
    return wall, cpu


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _row(name: str, n_running: int, n_waiting: int, us: list[float], cpu: list[float]) -> dict:
    return {
        "policy": name,
        "n_running": n_running,
        "n_waiting": n_waiting,
        "median_us": round(statistics.median(us), 1),
        "p99_us": round(_p99(us), 1),
        "cpu_median_us": round(statistics.median(cpu), 1),
        "cpu_p99_us": round(_p99(cpu), 1),
        "mean_us": round(statistics.fmean(us), 1),
        "calls": len(us),
    }


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot(csv_path: Path, png_path: Path) -> None:
    """Median µs per call vs waiting-queue size, log-log, per policy, with O(n) and O(log n)
    reference slopes through the first size's ``superinfer`` point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    by_policy: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        by_policy.setdefault(r["policy"], []).append((int(r["n_waiting"]), float(r["median_us"])))
    fig, ax = plt.subplots(figsize=(7, 5))
    for name, points in sorted(by_policy.items()):
        points.sort()
        ax.plot(*zip(*points, strict=True), marker="o", label=name)
    sizes = sorted({int(r["n_waiting"]) for r in rows})
    anchor = sorted(by_policy.get("superinfer") or next(iter(by_policy.values())))[0]
    n0, y0 = anchor
    ax.plot(sizes, [y0 * n / n0 for n in sizes], "k--", lw=1, label="O(n) slope")
    ax.plot(sizes, [y0 * math.log(n) / math.log(n0) for n in sizes], "k:", lw=1,
            label="O(log n) slope")  # fmt: skip
    ax.axhline(100, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("waiting requests (running = waiting / 16)")
    ax.set_ylabel("median µs per schedule call")
    ax.set_title("Policy overhead per scheduling call")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls at 256 running")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls first")
    parser.add_argument("--repeats", type=int, default=3, help="runs per policy and size")
    parser.add_argument("--policies", default="", help="comma-separated (default: all)")
    parser.add_argument("--out", default="results/benchmarks", help="output directory")
    parser.add_argument(
        "--sizes",
        default=",".join(f"{r}x{w}" for r, w in SIZES),
        help="comma-separated RUNNINGxWAITING sizes; calls shrink in proportion to RUNNING",
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=WARMUP_S,
        help="untimed simulated seconds first (after --warmup calls)",
    )
    parser.add_argument(
        "--legacy-double",
        action="store_true",
        help="the double before issue 21's third pass: step costs not scaled with size, "
        "no --warmup-s (reproduces the earlier rows)",
    )
    parser.add_argument(
        "--block-tokens",
        type=int,
        default=16,
        help="the double's KV block (page) size, tokens: 16 as vLLM's; 1 is SGLang's default "
        "page size, where every decode needs a new page at every token",
    )
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from the csv")
    args = parser.parse_args(argv)
    if args.block_tokens < 1:
        parser.error("--block-tokens must be >= 1")
    global BLOCK_TOKENS  # the engine double reads it
    BLOCK_TOKENS = args.block_tokens
    out = Path(args.out)
    path = out / "policy_overhead.csv"
    if args.plot_only:
        plot(path, out / "policy_overhead.png")
        return 0
    names = [p for p in args.policies.split(",") if p] or sorted(available_policies())
    try:
        sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: expected RUNNINGxWAITING[,RUNNINGxWAITING]")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    rows, runs = [], []
    for n_running, n_waiting in sizes:
        calls = min(args.calls, max(args.calls * CALLS_AT_RUNNING // n_running, 1))
        warmup = min(args.warmup, max(args.warmup * CALLS_AT_RUNNING // n_running, 1))
        for name in names:
            best = None
            for run in range(args.repeats):
                us, cpu = measure(
                    name,
                    n_running,
                    n_waiting,
                    calls,
                    warmup,
                    warmup_s=0.0 if args.legacy_double else args.warmup_s,
                    legacy=args.legacy_double,
                )
                row = _row(name, n_running, n_waiting, us, cpu)
                runs.append({**row, "run": run})
                if best is None or row["median_us"] < best["median_us"]:
                    best = row
                print(
                    f"{name:11s} {n_running:5d} running {n_waiting:6d} waiting run {run}: "
                    f"median {row['median_us']:9.1f} us  p99 {row['p99_us']:9.1f} us  "
                    f"(cpu {row['cpu_median_us']:.1f} / {row['cpu_p99_us']:.1f})",
                    file=sys.stderr,
                )
            assert best is not None
            rows.append(best)
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(path, rows)
    _write_csv(out / "policy_overhead_runs.csv", runs)
    plot(path, out / "policy_overhead.png")
    print(f"wrote {path}, policy_overhead_runs.csv and policy_overhead.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
