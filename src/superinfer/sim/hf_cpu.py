"""``sim:hf-cpu``: the simulator's model of the real CPU engine (engine id ``hf``).

The real engine is transformers' continuous batching (transformers 5.24) running
SmolLM2-135M-Instruct in fp32 on CPU with our :class:`~superinfer.adapters.hf.plugin
.PolicyScheduler`. Its mechanics, as this profile copies them:

* paged KV in blocks of 32 tokens (``page_size``), a pool of 256 blocks, at most 256 query tokens
  and 32 requests per step, no prefix sharing, recompute preemption, no swap tier;
* every step packs all scheduled tokens into one sequence and runs SDPA with a block-diagonal
  mask (``continuous_batching/input_outputs.py`` ``build_attention_mask``), so attention costs
  ``T x K`` scores for ``T`` query tokens and ``K`` key tokens of the whole batch, not the sum of
  per-request products a varlen kernel would cost.

Step time is not a roofline here: it is a linear model fitted to step times measured on the real
engine (``superinfer calibrate --engine hf``)::

    t = c0 + c_tok T + c_seq S + c_samp N + c_kv K + c_qk T K + c_multi [S > 1] + c_pre P

with ``T`` query tokens, ``S`` requests, ``N`` sampled tokens (LM-head rows), ``K`` key tokens
read by the step (each request's past plus its new tokens), and ``[S > 1]`` 1 for a step of more
than one request: the decode cost is not linear in the batch. Measured on this engine's own step
log (``results/engines-cpu/hf-steps/steps.parquet``: the engines suite's mix at 0.214-0.334
req/s, 27 runs, 5,000 decode steps, 2026-12-04 on the 2-core VM): a decode step of one request
took 71-78 ms (median per range of KV tokens), of two 138-161 ms, of four 144-206 ms, of eight
236-290 ms; the suite's lockstep batches of identical requests 72.5 / 131.5 / 120.7 / 145.6 ms at
1 / 2 / 4 / 8 (TPOT). A term per request alone cannot fit both the jump at two and the slower
growth after it: fitted on that log, ``multi_seq`` takes 56.8 ms and the mean |relative error|
per step falls from 0.144 (the six other terms refitted alone) to 0.102. ``P`` is the KV the
step's prefill chunks already held (prefix-cache hits and a chunked prompt's earlier chunks:
``prefill_kv_tokens - prefill_tokens``). The same model times ``sim:sglang-cpu``, fitted on the
real SGLang server's step log (``superinfer calibrate --engine sglang``), where a prefill on top of
a prefix is far slower than one without (``torch_native`` attention's extend path): in
``results/engines-cpu/sglang-steps/steps.parquet`` a prefill of 64-128 new tokens took a median
160 ms with no prefix and 382 ms on 257-512 held tokens (``run_batch`` alone), and
``prefix_tokens`` takes 0.37 ms per held token. The hf engine's step log records no prefix, so
its fits leave ``c_pre`` at 0. Calibration files without ``multi_seq`` or ``prefix_tokens`` read
them as 0.

Past a KV size the per-token cost jumps (the *spill*): each layer gathers the step's keys and values
from the paged cache (transformers 5.24, ``generation/continuous_batching/cache.py`` ``update``:
``read_index``) and repeats the 3 KV heads to the 9 query heads before SDPA
(``integrations/sdpa_attention.py``: ``repeat_kv``, as a masked SDPA gets no ``enable_gqa``), about
2 x (3 + 9) x 64 x 4 = 6,144 bytes per key token per layer in fp32, so past ~5,400 key tokens a
layer's working set would outgrow the host's 32 MiB L3 cache (AMD EPYC, ``lscpu``) and stream from
DRAM: our reading of the jump below, from this arithmetic, not measured with cache counters. In the
engines suite's step logs of the hf knee runs
(``results/hf/{knee,knee-hi,tpot-plan-0.9,tpot-plan-0.9-knee}/steps.parquet``, 0.214-0.4 req/s)
decode steps of 10-12 requests took a median 277 ms at 4,000-4,999 key tokens and 589 ms at
6,000-6,999; in ``knee-hi`` its own linear fit predicted the 113 decode steps at 6,000-6,999 key
tokens 2.04x too fast (median), those below 4,000 within 3.3 % (medians per 1,000-token range). The
model adds ``c_spill K`` when ``K`` exceeds a threshold (:attr:`HFCPUStepTime.spill_tokens`): all of
the step's KV traffic then costs more. The fit finds the threshold where the measured/predicted
ratio changes level (:func:`find_spill`) and keeps it only if steps above it are typically at least
:data:`SPILL_MIN_JUMP` slower.

Coefficients are fitted by least squares on relative error (each row divided by its measured
time), with negative coefficients removed and the rest refitted, so every term stays a cost.
Steps slowed by something outside the engine (another process taking the core) would pull the
fit up, so steps more than :data:`OUTLIER_MADS` median absolute deviations slower than the fit
(and at least :data:`OUTLIER_FLOOR` slower, relatively) are set aside and the fit is redone,
until the set is stable; slow outliers only, since contention never makes a step faster.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from superinfer.sim.hf_cpu_profile import (
    HOST_CPU,
    KV_BYTES_PER_TOKEN_FP32,
    MECHANICS,
    SIM_HF_CPU,
    SMOLLM2_135M,
    extends_decodes,
    hf_cpu_sim_config,
)
from superinfer.sim.step_time import BatchShape

__all__ = [
    "FEATURES",
    "OPTIONAL_FEATURES",
    "HOST_CPU",
    "KV_BYTES_PER_TOKEN_FP32",
    "MECHANICS",
    "SIM_HF_CPU",
    "SMOLLM2_135M",
    "FitReport",
    "HFCPUStepTime",
    "StepSample",
    "extends_decodes",
    "find_spill",
    "hf_cpu_sim_config",
    "shape_of",
    "shape_of_totals",
]

#: A step this many (normal-scaled) median absolute deviations of relative error slower than the
#: fit is an outlier.
OUTLIER_MADS = 3.0
#: ... and at least this much slower, relatively (so exact data never loses a point).
OUTLIER_FLOOR = 0.05

#: A spill regime needs this many steps above its threshold ...
SPILL_MIN_STEPS = 30
#: ... whose median measured/predicted ratio is this much (relatively) above the median below it.
SPILL_MIN_JUMP = 0.2
#: Thresholds tried, in key tokens: multiples of this (a KV page of 32 tokens, x 4).
SPILL_GRID_TOKENS = 128

#: Names of the step-time features, in coefficient order.
FEATURES = (
    "intercept",
    "num_tokens",
    "num_seqs",
    "num_samples",
    "kv_tokens",
    "q_times_kv",
    "multi_seq",
    "prefix_tokens",
)
#: Features a calibration file may lack (written before they existed), read as 0.
OPTIONAL_FEATURES = ("multi_seq", "prefix_tokens")

#: Coefficients (s per unit of each feature) from ``superinfer calibrate --engine hf
#: --engine-option num_threads=1`` (results/hf/step_time_fit.json: 144 steps, mean |rel err|
#: 0.19) on the development machine, 2 cores shared with several other busy
#: processes: every term is several times what a quiet machine measures. Recalibrate there.
DEFAULT_COEFFICIENTS: tuple[float, ...] = (
    0.0827397,
    0.00441208,
    0.0110515,
    0.0,
    7.48812e-05,
    1.46565e-06,
    0.0,
    0.0,
)


def _robust_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, list[int], np.ndarray]:
    """:func:`_nonnegative_fit` with slow outliers set aside until the fitted set is stable
    (module docstring). Returns ``(c, active features, mask of the steps fitted)``."""
    keep = np.ones(len(y), dtype=bool)
    coef, active = _nonnegative_fit(x, y)
    for _ in range(10):
        rel = (x @ coef - y) / y  # > 0: predicted slower than measured
        med = float(np.median(rel[keep]))
        mad = 1.4826 * float(np.median(np.abs(rel[keep] - med)))
        inlier = rel >= med - max(OUTLIER_MADS * mad, OUTLIER_FLOOR)
        if (inlier == keep).all() or inlier.sum() < len(FEATURES):
            break
        keep = inlier
        coef, active = _nonnegative_fit(x[keep], y[keep])
    return coef, active, keep


def find_spill(kv_tokens: np.ndarray, ratio: np.ndarray) -> float | None:
    """The KV size past which steps run slower than a model fitted across all of them predicts.

    Sorts the steps by key tokens and splits ``log(ratio)`` into two levels at each multiple of
    :data:`SPILL_GRID_TOKENS`, keeping the split with the least total absolute deviation from
    each side's median (a least-absolute-deviation change point in level, robust to the slow
    outliers a shared host adds).

    Args:
        kv_tokens: key tokens of each step, shape ``(n,)``.
        ratio: measured / predicted step time of each step, shape ``(n,)``, all > 0.

    Raises:
        ValueError: the two arrays differ in length.

    Returns:
        The threshold in key tokens (steps with more are in the spill regime), or ``None`` with
        no steps, or when no split leaves :data:`SPILL_MIN_STEPS` steps above it and
        ``len(FEATURES)`` below, or the median ratio above the best split is less than
        ``1 +`` :data:`SPILL_MIN_JUMP` times the median below it.
    """
    if len(kv_tokens) != len(ratio):
        raise ValueError(f"{len(kv_tokens)} KV sizes for {len(ratio)} ratios")
    if not len(kv_tokens):
        return None
    order = np.argsort(kv_tokens, kind="stable")
    kv, level = kv_tokens[order], np.log(ratio[order])
    best: tuple[float, float, float] | None = None  # (deviation, threshold, jump)
    first = int(math.ceil(float(kv[0]) / SPILL_GRID_TOKENS))
    for k in range(first * SPILL_GRID_TOKENS, int(kv[-1]), SPILL_GRID_TOKENS):
        n_below = int(np.searchsorted(kv, k, side="right"))
        if len(kv) - n_below < SPILL_MIN_STEPS:
            break
        if n_below < len(FEATURES):
            continue
        lo, hi = level[:n_below], level[n_below:]
        m_lo, m_hi = float(np.median(lo)), float(np.median(hi))
        dev = float(np.abs(lo - m_lo).sum() + np.abs(hi - m_hi).sum())
        if best is None or dev < best[0]:
            best = (dev, float(k), m_hi - m_lo)
    if best is None or best[2] < math.log1p(SPILL_MIN_JUMP):
        return None
    return best[1]


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Least squares of ``x c ~ y`` on relative error with ``c >= 0``: features whose coefficient
    comes out negative are removed and the rest refitted. Returns ``(c, active features)``."""
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active] / y[:, None], np.ones_like(y), rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active = [i for i, v in zip(active, sol, strict=True) if v >= 0]
    return coef, active


