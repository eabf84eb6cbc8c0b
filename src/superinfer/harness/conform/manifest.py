"""The conformance folder's ``manifest.json`` and ``MANIFEST.md``: which command, git sha, machine
and date made each engine x policy column of the matrix, merged across ``conform`` runs."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from superinfer.harness.report.results import short_sha

__all__ = ["record_runs"]


def _machine() -> str:
    load = ""
    if hasattr(os, "getloadavg"):
        load = f", load {os.getloadavg()[0]:.2f}"
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}{load}"


def record_runs(out: Path, columns: Sequence[tuple[str, str]], command: Sequence[str]) -> None:
    """Record that ``command`` (re)made the matrix columns ``columns`` (engine, policy) in
    ``out/manifest.json`` and rewrite ``out/MANIFEST.md`` from it.

    ``manifest.json``: ``files`` (``matrix.csv``, ``matrix.md``: the latest command, sha, machine
    and date that rewrote them) and ``columns`` (per ``engine / policy``: the same facts of the run
    that made that column).
    """
    path = out / "manifest.json"
    data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    facts = {"command": " ".join(command), "git_sha": short_sha(12), "machine": _machine(),
             "date_utc": now}  # fmt: skip
    cols = data.get("columns", {})
    for engine, policy in columns:
        cols[f"{engine} / {policy}"] = facts
    files = {
        name: {**facts, "source": f"superinfer conform: rows of {len(cols)} engine / policy "
               "columns merged (each column's run in manifest.json `columns`)"}
        for name in ("matrix.csv", "matrix.md")
    }  # fmt: skip
    files["manifest.json"] = {**facts, "command": "written by superinfer conform with the matrix",
                              "source": "this folder's runs"}  # fmt: skip
    data = {"files": files, "columns": dict(sorted(cols.items()))}
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    lines = [f"# {out.as_posix()}: manifest", "",
             "The conformance matrix (docs/conformance.md). Each `superinfer conform` run "
             "replaces its engine / policy columns; `manifest.json` `columns` names the run "
             "behind each column.", "",
             "| file | command | git sha | machine | date (UTC) | source |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name, f in files.items():
        lines.append(f"| `{name}` | {f['command']} | `{f['git_sha']}` | {f['machine']} | "
                     f"{f['date_utc']} | {f['source']} |")  # fmt: skip
    lines += ["", "## Columns", "", "| column | command | git sha | machine | date (UTC) |",
              "|---|---|---|---|---|"]  # fmt: skip
    for col, f in data["columns"].items():
        lines.append(f"| {col} | {f['command']} | `{f['git_sha']}` | {f['machine']} | "
                     f"{f['date_utc']} |")  # fmt: skip
    (out / "MANIFEST.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
