"""Step-time spread: the measured steps' scatter around a fitted step-time model, replayed.

A fitted model (``sim/hf_cpu.py``) gives each step shape one duration; a real CPU engine does not.
In the engines suite's hf run ``results/hf/knee-hi`` (6,917 steps, refitted with its spill term) the
ratio measured / fitted had a median of 1.005 and a mean of 1.027 for decode steps (slow steps;
their causes not traced), 0.991 and 1.056 for mixed steps, and 1.226 and 1.244 for steps that only
prefill (no decode running, as after the engine idled). A policy that plans each step to the last
millisecond (a TPOT allowance spent to the target) misses on that scatter, and never does in a
simulator without it.

:class:`StepSpread` keeps the ratio's distribution per step kind (:data:`KINDS`), measured on a
run's own steps (``superinfer calibrate --steps``), as :data:`QUANTILE_POINTS` quantiles at the
midpoints ``(i + 0.5) / n``, each standing for ``1 / n`` of the steps; :class:`SpreadStepTime`
multiplies each step the simulator runs by one of them drawn uniformly with a seeded generator, so a
simulation stays deterministic per seed. The midpoints keep the measured mean (within the midpoint
rule's error: 1.027 for ``knee-hi``'s decode steps, 1.045 against 1.056 for its mixed steps) where
interpolating between 21 quantiles from 0 to 1 spreads the top 5 % evenly up to the slowest step and
raises it (1.054 and 1.162). It times every step on its own (``repeatable`` False: no run of
repeated decode steps), and only the steps the simulator runs draw from it: a policy sees the spread
in the step times it is told, as on the real engine. What it lacks: the real scatter is correlated
from step to step (``knee-hi``: lag-1 autocorrelation of log(measured / predicted) a median 0.645
over its 30 runs, 0.0 shuffled), and independent draws are not; replays with it put fewer rows
within issue 19's bounds (``results/fidelity/README.md``), so ``sim:hf-cpu`` leaves it off by
default.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from superinfer.sim.config import StepTimeModel
from superinfer.sim.step_time import BatchShape

__all__ = ["KINDS", "QUANTILE_POINTS", "SpreadStepTime", "StepSpread", "kind_of"]

#: Step kinds, as the engines' step logs name them (``steps.parquet`` ``kind``): only prefill
#: chunks, only decodes, or both.
KINDS = ("prefill", "decode", "mixed")

#: Quantiles kept per kind, at probabilities ``(i + 0.5) / 100``.
QUANTILE_POINTS = 100


def kind_of(shape: BatchShape) -> str:
    """The :data:`KINDS` entry of a step: ``decode`` with no prefill token, ``prefill`` when
    every token is a prefill token, else ``mixed``."""
    if shape.prefill_tokens == 0:
        return "decode"
    return "prefill" if shape.prefill_tokens >= shape.num_tokens else "mixed"


@dataclass(frozen=True, slots=True)
class StepSpread:
    """The measured / predicted step time's distribution per step kind, as equally likely values.

    Attributes:
        ratios: per kind in :data:`KINDS` that had steps, its quantiles at ``(i + 0.5) / n``
            (non-decreasing, > 0; the same ``n`` for every kind). A kind without its own falls
            back to ``decode``'s, then to any kind's.

    Raises:
        ValueError: no kind, an unknown kind, tables of different lengths or empty, or ratios not
            finite, non-decreasing and > 0.
    """

    ratios: Mapping[str, tuple[float, ...]]

    def __post_init__(self) -> None:
        if not self.ratios:
            raise ValueError("a step spread needs the quantiles of at least one step kind")
        sizes = {len(q) for q in self.ratios.values()}
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError("every step kind's spread needs the same number (> 0) of quantiles")
        for kind, q in self.ratios.items():
            if kind not in KINDS:
                raise ValueError(f"spread kind {kind!r}: one of {', '.join(KINDS)}")
            if not (q[0] > 0 and np.isfinite(q[-1]) and all(np.diff(q) >= 0)):
                raise ValueError(f"spread {kind}: ratios must be finite, > 0 and non-decreasing")

    @property
    def points(self) -> int:
        """Quantiles per kind."""
        return len(next(iter(self.ratios.values())))

    @classmethod
    def fit(
        cls, kinds: Sequence[str], ratios: Sequence[float], points: int = QUANTILE_POINTS
    ) -> StepSpread:
        """The spread of measured steps: ``ratios[i]`` is step ``i``'s measured / predicted time,
        ``kinds[i]`` its kind; ``points`` quantiles per kind at ``(i + 0.5) / points`` (numpy's
        default, linear, percentiles).

        Raises:
            ValueError: lengths differ, no step, an unknown kind, a ratio not > 0, or fewer than
                1 point.
        """
        if len(kinds) != len(ratios) or not len(ratios):
            raise ValueError("need one kind per ratio, and at least one step")
        if points < 1:
            raise ValueError(f"need at least 1 quantile point, got {points}")
        r = np.asarray(ratios, dtype=float)
        if not (r > 0).all():
            raise ValueError("every measured / predicted ratio must be > 0")
        k = np.asarray(kinds)
        unknown = set(k.tolist()) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown step kind {sorted(unknown)[0]!r}: one of {', '.join(KINDS)}")
        probs = (np.arange(points) + 0.5) / points
        return cls(
            {
                kind: tuple(float(v) for v in np.quantile(r[k == kind], probs))
                for kind in KINDS
                if (k == kind).any()
            }
        )

    def table(self, kind: str) -> tuple[float, ...]:
        """The quantiles a step of ``kind`` draws from (class docstring's fallback)."""
        if kind in self.ratios:
            return self.ratios[kind]
        return self.ratios.get("decode") or next(iter(self.ratios.values()))

    def ratio(self, kind: str, u: float) -> float:
        """The ratio a uniform draw ``u`` in ``[0, 1)`` picks for ``kind``: quantile
        ``floor(u n)``."""
        q = self.table(kind)
        return q[min(int(u * len(q)), len(q) - 1)]

    def mean(self, kind: str) -> float:
        """Mean ratio of ``kind`` (its quantiles' mean)."""
        return float(np.mean(self.table(kind)))

    def to_dict(self) -> dict[str, Any]:
        """A calibration file's ``spread`` object."""
        return {
            "quantiles_at": "(i + 0.5) / n",
            "ratio_measured_over_predicted": {k: list(v) for k, v in self.ratios.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepSpread:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: a missing key or a bad table (the class's checks).
        """
        if "ratio_measured_over_predicted" not in data:
            raise ValueError("spread lacks 'ratio_measured_over_predicted'")
        try:
            raw = data["ratio_measured_over_predicted"]
            ratios = {str(k): tuple(float(v) for v in q) for k, q in raw.items()}
        except (TypeError, ValueError, AttributeError):
            raise ValueError(
                "spread: ratio_measured_over_predicted must map each step kind to a list of numbers"
            ) from None
        return cls(ratios)


class SpreadStepTime:
    """A step-time model whose every step is scaled by a ratio drawn from a :class:`StepSpread`.

    Args:
        inner: the fitted model (``step_time_s``, ``decode_coefficients``).
        spread: the ratios to draw.
        seed: the generator's seed (``random.Random``); the same seed and the same sequence of
            steps give the same times.
    """

    repeatable = False

    def __init__(self, inner: StepTimeModel, spread: StepSpread, seed: int = 0) -> None:
        self.inner, self.spread = inner, spread
        self._rng = random.Random(seed)

    def step_time_s(self, shape: BatchShape) -> float:
        """The inner model's duration of ``shape`` times one draw of its kind's ratio, s."""
        if shape.num_tokens == 0:
            return 0.0
        return self.inner.step_time_s(shape) * self.spread.ratio(kind_of(shape), self._rng.random())

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        """The inner model's (unscaled): the simulator does not repeat steps of this model."""
        return self.inner.decode_coefficients(num_seqs)
