"""What the simulated CPU engines (``sim:hf-cpu``, ``sim:sglang-cpu``) take from a step-time file.

A calibration file (``superinfer calibrate``, or the fit an engines suite writes beside its
results) gives the simulator three things: the fitted step time (``coefficients``, ``kv_spill``:
``sim.hf_cpu.HFCPUStepTime``), the measured spread around it (``spread``: ``sim.step_spread``)
and the request path outside the steps (``request_latency_ms``:
``harness.suites_engines_knee.request_path_ms``). :func:`sim_profile` reads the file once and
applies the engine options that adjust them (``step_spread``, ``request_latency_ms``,
``step_time_scale``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from superinfer.harness.errors import UserError
from superinfer.sim.hf_cpu import HFCPUStepTime
from superinfer.sim.step_spread import SpreadStepTime, StepSpread

if TYPE_CHECKING:
    from superinfer.sim.config import StepTimeModel

__all__ = ["ProfileOptions", "SimProfile", "sim_profile", "sim_step_time"]


class ProfileOptions(Protocol):
    """The engine options :func:`sim_profile` reads (``engines.hf.HFOptions`` has them; this
    module does not import it, so ``engines.hf`` can import this one)."""

    @property
    def step_time_file(self) -> str | None: ...

    @property
    def step_time_scale(self) -> float: ...

    @property
    def step_spread(self) -> str: ...

    @property
    def step_spread_seed(self) -> int: ...

    @property
    def request_latency_ms(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class SimProfile:
    """The simulator's side of a step-time file, as the engine options adjust it.

    Attributes:
        step_time: the fitted model, its coefficients and spill cost times
            ``step_time_scale``.
        spread: the measured / predicted ratios each step draws from
            (``step_spread=calibrated``), else ``None``.
        spread_seed: the seed of those draws.
        request_latency_s: added to each request's first token and finish as the client sees
            them, s (>= 0).
    """

    step_time: HFCPUStepTime
    spread: StepSpread | None
    spread_seed: int
    request_latency_s: float

    def model(self) -> StepTimeModel:
        """The step-time model the simulator runs: :attr:`step_time`, scaled per step by a draw
        of :attr:`spread` when there is one."""
        if self.spread is None:
            return self.step_time
        return SpreadStepTime(self.step_time, self.spread, self.spread_seed)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a step-time calibration ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a step-time calibration (not a JSON object)")
    return data


def _step_time(data: dict[str, Any], path: Path | None, scale: float) -> HFCPUStepTime:
    if path is None:
        model = HFCPUStepTime()
    else:
        try:
            model = HFCPUStepTime.from_calibration(data)
        except ValueError as exc:
            raise UserError(f"{path}: not a step-time calibration ({exc})") from None
    return model.scaled(scale)  # 1.0: the same coefficients, exactly


def _spread(data: dict[str, Any], path: Path | None, wanted: bool) -> StepSpread | None:
    if not wanted:
        return None
    if path is None:
        raise UserError(
            "--engine-option step_spread=calibrated needs step_time_file=PATH (a calibration "
            "with a measured spread: superinfer calibrate --engine hf --steps ...)"
        )
    raw = data.get("spread")
    if raw is None:
        raise UserError(
            f"{path}: no spread object (written before calibrations kept one); "
            "step_spread=calibrated needs one: refit with superinfer calibrate --steps"
        )
    try:
        return StepSpread.from_dict(raw)
    except (ValueError, AttributeError, TypeError) as exc:
        raise UserError(f"{path}: bad step-time spread ({exc})") from None


def _latency_s(data: dict[str, Any], path: Path | None, given_ms: float | None) -> float:
    ms = given_ms
    if ms is None and path is not None:
        try:
            ms = float(data.get("request_latency_ms", 0.0))
        except (TypeError, ValueError) as exc:
            raise UserError(f"{path}: request_latency_ms: {exc}") from None
        if not 0.0 <= ms < math.inf:
            raise UserError(f"{path}: request_latency_ms {ms} is not >= 0")
    return (ms or 0.0) / 1e3


def sim_profile(opts: ProfileOptions) -> SimProfile:
    """The simulator's profile of ``opts.step_time_file`` (read once; the default coefficients of
    ``sim/hf_cpu.py`` when unset), adjusted by ``opts``: ``step_time_scale`` multiplies every
    step's time, ``step_spread=calibrated`` adds the file's ``spread``, ``request_latency_ms``
    (else the file's, else 0) is the request path.

    Raises:
        UserError: an unreadable or invalid file (naming it); ``step_spread=calibrated`` without
            a file or with one that has no valid ``spread`` object; a ``request_latency_ms`` in
            the file that is not a number >= 0.
    """
    path = None if opts.step_time_file is None else Path(opts.step_time_file)
    data = {} if path is None else _read(path)
    return SimProfile(
        step_time=_step_time(data, path, opts.step_time_scale),
        spread=_spread(data, path, opts.step_spread == "calibrated"),
        spread_seed=opts.step_spread_seed,
        request_latency_s=_latency_s(data, path, opts.request_latency_ms),
    )


def sim_step_time(opts: ProfileOptions) -> HFCPUStepTime:
    """The fitted step-time model alone (:attr:`SimProfile.step_time`).

    Raises:
        UserError: as :func:`sim_profile`.
    """
    return sim_profile(opts).step_time
