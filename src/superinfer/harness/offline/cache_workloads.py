"""Seeded generators of block traces with known reuse structure (``superinfer cache-eval --trace
gen-...``); produced at run time, never stored. Each is a :class:`GenSpec` (every knob named, so
anyone can make more: ``generate(replace(GENERATED_TRACES[name], ...), seed)``).

Blocks are ``block_tokens`` tokens; a prompt's last block is partial (1 to ``block_tokens``
tokens, uniform). Arrivals are Poisson; every random draw comes from one
``numpy.random.default_rng(seed)``, so a (spec, seed) pair always gives the same trace.

- ``gen-system-prompts``: many users share a few system prompts (Zipf popularity); each request
  is a system prompt plus a unique user part (no other reuse).
- ``gen-multi-turn``: sessions over a few shared system prompts; a session has a geometric
  number of turns, each request re-sends the whole conversation; the next turn comes after a
  think time ``min_think_s + lognormal``.
- ``gen-agentic``: agent tasks re-read one of a few long shared tool contexts plus their own
  growing history in a loop; each step comes after a tool call (``min_think_s`` + exponential).
- ``gen-one-shot``: unique prompts, no reuse at all.
- ``gen-phased``: phases of ``phase_s`` seconds cycling system-prompts, multi-turn, agentic
  traffic (each phase with fresh prefixes), over a steady one-shot background: the structure
  shifts mid-trace.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from superinfer.harness.errors import UserError
from superinfer.harness.workload.traces import TraceRow
from superinfer.harness.workload.workload import CHAT_SLO, Source, Workload
from superinfer.sim.request import RequestSpec

__all__ = ["GENERATED_TRACES", "GenSpec", "generate_rows", "generated_workload"]


@dataclass(frozen=True, slots=True)
class GenSpec:
    """One generated workload (units: s, blocks).

    Attributes:
        kind: ``system-prompts``, ``multi-turn``, ``agentic``, ``one-shot`` or ``phased``.
        duration_s: arrivals in [0, duration_s).
        rate: arrivals per s of requests (system-prompts, one-shot) or sessions / tasks.
        num_prefixes: shared system prompts / tool contexts.
        prefix_blocks: (min, max) blocks of a shared prefix.
        zipf_a: popularity exponent of the shared prefixes (rank r has weight r^-a).
        unique_blocks: (min, max) blocks of a request's own part (user text, turn, tool output).
        mean_turns: mean turns per session / steps per task (geometric, >= 1).
        min_think_s: least time between two turns / steps.
        think_median_s, think_sigma: lognormal think time above the minimum (multi-turn);
            agentic: exponential with mean ``think_median_s``.
        phase_s: phase length (phased).
        background_rate: one-shot requests per s under the phases (phased).
        block_tokens: tokens per block.
    """

    kind: str
    duration_s: float = 1800.0
    rate: float = 2.0
    num_prefixes: int = 8
    prefix_blocks: tuple[int, int] = (8, 32)
    zipf_a: float = 1.0
    unique_blocks: tuple[int, int] = (2, 8)
    mean_turns: float = 4.0
    min_think_s: float = 20.0
    think_median_s: float = 30.0
    think_sigma: float = 1.0
    phase_s: float = 600.0
    background_rate: float = 0.5
    block_tokens: int = 64


#: The built-in generated traces by ``--trace`` name.
GENERATED_TRACES: dict[str, GenSpec] = {
    "gen-system-prompts": GenSpec("system-prompts", rate=2.0, num_prefixes=16),
    "gen-multi-turn": GenSpec("multi-turn", rate=0.4, num_prefixes=4, prefix_blocks=(4, 12)),
    "gen-agentic": GenSpec(
        "agentic",
        rate=0.06,
        num_prefixes=3,
        prefix_blocks=(48, 96),
        mean_turns=8.0,
        min_think_s=2.0,
        think_median_s=6.0,
        unique_blocks=(1, 4),
    ),  # fmt: skip
    "gen-one-shot": GenSpec("one-shot", rate=2.0, unique_blocks=(4, 40)),
    "gen-phased": GenSpec("phased", duration_s=2400.0, phase_s=600.0),
}


class _Ids:
    def __init__(self) -> None:
        self.next = 1

    def take(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def _arrivals(rng: np.random.Generator, rate: float, t0: float, t1: float) -> list[float]:
    n = int(rng.poisson(rate * (t1 - t0)))
    return sorted(rng.uniform(t0, t1, size=n).tolist())


def _prefixes(
    rng: np.random.Generator, spec: GenSpec, ids: _Ids
) -> tuple[list[list[int]], np.ndarray]:
    lo, hi = spec.prefix_blocks
    pre = [ids.take(int(rng.integers(lo, hi + 1))) for _ in range(spec.num_prefixes)]
    w = np.arange(1, spec.num_prefixes + 1, dtype=np.float64) ** -spec.zipf_a
    return pre, w / w.sum()


def _own(rng: np.random.Generator, spec: GenSpec, ids: _Ids) -> list[int]:
    lo, hi = spec.unique_blocks
    return ids.take(int(rng.integers(lo, hi + 1)))


def _component(
    rng: np.random.Generator, spec: GenSpec, kind: str, ids: _Ids, t0: float, t1: float
) -> list[tuple[float, list[int]]]:
    """(arrival, blocks) of one component's requests arriving in [t0, t1)."""
    out: list[tuple[float, list[int]]] = []
    if kind == "one-shot":
        return [(t, _own(rng, spec, ids)) for t in _arrivals(rng, spec.rate, t0, t1)]
    pre, w = _prefixes(rng, spec, ids)
    if kind == "system-prompts":
        for t in _arrivals(rng, spec.rate, t0, t1):
            out.append((t, pre[int(rng.choice(len(pre), p=w))] + _own(rng, spec, ids)))
        return out
    if kind not in ("multi-turn", "agentic"):
        raise UserError(f"unknown generated workload kind {kind!r}")
    for t in _arrivals(rng, spec.rate, t0, t1):
        ctx = pre[int(rng.choice(len(pre), p=w))] + _own(rng, spec, ids)
        turns = int(rng.geometric(1.0 / max(spec.mean_turns, 1.0)))
        for _ in range(turns):
            if t >= t1:
                break
            out.append((t, list(ctx)))
            ctx = ctx + _own(rng, spec, ids)  # the answer and the next user turn / tool output
            if kind == "multi-turn":
                gap = spec.think_median_s * float(rng.lognormal(0.0, spec.think_sigma))
            else:
                gap = float(rng.exponential(spec.think_median_s))
            t += spec.min_think_s + gap
    return out


