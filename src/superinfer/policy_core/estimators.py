"""Online estimators a policy learns while it runs: remaining output tokens, step time and a
quantile of prompt lengths.

They learn only from what an engine reports (arrivals, finished requests, finished steps); none
ever sees a request's true output length before it finishes.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from dataclasses import dataclass, field

from superinfer.policy_core.types import StepStats

__all__ = ["OutputLengthEstimator", "StepTimeModel", "WindowQuantile"]


class WindowQuantile:
    """A quantile of the last ``window`` values observed (exact, over a sliding window).

    ``observe`` is O(log n) to find the place plus an O(n) list shift (n = ``window``, a few
    thousand: a memmove); ``value`` is O(1).

    Args:
        q: the quantile, in ``[0, 1]`` (the value at index ``floor(q * (n - 1))`` of the sorted
            window).
        window: values remembered (the oldest are forgotten first).
        min_samples: values needed before ``value`` answers; until then it returns ``None``.

    Raises:
        ValueError: ``q`` outside ``[0, 1]`` or a count below 1.
    """

    def __init__(self, q: float, window: int = 1024, min_samples: int = 16) -> None:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q}")
        if window < 1 or min_samples < 1:
            raise ValueError("window and min_samples must be >= 1")
        self.q, self.min_samples = q, min_samples
        self._order: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []

    def observe(self, x: float) -> None:
        """Add ``x``; the oldest value leaves once the window is full."""
        if len(self._order) == self._order.maxlen:
            old = self._order[0]
            del self._sorted[bisect_left(self._sorted, old)]
        self._order.append(x)
        insort(self._sorted, x)

    def value(self) -> float | None:
        """The ``q`` quantile of the window, or ``None`` before ``min_samples`` values."""
        n = len(self._sorted)
        if n < self.min_samples:
            return None
        return self._sorted[int(self.q * (n - 1))]


@dataclass
class _ClassSamples:
    """Finished output lengths of one SLO class, and the table the queries read."""

    window: deque[int]
    sorted_lengths: list[int] = field(default_factory=list)
    suffix_sums: list[int] = field(default_factory=list)  # suffix_sums[i] = sum(sorted[i:])
    new_since_rebuild: int = 0


class OutputLengthEstimator:
    """Remaining output tokens of a running request, learned per SLO class from finished ones.

    For a class whose last ``window`` finished requests had output lengths ``N_1..N_m``, the
    estimate after ``g`` generated tokens is the empirical mean residual life
    ``E[N - g | N > g] = mean{N_i - g : N_i > g}`` (the empirical distribution conditioned on the
    tokens generated so far), capped by the request's ``max_output_tokens - g``. The sorted table
    is rebuilt every ``rebuild_every`` new samples, so a query is one bisection.

    Before a class has ``min_samples`` finished requests (cold start), or when no finished request
    of the class was longer than ``g``, the estimate is ``prior_fraction`` of the tokens left
    under the cap.

    Args:
        window: finished requests remembered per class (the oldest are forgotten first).
        min_samples: finished requests needed before the empirical estimate is used.
        rebuild_every: new samples between rebuilds of the sorted table.
        prior_fraction: cold-start estimate as a fraction of ``max_output_tokens - g``.

    Raises:
        ValueError: a non-positive count, or ``prior_fraction`` outside ``(0, 1]``.
    """

    def __init__(
        self,
        window: int = 4096,
        min_samples: int = 32,
        rebuild_every: int = 32,
        prior_fraction: float = 0.5,
    ) -> None:
        if window < 1 or min_samples < 1 or rebuild_every < 1:
            raise ValueError("window, min_samples and rebuild_every must be >= 1")
        if not 0.0 < prior_fraction <= 1.0:
            raise ValueError(f"prior_fraction must be in (0, 1], got {prior_fraction}")
        self.window = window
        self.min_samples = min_samples
        self.rebuild_every = rebuild_every
        self.prior_fraction = prior_fraction
        self._classes: dict[str, _ClassSamples] = {}

    def observe(self, slo_name: str, output_tokens: int) -> None:
        """Record the true output length of a request of class ``slo_name`` that finished."""
        samples = self._classes.get(slo_name)
        if samples is None:
            samples = self._classes[slo_name] = _ClassSamples(deque(maxlen=self.window))
        samples.window.append(output_tokens)
        samples.new_since_rebuild += 1
        ready = len(samples.window) >= self.min_samples
        if ready and (
            not samples.sorted_lengths or samples.new_since_rebuild >= self.rebuild_every
        ):
            lengths = sorted(samples.window)
            sums = [0] * (len(lengths) + 1)
            for i in range(len(lengths) - 1, -1, -1):
                sums[i] = sums[i + 1] + lengths[i]
            samples.sorted_lengths, samples.suffix_sums = lengths, sums
            samples.new_since_rebuild = 0

    def num_samples(self, slo_name: str) -> int:
        """Finished requests of the class in the table the queries read."""
        samples = self._classes.get(slo_name)
        return len(samples.sorted_lengths) if samples else 0

    def remaining_tokens(
        self, slo_name: str, generated_tokens: int, max_output_tokens: int
    ) -> float:
        """Expected output tokens still to come, ``>= 1`` while any may come.

        Args:
            slo_name: the request's SLO class.
            generated_tokens: output tokens it has produced so far.
            max_output_tokens: its declared cap.
        """
        left = max_output_tokens - generated_tokens
        if left <= 1:
            return 1.0
        samples = self._classes.get(slo_name)
        if samples is not None and samples.sorted_lengths:
            lengths = samples.sorted_lengths
            i = bisect_right(lengths, generated_tokens)
            longer = len(lengths) - i
            if longer:
                mean_residual = samples.suffix_sums[i] / longer - generated_tokens
                return min(float(left), max(1.0, mean_residual))
        return max(1.0, self.prior_fraction * left)

    def remaining_quantile(
        self, slo_name: str, generated_tokens: int, max_output_tokens: int, q: float
    ) -> float:
        """The ``q``-quantile of output tokens still to come, ``N - g`` given ``N > g``.

        A low ``q`` gives a count a request will exceed with probability about ``1 - q``. Falls
        back to 1 token (the least that may come) before the class has samples.

        Raises:
            ValueError: ``q`` outside ``[0, 1]``.
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q}")
        left = max_output_tokens - generated_tokens
        samples = self._classes.get(slo_name)
        if left <= 1 or samples is None or not samples.sorted_lengths:
            return 1.0
        lengths = samples.sorted_lengths
        i = bisect_right(lengths, generated_tokens)
        longer = len(lengths) - i
        if not longer:
            return 1.0
        value = lengths[i + int(q * (longer - 1))] - generated_tokens
        return float(min(left, max(1, value)))


