"""The online estimators and the swap-versus-recompute cost model, on exact inputs."""

from __future__ import annotations

import pytest

from superinfer.policy_core.estimators import OutputLengthEstimator, StepTimeModel, WindowQuantile
from superinfer.policy_core.kv_cost import (
    has_cpu_tier,
    preempt_mode,
    recompute_cost_s,
    swap_cost_s,
)
from superinfer.policy_core.types import PreemptMode, StepStats
from tests.factories import make_state, make_view


class TestOutputLengthEstimator:
    def test_cold_start_is_a_fraction_of_the_cap(self) -> None:
        est = OutputLengthEstimator(min_samples=4)
        assert est.remaining_tokens("chat", 0, 1000) == 500.0
        for n in (10, 20, 30):
            est.observe("chat", n)
        assert est.num_samples("chat") == 0  # 3 < min_samples: still the prior
        assert est.remaining_tokens("chat", 100, 1000) == 450.0

    def test_mean_residual_life_conditioned_on_tokens_so_far(self) -> None:
        est = OutputLengthEstimator(min_samples=4, rebuild_every=1)
        for n in (10, 20, 30, 100):
            est.observe("chat", n)
        assert est.remaining_tokens("chat", 0, 1000) == pytest.approx(40.0)  # mean 40
        # after 15 tokens only 20, 30 and 100 remain possible: mean 50, minus 15
        assert est.remaining_tokens("chat", 15, 1000) == pytest.approx(35.0)
        assert est.remaining_tokens("chat", 15, 40) == 25.0  # capped by max_output - g
        # longer than every sample seen: back to the prior
        assert est.remaining_tokens("chat", 200, 1000) == 400.0
        assert est.remaining_tokens("batch", 0, 100) == 50.0  # classes are separate

    def test_conditional_quantile(self) -> None:
        est = OutputLengthEstimator(min_samples=4, rebuild_every=1)
        for n in (10, 20, 30, 100):
            est.observe("chat", n)
        assert est.remaining_quantile("chat", 15, 1000, 0.0) == 5.0  # 20 - 15
        assert est.remaining_quantile("chat", 15, 1000, 1.0) == 85.0  # 100 - 15
        assert est.remaining_quantile("chat", 15, 1000, 0.5) == 15.0  # 30 - 15
        with pytest.raises(ValueError, match="q must be in"):
            est.remaining_quantile("chat", 0, 10, 1.5)

    def test_window_forgets_the_oldest(self) -> None:
        est = OutputLengthEstimator(window=2, min_samples=1, rebuild_every=1)
        for n in (1000, 10, 20):
            est.observe("chat", n)
        assert est.remaining_tokens("chat", 0, 5000) == pytest.approx(15.0)


def _stats(duration_s: float, prefill: int, decode: int, steps: int = 1) -> StepStats:
    return StepStats(0.0, 0, duration_s, steps, prefill, decode, max(decode, 1), 0, 0, 0)


class TestStepTimeModel:
    def test_starts_at_the_priors(self) -> None:
        m = StepTimeModel(prior_step_s=0.02, prior_prefill_token_s=1e-4, prior_decode_seq_s=1e-3)
        assert m.step_s(1000, 10) == pytest.approx(0.02 + 0.1 + 0.01)
        assert m.prefill_s(2500, 1000, 10) == pytest.approx(0.25 + 3 * (0.02 + 0.01))

    def test_learns_a_linear_step_time(self) -> None:
        m = StepTimeModel()
        for i in range(400):
            prefill, decode = (i * 37) % 2048, (i * 11) % 128 + 1
            steps = 1 if prefill else 8  # repeated decode runs report k steps at once
            truth = 0.03 + 2e-4 * prefill + 5e-4 * decode
            m.observe(_stats(truth * steps, prefill * (steps == 1), decode * steps, steps))
        assert m.base_s == pytest.approx(0.03, rel=1e-2)
        assert m.prefill_token_s == pytest.approx(2e-4, rel=1e-2)
        assert m.decode_seq_s == pytest.approx(5e-4, rel=1e-2)


class TestKVCost:
    CPU = {
        "total_cpu_blocks": 100,
        "free_cpu_blocks": 100,
        "kv_block_bytes": 2_000_000,
        "link_bytes_per_s": 2e10,
    }

    def test_costs(self) -> None:
        state = make_state(**self.CPU)  # type: ignore[arg-type]
        view = make_view("r", prompt=160, computed=160, blocks=10)
        assert has_cpu_tier(state)
        assert swap_cost_s(view, state) == pytest.approx(2 * 10 * 2e6 / 2e10)  # 2 ms
        assert recompute_cost_s(view, 1e-4) == pytest.approx(0.016)
        assert preempt_mode(view, state, 1e-4, free_cpu_blocks=100) is PreemptMode.SWAP
        assert preempt_mode(view, state, 1e-5, free_cpu_blocks=100) is PreemptMode.RECOMPUTE
        assert preempt_mode(view, state, 1e-4, free_cpu_blocks=9) is PreemptMode.RECOMPUTE

    def test_no_cpu_tier(self) -> None:
        state = make_state()
        assert not has_cpu_tier(state)
        view = make_view("r", prompt=160, computed=160)
        assert preempt_mode(view, state, 1.0, free_cpu_blocks=100) is PreemptMode.RECOMPUTE
        with pytest.raises(ValueError, match="needs a CPU KV tier"):
            swap_cost_s(view, state)


def test_window_quantile_over_a_sliding_window() -> None:
    wq = WindowQuantile(0.5, window=4, min_samples=2)
    wq.observe(5)
    assert wq.value() is None  # one value, two needed
    wq.observe(1)
    assert wq.value() == 1  # sorted [1, 5]: index int(0.5 * 1) = 0
    wq.observe(3)
    assert wq.value() == 3  # [1, 3, 5]: index 1
    wq.observe(9)
    wq.observe(7)  # the window is full: 5, the oldest, leaves
    assert wq.value() == 3  # [1, 3, 7, 9]: index int(0.5 * 3) = 1
    wq.observe(0)  # 1 leaves: [0, 3, 7, 9]
    assert wq.value() == 3 and WindowQuantile(1.0, min_samples=1).value() is None
    with pytest.raises(ValueError, match=r"q must be in \[0, 1\], got 1.5"):
        WindowQuantile(1.5)
