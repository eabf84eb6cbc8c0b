"""Synthetic arrivals and the spreading of quantized timestamps."""

from __future__ import annotations

import numpy as np
import pytest

from superinfer.harness.workload.arrivals import gamma_arrivals, spread_buckets


def test_poisson_arrivals_start_at_zero_and_have_the_rate() -> None:
    times = gamma_arrivals(np.random.default_rng(7), 4.0, num_requests=20_000)
    gaps = np.diff(times)
    assert times[0] == 0.0 and times.size == 20_000
    # Seeded, so these are exact for this generator; the tolerances are the statistics'.
    assert gaps.mean() == pytest.approx(0.25, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)  # exponential: CV 1


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_sets_the_coefficient_of_variation(burstiness: float) -> None:
    times = gamma_arrivals(
        np.random.default_rng(1), 2.0, burstiness=burstiness, num_requests=20_000
    )
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(0.5, rel=0.04)
    assert gaps.std() / gaps.mean() == pytest.approx(burstiness**-0.5, rel=0.04)


def test_arrivals_until_a_time_limit() -> None:
    times = gamma_arrivals(np.random.default_rng(3), 100.0, until_s=50.0)
    assert times.max() < 50.0 and np.all(np.diff(times) >= 0)
    assert times.size == pytest.approx(5_000, rel=0.05)
    both = gamma_arrivals(np.random.default_rng(3), 100.0, until_s=50.0, num_requests=10)
    assert both.size == 10


def test_arrivals_reject_bad_parameters() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="rate_rps"):
        gamma_arrivals(rng, 0.0, num_requests=3)
    with pytest.raises(ValueError, match="burstiness"):
        gamma_arrivals(rng, 1.0, burstiness=float("inf"), num_requests=3)
    with pytest.raises(ValueError, match="give num_requests or until_s"):
        gamma_arrivals(rng, 1.0)


def test_spread_keeps_order_and_stays_inside_each_bucket() -> None:
    times = np.array([0.0, 0.0, 0.0, 3.0, 6.0, 6.0])
    spread = spread_buckets(times, np.random.default_rng(0))
    assert np.all(np.diff(spread) >= 0)
    assert np.all((spread[:3] >= 0.0) & (spread[:3] < 3.0))
    assert 3.0 <= spread[3] < 6.0
    # The last bucket is as wide as the median gap (3 s).
    assert np.all((spread[4:] >= 6.0) & (spread[4:] < 9.0))
    same = spread_buckets(times, np.random.default_rng(0))
    assert np.array_equal(spread, same)


def test_spread_of_a_single_time_and_of_decreasing_times() -> None:
    assert np.array_equal(spread_buckets(np.array([5.0, 5.0]), np.random.default_rng(0)), [5, 5])
    with pytest.raises(ValueError, match="must not decrease"):
        spread_buckets(np.array([1.0, 0.0]), np.random.default_rng(0))