class StepTimeModel:
    """Step duration as a linear function of what the step runs, fitted online.

    ``step_s = a + b * prefill_tokens + c * decode_seqs`` per step, fitted by exponentially
    weighted least squares (weight ``forgetting**age`` per report) on :class:`StepStats`; a run
    of ``k`` repeated decode steps is one observation of its per-step mean. The normal equations
    carry a ridge of weight ``prior_weight`` towards the priors, so cold start gives the priors
    and a few dozen steps replace them; solving the 3x3 system each time (instead of a
    recursive-least-squares covariance update, which loses positive definiteness under
    forgetting when the fit is exact) keeps it stable. Decode cost grows with the KV each
    sequence reads; ``c`` absorbs the current mean context, which forgetting lets it track.

    Args:
        prior_step_s: ``a`` before any step was seen, s.
        prior_prefill_token_s: ``b`` before any step was seen, s per prefill token.
        prior_decode_seq_s: ``c`` before any step was seen, s per decoding sequence.
        forgetting: weight decay per report in ``(0, 1]``; 1 never forgets.
        prior_weight: ridge weight of the priors (larger trusts them longer).

    Raises:
        ValueError: a negative prior, or a factor out of range.
    """

    #: Feature scales: prefill tokens in thousands, sequences in hundreds (keeps it conditioned).
    _SCALE = (1.0, 1e-3, 1e-2)

    def __init__(
        self,
        prior_step_s: float = 0.02,
        prior_prefill_token_s: float = 1.5e-4,
        prior_decode_seq_s: float = 1e-4,
        forgetting: float = 0.995,
        prior_weight: float = 0.01,
    ) -> None:
        if min(prior_step_s, prior_prefill_token_s, prior_decode_seq_s) < 0:
            raise ValueError("step-time priors must be >= 0")
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting}")
        if not prior_weight > 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight}")
        sa, sb, sc = self._SCALE
        self.prior = (prior_step_s / sa, prior_prefill_token_s / sb, prior_decode_seq_s / sc)
        self.theta = list(self.prior)
        self.xtx = [[0.0] * 3 for _ in range(3)]
        self.xty = [0.0] * 3
        self.forgetting = forgetting
        self.prior_weight = prior_weight
        self.num_observations = 0
        self._refresh()

    def _refresh(self) -> None:
        sa, sb, sc = self._SCALE
        t = self.theta
        # Clamped to small positive values: a fit must never promise free tokens.
        self.base_s = max(t[0] * sa, 1e-4)
        self.prefill_token_s = max(t[1] * sb, 1e-7)
        self.decode_seq_s = max(t[2] * sc, 0.0)

    def observe(self, stats: StepStats) -> None:
        """Fold one step report into the fit."""
        k = max(stats.num_steps, 1)
        if stats.duration_s <= 0 or stats.num_running <= 0:
            return
        sa, sb, sc = self._SCALE
        x = (sa, stats.num_prefill_tokens / k * sb, stats.num_decode_tokens / k * sc)
        y = stats.duration_s / k
        lam, a, b = self.forgetting, self.xtx, self.xty
        for i in range(3):
            b[i] = lam * b[i] + x[i] * y
            row = a[i]
            for j in range(3):
                row[j] = lam * row[j] + x[i] * x[j]
        rho = self.prior_weight
        m = [[a[i][j] + (rho if i == j else 0.0) for j in range(3)] for i in range(3)]
        rhs = [b[i] + rho * self.prior[i] for i in range(3)]
        self.theta = _solve3(m, rhs)
        self.num_observations += 1
        self._refresh()

    def step_s(self, prefill_tokens: float, decode_seqs: float) -> float:
        """Predicted duration of one step, s."""
        return self.base_s + self.prefill_token_s * prefill_tokens + self.decode_seq_s * decode_seqs

    def prefill_s(self, prefill_tokens: float, chunk_tokens: float, decode_seqs: float) -> float:
        """Predicted time to prefill ``prefill_tokens`` in chunks of ``chunk_tokens`` while
        ``decode_seqs`` sequences decode alongside, s."""
        if prefill_tokens <= 0:
            return 0.0
        steps = math.ceil(prefill_tokens / (chunk_tokens if chunk_tokens >= 1.0 else 1.0))
        return self.prefill_token_s * prefill_tokens + steps * (
            self.base_s + self.decode_seq_s * decode_seqs
        )


def _solve3(m: list[list[float]], rhs: list[float]) -> list[float]:
    """Solve the 3x3 system ``m x = rhs`` (symmetric positive definite) by Cramer's rule."""

    def det(a: list[list[float]]) -> float:
        return (
            a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
            - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0])
        )

    d = det(m)
    out = []
    for col in range(3):
        mc = [[rhs[i] if j == col else m[i][j] for j in range(3)] for i in range(3)]
        out.append(det(mc) / d)
    return out
