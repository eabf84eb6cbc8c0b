"""The report's lines on feasibility: per engine, the requests an idle replica cannot serve within
their SLO, and the target each misses (``manifest.json`` ``feasibility``, written by
``harness.engines.isolated.feasibility_info``; docs/metrics.md, "SLO forms")."""

from __future__ import annotations

from typing import Any

__all__ = ["feasibility_lines"]


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
