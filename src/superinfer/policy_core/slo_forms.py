"""SLO forms: a class's targets -> one request's absolute targets, and whether they are feasible.

A class (:class:`~superinfer.policy_core.types.SLO`) states its TTFT target in one of three forms:

- absolute: ``ttft_ms``;
- prompt-scaled: ``ttft_ms + ttft_ms_per_1k_prompt * prompt_tokens / 1000`` (long prompts get
  the time their prefill needs, as serving teams write SLOs for them);
- engine-relative: ``ttft_x_isolated * prefill_ms``, a multiple of the request's prefill alone on
  an idle replica of the engine (DistServe and Sarathi-Serve state SLOs this way).

and its TPOT target as ``tpot_ms`` or ``tpot_x_isolated * decode_ms`` (a multiple of the request's
first decode step alone). Deadlines are absolute. A request carries the absolute targets of its
class (:func:`for_request`), so policies and metrics read ``ttft_ms`` / ``tpot_ms`` only.

A request is **feasible** when an idle replica meets its targets (:func:`infeasible_reason`):
its isolated TTFT, mean TPOT and end-to-end time are within them.
"""

from __future__ import annotations

from dataclasses import replace

from superinfer.policy_core.types import SLO

__all__ = ["SLO_FORMS", "engine_relative", "for_request", "has_forms", "infeasible_reason"]

#: The keys of the request-dependent forms, as ``SLO`` fields, workload-spec keys and ``serve``
#: request fields.
SLO_FORMS = ("ttft_ms_per_1k_prompt", "ttft_x_isolated", "tpot_x_isolated")


def has_forms(slo: SLO) -> bool:
    """True if ``slo`` has a target that depends on the request (prompt-scaled or relative)."""
    return (
        slo.ttft_ms_per_1k_prompt is not None
        or slo.ttft_x_isolated is not None
        or slo.tpot_x_isolated is not None
    )


def engine_relative(slo: SLO) -> bool:
    """True if ``slo`` has a target relative to the engine's isolated latency."""
    return slo.ttft_x_isolated is not None or slo.tpot_x_isolated is not None


def for_request(
    slo: SLO,
    prompt_tokens: int,
    *,
    prefill_ms: float | None = None,
    decode_ms: float | None = None,
) -> SLO:
    """The absolute targets of one request of class ``slo``: the same class (name, weight,
    priority, deadline) with ``ttft_ms`` / ``tpot_ms`` computed and the forms cleared.

    Args:
        slo: the class.
        prompt_tokens: the request's prompt length, tokens (>= 1).
        prefill_ms: its prefill alone on an idle replica, ms (needed by ``ttft_x_isolated``).
        decode_ms: its first decode step alone on an idle replica, ms (``tpot_x_isolated``).

    Returns:
        ``slo`` itself when it has no form, else the resolved copy.

    Raises:
        ValueError: a relative form without the isolated latency it multiplies.
    """
    if not has_forms(slo):
        return slo
    ttft, tpot = slo.ttft_ms, slo.tpot_ms
    if slo.ttft_ms_per_1k_prompt is not None:
        assert ttft is not None  # SLO.__post_init__ requires the base
        ttft = ttft + slo.ttft_ms_per_1k_prompt * prompt_tokens / 1000.0
    if slo.ttft_x_isolated is not None:
        if prefill_ms is None:
            raise ValueError(f"SLO {slo.name!r}: ttft_x_isolated needs the isolated prefill time")
        ttft = slo.ttft_x_isolated * prefill_ms
    if slo.tpot_x_isolated is not None:
        if decode_ms is None:
            raise ValueError(f"SLO {slo.name!r}: tpot_x_isolated needs the isolated decode step")
        tpot = slo.tpot_x_isolated * decode_ms
    return replace(
        slo, ttft_ms=ttft, tpot_ms=tpot, ttft_ms_per_1k_prompt=None, ttft_x_isolated=None,
        tpot_x_isolated=None,
    )  # fmt: skip


def infeasible_reason(slo: SLO, output_tokens: int, *, ttft_ms: float, tpot_ms: float) -> str:
    """Why an idle replica cannot meet ``slo`` for a request, or ``""`` when it can.

    Args:
        slo: the request's absolute targets (:func:`for_request`).
        output_tokens: its true output length (>= 1).
        ttft_ms: its TTFT alone on an idle replica (its whole prefill), ms.
        tpot_ms: its mean time per output token alone there, ms (unused for one token).

    Returns:
        ``""``, or the first target missed as ``"ttft 1234 > 1000 ms"``, ``"tpot ..."`` or
        ``"deadline ..."`` (the idle value, then the target). Idle end-to-end time is
        ``ttft_ms + (output_tokens - 1) * tpot_ms``.
    """
    if slo.ttft_ms is not None and ttft_ms > slo.ttft_ms:
        return f"ttft {ttft_ms:.0f} > {slo.ttft_ms:.0f} ms"
    if slo.tpot_ms is not None and output_tokens > 1 and tpot_ms > slo.tpot_ms:
        return f"tpot {tpot_ms:.1f} > {slo.tpot_ms:.1f} ms"
    e2e_s = (ttft_ms + max(output_tokens - 1, 0) * tpot_ms) / 1e3
    if slo.deadline_s is not None and e2e_s > slo.deadline_s:
        return f"deadline {e2e_s:.1f} > {slo.deadline_s:.1f} s"
    return ""
