"""Arrival processes: synthetic arrivals (Poisson, gamma) and spreading quantized timestamps.

Every function takes an explicit ``numpy.random.Generator``; the workload builder seeds one per
source from ``--seed`` and the source's name, so adding a source never changes another's draws.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ARRIVAL_PROCESSES", "gamma_arrivals", "spread_buckets"]

#: Synthetic arrival processes a workload spec may name.
ARRIVAL_PROCESSES = ("poisson", "gamma")

_CHUNK = 4096  # gaps drawn per batch when arrivals run until a time limit


def gamma_arrivals(
    rng: np.random.Generator,
    rate_rps: float,
    *,
    burstiness: float = 1.0,
    num_requests: int | None = None,
    until_s: float | None = None,
) -> np.ndarray:
    """Arrival instants with gamma-distributed gaps, as vLLM's ``--burstiness``.

    Gaps are ``Gamma(shape=burstiness, scale=1 / (rate_rps * burstiness))``: mean ``1/rate_rps``,
    coefficient of variation ``1/sqrt(burstiness)``. ``burstiness = 1`` is a Poisson process;
    below 1 is burstier, above 1 more regular. As in vLLM (``get_request`` in
    ``vllm/benchmarks/serve.py``; ``benchmarks/benchmark_serving.py`` before), the first request
    arrives at 0 and each gap follows a request.

    Args:
        rng: random source.
        rate_rps: mean arrival rate, requests/s (> 0).
        burstiness: gamma shape (> 0).
        num_requests: stop after this many arrivals.
        until_s: stop before this instant (s). At least one limit must be given; with both, the
            first reached wins.

    Returns:
        Shape ``(n,)`` float64 array of non-decreasing instants in s, starting at 0.

    Raises:
        ValueError: a non-positive rate or burstiness, or no limit.
    """
    if not rate_rps > 0 or not np.isfinite(rate_rps):
        raise ValueError(f"rate_rps must be a finite number > 0, got {rate_rps}")
    if not burstiness > 0 or not np.isfinite(burstiness):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness}")
    if num_requests is None and until_s is None:
        raise ValueError("give num_requests or until_s")
    scale = 1.0 / (rate_rps * burstiness)
    if num_requests is not None:
        gaps = rng.gamma(burstiness, scale, size=max(num_requests - 1, 0))
        times = np.concatenate(([0.0], np.cumsum(gaps)))[:num_requests]
        return np.asarray(times if until_s is None else times[times < until_s])
    assert until_s is not None
    parts = [np.zeros(1)]
    last = 0.0
    while last < until_s:
        chunk = last + np.cumsum(rng.gamma(burstiness, scale, size=_CHUNK))
        parts.append(chunk)
        last = float(chunk[-1])
    times = np.concatenate(parts)
    return np.asarray(times[times < until_s])


def spread_buckets(times_s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Spread requests that share a quantized timestamp uniformly over their bucket.

    The Mooncake conversation trace stamps arrivals in buckets about 3 s apart (only 1,180
    distinct values for 12,031 requests; ``shared/data/traces/README.md``). A bucket's width is
    the gap to the next distinct timestamp (the median gap for the last bucket). The ``k``
    requests of a bucket get the ``k`` sorted draws of ``Uniform[0, width)`` as offsets, in
    file order, so order is kept. This is exactly a Poisson process conditioned on ``k``
    arrivals in the bucket (its arrival times are distributed as sorted uniforms), so the
    spread assumes no more than the count the trace records.

    Args:
        times_s: shape ``(n,)`` non-decreasing arrival instants, s.
        rng: random source.

    Returns:
        Shape ``(n,)`` non-decreasing instants; a trace with one distinct time is returned as is.

    Raises:
        ValueError: ``times_s`` decreases somewhere.
    """
    times: np.ndarray = np.array(times_s, dtype=float)
    if np.any(np.diff(times) < 0):
        raise ValueError("times_s must not decrease")
    distinct, counts = np.unique(times, return_counts=True)
    if distinct.size < 2:
        return times
    gaps = np.diff(distinct)
    widths = np.append(gaps, np.median(gaps))
    bucket = np.repeat(np.arange(distinct.size), counts)
    draws = rng.random(times.size)
    # Sort the draws within each bucket: rows of a bucket are contiguous since times are sorted.
    order = np.lexsort((draws, bucket))
    offsets = draws[order] * widths[bucket]
    return np.asarray(times + offsets)
