"""Notes of a run's report, from its manifest: feasibility (per engine, the requests an idle
replica cannot serve within their SLO and the target each misses: ``feasibility``, written by
``harness.engines.isolated.feasibility_info``; docs/metrics.md, "SLO forms") and the parts of
``--stack full`` each engine applied (``stack``, ``harness.bench.engine_stack``)."""

from __future__ import annotations

from typing import Any

__all__ = ["feasibility_lines", "stack_lines"]


def feasibility_lines(meta: dict[str, Any]) -> list[str]:
    """Markdown lines, one per engine (none when the manifest has no ``feasibility``)::

    - Infeasible on an idle replica, `sim:vllm` (...): batch 0 of 360; chat 12 of 1,445
      (12 miss ttft).
    """
    out = []
    for engine, info in meta.get("feasibility", {}).items():
        if not info.get("source"):
            out.append(f"- Infeasible on an idle replica, `{engine}`: unknown (no step model).")
            continue
        parts = []
        for cls, counts in info.get("classes", {}).items():
            bad = counts["infeasible"]
            why = ", ".join(f"{n:,} miss {kind}" for kind, n in bad.items())
            part = f"{cls} {sum(bad.values()):,} of {counts['n']:,}"
            parts.append(f"{part} ({why})" if why else part)
        out.append(f"- Infeasible on an idle replica, `{engine}` ({info['source']}): "
                   + "; ".join(parts) + ".")  # fmt: skip
    if not out:
        return []
    head = (
        "Requests no policy can serve within their SLO (`n_feasible` and "
        "`slo_attainment_feasible` count the others; docs/metrics.md):"
    )
    return [head, "", *out, ""]


def stack_lines(meta: dict[str, Any]) -> list[str]:
    """One line per engine of a ``--stack full`` run: the parts applied and those it cannot
    apply, with why (none without ``stack`` in the manifest)."""
    out = []
    for engine, info in meta.get("stack", {}).items():
        missing = "; ".join(f"{p} ({why})" for p, why in info.get("not_applied", {}).items())
        applied = ", ".join(info.get("applied", [])) or "none"
        out.append(
            f"- `--stack full` on `{engine}`: {applied}"
            + (f"; not: {missing}" if missing else "")
            + "."
        )
    return [*out, ""] if out else []