def shape_of(pieces: Sequence[tuple[int, int, bool]]) -> BatchShape:
    """The :class:`BatchShape` of a step, from ``(computed_tokens, num_tokens, samples)`` per
    request, classified as ``sim.steps.build_run`` does (one token = a decode)."""
    pairs = 0.0
    prefill_kv = decode_kv = samples = prefill = prefill_seqs = 0
    for c, n, sampled in pieces:
        if n == 1:
            decode_kv += c + 1
        else:
            pairs += n * (c + (n + 1) / 2)
            prefill_kv += c + n
            prefill += n
            prefill_seqs += 1
        samples += int(sampled)
    total = sum(n for _, n, _ in pieces)
    return BatchShape(
        total, samples, pairs, prefill_kv, decode_kv, len(pieces), prefill,
        num_prefill_seqs=prefill_seqs,
    )  # fmt: skip


def shape_of_totals(
    num_tokens: int, num_seqs: int, num_samples: int, kv_tokens: int, prefix_tokens: int = 0
) -> BatchShape:
    """A shape with a step's totals only (as ``steps.parquet`` records them; ``prefix_tokens``:
    the KV its prefill chunks already held). The step-time model reads nothing else: the held
    tokens go in ``prefill_kv_tokens`` (with ``prefill_tokens`` 0, so their difference is
    ``prefix_tokens``) and the other key tokens in ``decode_kv_tokens``, since only the sum and
    that difference are used; the shape is not fit for a roofline model."""
    return BatchShape(
        num_tokens, num_samples, 0.0, prefix_tokens, kv_tokens - prefix_tokens, num_seqs
    )


