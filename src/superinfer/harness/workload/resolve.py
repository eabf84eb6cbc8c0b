"""The one way a workload name becomes requests: a ``--trace`` (a name of
``workload.TRACES`` or an Azure-format CSV) or a workload spec (a built-in name or a TOML path)."""

from __future__ import annotations

from superinfer.harness.errors import UserError
from superinfer.harness.workload.spec_build import build_from_spec
from superinfer.harness.workload.specs import load_workload_spec
from superinfer.harness.workload.workload import TRACES, Workload, build_workload

__all__ = ["is_trace", "resolve_workload"]


def is_trace(ref: str) -> bool:
    """Whether ``ref`` names a trace (a ``TRACES`` name or a ``.csv`` path) rather than a spec."""
    return ref in TRACES or ref.endswith(".csv")


def resolve_workload(
    ref: str,
    *,
    spec: bool | None = None,
    seed: int = 0,
    rate_scale: float = 1.0,
    duration_s: float | None = None,
    start_s: float = 0.0,
) -> Workload:
    """The workload ``ref`` names, at ``rate_scale`` over ``duration_s`` scaled seconds.

    Args:
        ref: a trace (``--trace``) or a workload spec (``--workload``).
        spec: ``True``: ``ref`` is a spec; ``False``: a trace; ``None``: decide by
            :func:`is_trace`.
        seed: seed of a spec's random choices (a trace replay draws none).
        rate_scale: arrival-rate multiplier.
        duration_s: window in scaled seconds (``None``: the whole workload).
        start_s: trace seconds skipped before the window (traces only).

    Raises:
        UserError: unknown name, bad scale or window, an invalid spec, or ``start_s`` with a
            spec (a spec sets its own window).
        TraceFormatError: a malformed trace file.
    """
    if spec is None:
        spec = not is_trace(ref)
    if not spec:
        return build_workload(ref, rate_scale=rate_scale, duration_s=duration_s, start_s=start_s)
    if start_s:
        raise UserError("--start-s applies to --trace workloads; a spec sets its own window")
    return build_from_spec(
        load_workload_spec(ref), seed=seed, rate_scale=rate_scale, duration_s=duration_s
    )
