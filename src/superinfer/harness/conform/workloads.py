"""The conformance scenarios' workloads, built in code and sized to the engine under test.

Every size is relative to the target's :class:`Scale`: its running cap, step token budget, KV
capacity and step time (measured by the probe run). Times are in units of the probe's decode step
(``unit_s``), so the same scenario means the same thing on a simulated H100 and on two CPU cores.
Definitions: docs/conformance.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from superinfer.harness.workload.workload import Source, Workload
from superinfer.policy_core.types import SLO
from superinfer.sim.request import RequestSpec

__all__ = [
    "SHORT_PROMPT",
    "Scale",
    "Variant",
    "make_workload",
    "request",
    "strip_field",
]

#: Prompt tokens of a short (chat-like) request.
SHORT_PROMPT = 16


@dataclass(frozen=True, slots=True)
class Scale:
    """What the scenarios are sized to.

    Attributes:
        cap: most running requests (``max_num_seqs``).
        budget: most tokens one step runs (the prefill chunk), tokens.
        kv_tokens: KV capacity, tokens.
        unit_s: one decode step of a lone request (the probe's TPOT), s.
        ttft0_s: a lone short request's TTFT (the probe's), s.
        max_prompt: longest prompt the engine takes, tokens.
        sets_kv: a scenario may give each run its own KV capacity (simulated engines).
    """

    cap: int
    budget: int
    kv_tokens: int
    unit_s: float = 1.0
    ttft0_s: float = 1.0
    max_prompt: int = 1 << 20
    sets_kv: bool = False


@dataclass(frozen=True, slots=True)
class Variant:
    """One run of a scenario.

    Attributes:
        name: its key among the scenario's runs (``base``, ``no_priority``, ...).
        workload: the requests.
        kv_tokens: KV capacity it asks for, tokens (honoured where ``Scale.sets_kv``).
    """

    name: str
    workload: Workload
    kv_tokens: int | None = None


def request(
    rid: str,
    arrival_s: float,
    prompt: int,
    output: int,
    slo: SLO,
    *,
    hashes: Sequence[int] = (),
    hash_block_tokens: int = 0,
) -> RequestSpec:
    """One request; its declared output cap is its true output length."""
    return RequestSpec(
        rid,
        arrival_s,
        prompt,
        output,
        output,
        slo,
        source=slo.name,
        block_hashes=tuple(hashes),
        hash_block_tokens=hash_block_tokens,
    )


def make_workload(name: str, requests: Sequence[RequestSpec]) -> Workload:
    """A workload of ``requests`` (sorted by arrival), one source per SLO class."""
    ordered = tuple(sorted(requests, key=lambda r: (r.arrival_s, r.request_id)))
    classes = {r.slo.name: r.slo for r in ordered}
    sources = tuple(
        Source(c, f"conform:{name}", slo, max(r.output_tokens for r in ordered if r.slo.name == c))
        for c, slo in classes.items()
    )
    return Workload(
        f"conform:{name}",
        ordered,
        sources,
        rate_scale=1.0,
        duration_s=None,
        details={"conform_scenario": name},
    )


def strip_field(workload: Workload, field: str) -> Workload:
    """``workload`` with request field ``field`` carrying no information: ``priority`` 0 on every
    request, or no ``slo`` (TTFT, TPOT) targets, or no ``deadline``."""

    def strip(slo: SLO) -> SLO:
        if field == "priority":
            return replace(slo, priority=0)
        if field == "slo":
            return replace(slo, ttft_ms=None, tpot_ms=None)
        if field == "deadline":
            return replace(slo, deadline_s=None)
        raise ValueError(f"unknown field {field!r}")

    reqs = [replace(r, slo=strip(r.slo)) for r in workload.requests]
    return make_workload(f"{workload.name.removeprefix('conform:')}-no-{field}", reqs)
