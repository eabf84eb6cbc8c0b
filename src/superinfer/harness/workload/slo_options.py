"""SLO targets given on the command line (``--slo``, ``--slo-class``): ``CLASS:KEY=VALUE[,...]``."""

from __future__ import annotations

from collections.abc import Sequence

from superinfer.harness.errors import UserError

__all__ = ["parse_slo"]


def parse_slo(
    values: Sequence[str],
    *,
    keys: tuple[str, ...] = ("ttft_ms", "tpot_ms", "deadline_s"),
    flag: str = "--slo",
) -> dict[str, dict[str, float | None]]:
    """``CLASS:KEY=VALUE[,KEY=VALUE]`` strings -> per class, the SLO fields they replace
    (``none`` drops a target).

    Raises:
        UserError: a string not of that form, a key not in ``keys``, or a value not a number.
    """
    out: dict[str, dict[str, float | None]] = {}
    for value in values:
        cls, sep, rest = value.partition(":")
        if not sep or not cls or not rest:
            raise UserError(f"{flag} {value!r}: expected CLASS:KEY=VALUE[,KEY=VALUE]")
        for item in rest.split(","):
            key, eq, raw = item.partition("=")
            key = key.strip()
            if not eq or key not in keys:
                raise UserError(f"{flag} {value!r}: {item!r} is not KEY=VALUE with KEY in {keys}")
            try:
                number = None if raw.strip().lower() == "none" else float(raw)
            except ValueError:
                raise UserError(f"{flag} {value!r}: {key}={raw!r} is not a number") from None
            out.setdefault(cls, {})[key] = number
    return out
