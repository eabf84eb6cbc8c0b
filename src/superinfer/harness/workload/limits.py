"""Upper bounds on every length, count, rate and time a workload loader, spec or ``bench``
option accepts (issue 20 items 6 and 7: a huge value must fail at once, in one line naming the
bound, not after a run, in a write or out of memory)."""

from __future__ import annotations

import math

from superinfer.harness.errors import UserError

__all__ = [
    "MAX_DURATION_S",
    "MAX_HASH",
    "MAX_RATE_RPS",
    "MAX_RATE_SCALE",
    "MAX_REPLICAS",
    "MAX_REQUESTS",
    "MAX_TOKENS",
    "MAX_TP",
    "check_rate_scale",
]

#: Largest prompt or output length, tokens: 10^7, ten times the longest context of any model
#: the harness knows (1M tokens), and far inside the int64 columns of ``requests.parquet``.
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