def features(shape: BatchShape, extend_decodes: bool = False) -> tuple[float, ...]:
    """Feature row of a step, in :data:`FEATURES` order.

    ``extend_decodes`` (SGLang's mixed batch, :attr:`HFCPUStepTime.extend_decodes`): in a step
    with a prefill chunk, each decode's held context (``c_i``) counts as prefix too."""
    kv = shape.prefill_kv_tokens + shape.decode_kv_tokens
    prefix = float(max(0, shape.prefill_kv_tokens - shape.prefill_tokens))
    if extend_decodes and shape.num_prefill_seqs > 0:
        prefix += shape.decode_kv_tokens - (shape.num_seqs - shape.num_prefill_seqs)
    return (
        1.0,
        float(shape.num_tokens),
        float(shape.num_seqs),
        float(shape.num_samples),
        float(kv),
        float(shape.num_tokens) * kv,
        1.0 if shape.num_seqs > 1 else 0.0,
        float(prefix),
    )


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured step: its shape and its wall time (s)."""

    shape: BatchShape
    duration_s: float


@dataclass(frozen=True, slots=True)
class FitReport:
    """How well a fit matches its samples.

    Attributes:
        num_samples: steps given.
        mean_abs_rel_err: mean of ``|predicted - measured| / measured`` over every step.
        p50_abs_rel_err: median of the same.
        p90_abs_rel_err: 90th percentile of the same.
        dropped: features whose coefficient came out negative and were removed.
        num_outliers: steps set aside as slowed from outside (not fitted, still scored above).
        inlier_mean_abs_rel_err: mean ``|relative error|`` over the steps fitted.
    """

    num_samples: int
    mean_abs_rel_err: float
    p50_abs_rel_err: float
    p90_abs_rel_err: float
    dropped: tuple[str, ...]
    num_outliers: int = 0
    inlier_mean_abs_rel_err: float = 0.0


@dataclass(frozen=True, slots=True)
class HFCPUStepTime:
    """Fitted step time of the real CPU engine; same interface as ``RooflineStepTime``.

    Attributes:
        coefficients: s per unit of each feature, in :data:`FEATURES` order (all >= 0).
        spill_tokens: key tokens past which a step is in the spill regime (module docstring;
            ``inf``: none).
        spill_s_per_token: the spill regime's extra cost, s per key token of the step (>= 0).
        extend_decodes: read a step with prefill chunks as SGLang runs it with
            ``--enable-mixed-chunk``: one extend batch in which each decode is an extend request
            over its whole context (``ScheduleBatch.mix_with_running``, sglang 0.5.23), so its
            held context counts in ``prefix_tokens``, as the server's step log records it
            (``adapters/sglang/steplog.py``). On the CPU backend that prefix is the costly term
            (``torch_native`` pads each extend request's query to its whole context:
            results/sglang-mixed-chunk/README.md). ``False``: decodes are decodes (hf's log).

    Raises:
        ValueError: wrong number of coefficients, or a negative or non-finite one; a spill
            threshold that is not > 0; a spill cost that is negative or non-finite, or > 0 with
            no finite threshold.
    """

    coefficients: tuple[float, ...] = DEFAULT_COEFFICIENTS
    spill_tokens: float = math.inf
    spill_s_per_token: float = 0.0
    extend_decodes: bool = False

    def __post_init__(self) -> None:
        if len(self.coefficients) != len(FEATURES):
            raise ValueError(f"need {len(FEATURES)} coefficients, got {len(self.coefficients)}")
        for name, c in zip(FEATURES, self.coefficients, strict=True):
            if not (math.isfinite(c) and c >= 0):
                raise ValueError(f"coefficient {name} must be finite and >= 0, got {c}")
        if not self.spill_tokens > 0:
            raise ValueError(f"spill threshold must be > 0 key tokens, got {self.spill_tokens}")
        if not (math.isfinite(self.spill_s_per_token) and self.spill_s_per_token >= 0):
            raise ValueError(f"spill cost must be finite and >= 0, got {self.spill_s_per_token}")
        if self.spill_s_per_token > 0 and not math.isfinite(self.spill_tokens):
            raise ValueError("a spill cost needs a finite spill threshold")

    @property
    def repeatable(self) -> bool:
        """Whether a run of decode steps is timed exactly by :meth:`decode_coefficients` (no
        spill term); the simulator runs steps one at a time otherwise."""
        return self.spill_s_per_token == 0.0

    def step_time_s(self, shape: BatchShape) -> float:
        """Duration of one step running ``shape``, s (0 for an empty step)."""
        if shape.num_tokens == 0:
            return 0.0
        x = features(shape, self.extend_decodes)
        t = sum(c * v for c, v in zip(self.coefficients, x, strict=True))
        if x[4] > self.spill_tokens:
            t += self.spill_s_per_token * x[4]
        return float(t)

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        """Step time of a pure-decode batch of ``num_seqs`` as ``a + b * decode_kv_tokens``
        (below the spill threshold).

        With ``T = S = N = num_seqs = B`` and ``K = decode_kv_tokens``:
        ``a = c0 + (c_tok + c_seq + c_samp) B + c_multi [B > 1]``, ``b = c_kv + c_qk B``.
        """
        c0, c_tok, c_seq, c_samp, c_kv, c_qk, c_multi, _ = self.coefficients  # no prefix
        a = c0 + (c_tok + c_seq + c_samp) * num_seqs + (c_multi if num_seqs > 1 else 0.0)
        return a, c_kv + c_qk * num_seqs

    @classmethod
    def fit(cls, samples: Sequence[StepSample]) -> tuple[HFCPUStepTime, FitReport]:
        """Fit the coefficients to measured steps.

        Least squares on relative error with non-negative coefficients (a coefficient that comes
        out negative is fixed at 0 and the rest refitted); slow outliers are set aside and the
        fit redone until the set of fitted steps is stable (module docstring). If the steps show
        a spill regime (:func:`find_spill`), the coefficients are refitted on the steps below its
        threshold and the spill cost is the median of ``(measured - predicted) / K`` above it
        (those steps are never set aside as outliers).

        Raises:
            ValueError: fewer samples than features, or a non-positive duration.
        """
        if len(samples) < len(FEATURES):
            raise ValueError(f"need at least {len(FEATURES)} steps to fit, got {len(samples)}")
        x = np.array([features(s.shape) for s in samples], dtype=float)
        y = np.array([s.duration_s for s in samples], dtype=float)
        if not (y > 0).all():
            raise ValueError("every measured step must have a positive duration")
        coef, active, keep = _robust_fit(x, y)
        kv, spill_at, spill_cost = x[:, 4], math.inf, 0.0
        pred = x @ coef
        threshold = find_spill(kv, y / pred) if (pred > 0).all() else None
        if threshold is not None:  # refit below it; the spill cost is the median excess above
            below = kv <= threshold
            coef_b, active_b, keep_b = _robust_fit(x[below], y[below])
            excess = float(np.median((y[~below] - x[~below] @ coef_b) / kv[~below]))
            if excess > 0:
                coef, active, spill_at, spill_cost = coef_b, active_b, threshold, excess
                keep = np.ones(len(y), dtype=bool)
                keep[below] = keep_b
        model = cls(tuple(float(c) for c in coef), spill_at, spill_cost)
        pred = x @ coef + spill_cost * kv * (kv > spill_at)
        err = np.abs((pred - y) / y)
        report = FitReport(
            num_samples=len(samples),
            mean_abs_rel_err=float(err.mean()),
            p50_abs_rel_err=float(np.percentile(err, 50)),
            p90_abs_rel_err=float(np.percentile(err, 90)),
            dropped=tuple(FEATURES[i] for i in range(len(FEATURES)) if i not in active),
            num_outliers=int((~keep).sum()),
            inlier_mean_abs_rel_err=float(err[keep].mean()),
        )
        return model, report

    def to_dict(self) -> dict[str, float]:
        """Coefficients by feature name."""
        return dict(zip(FEATURES, self.coefficients, strict=True))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HFCPUStepTime:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: a feature other than :data:`OPTIONAL_FEATURES` is missing, or a value is
                not a number.
        """
        missing = [f for f in FEATURES if f not in data and f not in OPTIONAL_FEATURES]
        if missing:
            raise ValueError(f"step-time coefficients lack {', '.join(missing)}")
        return cls(tuple(float(data.get(f, 0.0)) for f in FEATURES))

    def spill_dict(self) -> dict[str, float]:
        """The spill term as a calibration file's ``kv_spill`` object (``threshold_tokens``,
        ``s_per_token``); empty when there is none."""
        if self.spill_s_per_token == 0.0:
            return {}
        return {"threshold_tokens": self.spill_tokens, "s_per_token": self.spill_s_per_token}

    def scaled(self, factor: float) -> HFCPUStepTime:
        """This model with every step ``factor`` times as long: the coefficients and the spill
        cost scaled, the threshold kept (a host running the same engine ``factor`` times slower;
        ``harness.offline.calibrate_hf.run_speeds`` measures it per run).

        Raises:
            ValueError: ``factor`` is not finite and > 0.
        """
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"step-time scale must be finite and > 0, got {factor}")
        return replace(
            self,
            coefficients=tuple(c * factor for c in self.coefficients),
            spill_s_per_token=self.spill_s_per_token * factor,
        )

    @classmethod
    def from_calibration(cls, data: Mapping[str, Any]) -> HFCPUStepTime:
        """The model of a calibration file's JSON object: its ``coefficients`` object and its
        ``kv_spill`` object, if any (:meth:`spill_dict`).

        Raises:
            ValueError: no valid ``coefficients`` object, or an invalid ``kv_spill``.
        """
        try:
            model = cls.from_dict(data["coefficients"])
            spill = data.get("kv_spill") or {}
            if spill:
                model = replace(
                    model,
                    spill_tokens=float(spill["threshold_tokens"]),
                    spill_s_per_token=float(spill["s_per_token"]),
                )
            return model
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"bad calibration ({exc!r})") from None

    @classmethod
    def from_file(cls, path: Path) -> HFCPUStepTime:
        """Load a calibration file (``superinfer calibrate``): :meth:`from_calibration` of its
        JSON object.

        Raises:
            ValueError: unreadable file, or no valid ``coefficients`` object in it, or an invalid
                ``kv_spill``; the message names the file.
        """
        try:
            return cls.from_calibration(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}: not a step-time calibration ({exc})") from None