def generate_rows(spec: GenSpec, seed: int = 0) -> list[TraceRow]:
    """The requests of ``spec``, sorted by arrival, as trace rows with prefix-chained hashes.

    Raises:
        UserError: an unknown kind or a non-positive duration or rate.
    """
    if not spec.duration_s > 0 or not spec.rate > 0:
        raise UserError(f"generated trace needs duration_s > 0 and rate > 0: {spec}")
    rng = np.random.default_rng(seed)
    ids = _Ids()
    reqs: list[tuple[float, list[int]]] = []
    if spec.kind == "phased":
        cycle = [
            GENERATED_TRACES["gen-system-prompts"],
            GENERATED_TRACES["gen-multi-turn"],
            GENERATED_TRACES["gen-agentic"],
        ]
        t, i = 0.0, 0
        while t < spec.duration_s:
            part = cycle[i % len(cycle)]
            end = min(t + spec.phase_s, spec.duration_s)
            reqs += _component(rng, part, part.kind, ids, t, end)
            t, i = end, i + 1
        bg = replace(GENERATED_TRACES["gen-one-shot"], rate=spec.background_rate)
        reqs += _component(rng, bg, "one-shot", ids, 0.0, spec.duration_s)
    else:
        reqs = _component(rng, spec, spec.kind, ids, 0.0, spec.duration_s)
    reqs.sort(key=lambda x: x[0])
    bt = spec.block_tokens
    return [
        TraceRow(
            arrival_s=t,
            prompt_tokens=bt * (len(blocks) - 1) + int(rng.integers(1, bt + 1)),
            output_tokens=1,
            line=i + 1,
            block_hashes=tuple(blocks),
        )
        for i, (t, blocks) in enumerate(reqs)
    ]


def generated_workload(
    trace: str,
    *,
    seed: int = 0,
    output_tokens: int,
    block_tokens: int | None = None,
    window_s: float | None = None,
    speedup: float = 1.0,
    max_prompt_tokens: int | None = None,
) -> Workload:
    """Generated trace ``trace`` as an engine workload: one ``chat`` source, arrivals from the
    first request, each request's prompt length and block hashes as generated and
    ``output_tokens`` out (``benchmarks/kv_reuse_sim.py``, ``benchmarks/sglang_kv_placement.py``).

    Args:
        block_tokens: tokens per block instead of the spec's (the same hash chains, shorter or
            longer prompts).
        window_s: keep the requests of the first ``window_s`` seconds (all when ``None``).
        speedup: arrival instants divided by it (think times too: the order of the requests, so
            every cache's content at each request, is unchanged).
        max_prompt_tokens: leave out longer prompts (their count is ``details['left_out']``).

    Raises:
        KeyError: ``trace`` is not in :data:`GENERATED_TRACES`.
    """
    spec = GENERATED_TRACES[trace]
    if block_tokens is not None:
        spec = replace(spec, block_tokens=block_tokens)
    rows = generate_rows(spec, seed)
    t0 = rows[0].arrival_s
    kept = [r for r in rows if window_s is None or r.arrival_s - t0 < window_s]
    fits = [r for r in kept if max_prompt_tokens is None or r.prompt_tokens <= max_prompt_tokens]
    requests = tuple(
        RequestSpec(
            request_id=f"{trace}-{i}",
            arrival_s=(row.arrival_s - t0) / speedup,
            prompt_tokens=row.prompt_tokens,
            output_tokens=output_tokens,
            max_output_tokens=output_tokens,
            slo=CHAT_SLO,
            source=trace,
            block_hashes=row.block_hashes,
            hash_block_tokens=spec.block_tokens,
        )
        for i, row in enumerate(fits)
    )
    source = Source(trace, trace, CHAT_SLO, output_tokens)
    details = {"generated": trace, "seed": seed, "block_tokens": spec.block_tokens,
               "window_s": window_s, "speedup": speedup,
               "left_out": len(kept) - len(fits)}  # fmt: skip
    return Workload(trace, requests, (source,), 1.0, None, details=details)
