"""Upper bounds on every length, count, rate and time a workload loader, spec or ``bench``
option accepts, and the checks of ``superinfer bench``'s options made before any work (issue 20
items 6-8: a huge or bad value fails at once, in one line naming the flag and the bound, not
after a run, in a write or out of memory)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from superinfer.harness.errors import UserError

__all__ = [
    "MAX_CPU_KV_RATIO",
    "MAX_DURATION_S",
    "MAX_LENGTH_SCALE",
    "MAX_HASH",
    "MAX_RATE_RPS",
    "MAX_RATE_SCALE",
    "MAX_REPLICAS",
    "MAX_REQUESTS",
    "MAX_TOKENS",
    "MAX_TP",
    "check_numbers",
    "check_rate_scale",
    "policy_names",
]

#: Largest prompt or output length, tokens: 10^7, about 80 times the 128k-token context of the
#: Llama-3.1 models the simulator knows, and far inside the int64 columns of
#: ``requests.parquet``.
MAX_TOKENS = 10**7
#: Largest block hash id (stored as int64).
MAX_HASH = 2**63 - 1
#: Most requests one workload source may have (``num_requests``, or a synthetic source's
#: expected count ``rate_rps x window``): 10^7 requests is about 1 GB of request objects.
MAX_REQUESTS = 10**7
#: Largest synthetic arrival rate, requests/s (a spec's ``rate_rps``).
MAX_RATE_RPS = 1e6
#: Largest rate multiplier (``--rate-scale``, a spec's or a source's ``rate_scale``).
MAX_RATE_SCALE = 1e6
#: Longest window or offset, s (``duration_s``, ``start_s``): about 31.7 years.
MAX_DURATION_S = 1e9
#: Largest tensor-parallel degree and replica count (``--tp``, ``--replicas``, ``[bench]``).
MAX_TP = 1024
MAX_REPLICAS = 10_000


def check_rate_scale(rate_scale: float, flag: str = "--rate-scale") -> float:
    """``rate_scale`` if it is a finite number in ``(0, MAX_RATE_SCALE]``.

    Raises:
        UserError: ``inf``, ``nan``, ``<= 0`` or over the bound; the message names ``flag``.
    """
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise UserError(f"{flag} must be > 0 and finite, got {rate_scale}")
    if rate_scale > MAX_RATE_SCALE:
        raise UserError(f"{flag} {rate_scale:g} is over the limit of {MAX_RATE_SCALE:g}")
    return rate_scale


#: Largest ``--cpu-kv-ratio`` (CPU-tier KV over HBM KV; real hosts hold a few times HBM).
MAX_CPU_KV_RATIO = 1000.0
#: Largest ``--length-scale``.
MAX_LENGTH_SCALE = 1000.0


def _number(flag: str, value: float, *, low: float, high: float, strict: bool) -> None:
    if not (math.isfinite(value) and (value > low if strict else value >= low)):
        op = ">" if strict else ">="
        raise UserError(f"{flag} must be {op} {low:g} and finite, got {value}")
    if value > high:
        raise UserError(f"{flag} {value:g} is over the limit of {high:g}")


def _integer(flag: str, value: int, high: int) -> None:
    if value < 1:
        raise UserError(f"{flag} must be >= 1, got {value}")
    if value > high:
        raise UserError(f"{flag} {value} is over the limit of {high:,}")


def check_numbers(p: Mapping[str, Any]) -> None:
    """Check the numeric ``bench`` options in ``p`` (by parameter name; ``None``: unset).

    Bounds: ``--rate-scale`` finite in ``(0, MAX_RATE_SCALE]``; ``--duration-s`` in
    ``(0, MAX_DURATION_S]``; ``--start-s`` in ``[0, MAX_DURATION_S]``; ``--length-scale`` in
    ``(0, MAX_LENGTH_SCALE]``; ``--max-prompt-tokens`` / ``--max-output-tokens`` in
    ``[1, MAX_TOKENS]``; ``--cpu-kv-ratio`` in ``[0, MAX_CPU_KV_RATIO]``; ``--tp`` in
    ``[1, MAX_TP]``; ``--replicas`` in ``[1, MAX_REPLICAS]`` (``workload.limits``).

    Raises:
        UserError: the first value out of bounds; the message names its flag.
    """
    if p.get("rate_scale") is not None:
        check_rate_scale(p["rate_scale"])
    for key, low, strict in (("duration_s", 0.0, True), ("start_s", 0.0, False)):
        if p.get(key) is not None:
            flag = "--" + key.replace("_", "-")
            _number(flag, p[key], low=low, high=MAX_DURATION_S, strict=strict)
    if p.get("length_scale") is not None:
        _number("--length-scale", p["length_scale"], low=0.0, high=MAX_LENGTH_SCALE, strict=True)
    if p.get("cpu_kv_ratio") is not None:
        _number("--cpu-kv-ratio", p["cpu_kv_ratio"], low=0.0, high=MAX_CPU_KV_RATIO, strict=False)
    for key in ("max_prompt_tokens", "max_output_tokens"):
        if p.get(key) is not None:
            _integer("--" + key.replace("_", "-"), p[key], MAX_TOKENS)
    if p.get("tp") is not None:
        _integer("--tp", p["tp"], MAX_TP)
    if p.get("replicas") is not None:
        _integer("--replicas", p["replicas"], MAX_REPLICAS)


def policy_names(value: str | None, where: str = "--policies") -> tuple[str, ...]:
    """The comma-separated policy names of ``value`` (``None``: unset, ``()``).

    Raises:
        UserError: ``value`` given but naming no policy (``--policies ""``), or a name given
            twice; the message names ``where``.
    """
    if value is None:
        return ()
    names = [n.strip() for n in value.split(",")]
    if not any(names):
        raise UserError(f"{where} {value!r} names no policy (leave it out for the default)")
    names = [n for n in names if n]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"{where} names {twice[0]!r} twice")
    return tuple(names)
