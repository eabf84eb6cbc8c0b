"""Write each hand-kept ``results/*/manifest.json`` from its folder's ``MANIFEST.md`` table.

Two kinds of ``manifest.json`` live under ``results/``. Most are written by the run that made the
folder (``superinfer bench``, ``cache-eval``, ``conform``, ...) and are left alone here. The others
are the rows of the folder's ``MANIFEST.md`` as JSON; they carry the top-level key
``"generated_by": "scripts/sync_manifests.py"`` and this script is their only writer, so the table
stays the one place to edit (``tests/test_results_manifests.py`` fails when a copy differs from
what this script would write).

Layout written::

    {"files": {"<file>": {"command": ..., "git_sha": ..., "machine": ..., "date_utc": ...,
                          "source": ...}, ...},          # one entry per table row, sorted by file
     "folder": "results/<folder>",
     "note": ...,                                        # kept from the existing file
     "includes_subfolders": true,                        # optional, kept: rows of the subfolders'
                                                         # MANIFEST.md too, keyed "<sub>/<file>"
     "generated_by": "scripts/sync_manifests.py"}

Cells are copied as written in the table (backticks included); only the backticks around the file
name and the git sha, which the table's format requires, are dropped.

Usage (from the repository root)::

    python scripts/sync_manifests.py              # rewrite every marked manifest.json
    python scripts/sync_manifests.py --check      # exit 1 and name the copies that differ
    python scripts/sync_manifests.py results/new  # (re)write these folders' copies (marks them)
    python scripts/sync_manifests.py --adopt results/old  # also replace an unmarked copy

A folder named on the command line whose ``manifest.json`` has no marker is refused unless
``--adopt`` is given: that file may be one a run wrote, which this script must not replace.

Exit status: 0 done (or nothing differs), 1 ``--check`` found copies that differ, 2 bad input (one
line on stderr naming the file and line).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
MANIFEST_MD = "MANIFEST.md"
MANIFEST_JSON = "manifest.json"
MARKER_KEY = "generated_by"
MARKER = "scripts/sync_manifests.py"
SUBFOLDERS_KEY = "includes_subfolders"
DEFAULT_NOTE = (
    "the rows of MANIFEST.md in machine-readable form (each file's command, git sha, machine and "
    "date as recorded there)"
)
HEADER = "| file | command | git sha | machine | date (UTC) | source |"
# | `file` | command | `sha` | machine | date (UTC) | source |  (the test's ROW, too)
ROW = re.compile(
    r"^\| `(?P<file>[^`]+)` \| (?P<command>.+?) \| `(?P<sha>[0-9a-f]{7,40}(?:\+|-dirty)?)` "
    r"\| (?P<machine>.+?) \| (?P<date>\d{4}-\d{2}-\d{2} \d{2}:\d{2}) \| (?P<source>.+) \|$"
)


class ManifestError(Exception):
    """Bad input: the message is one line naming the file (and line)."""


def _name(path: Path) -> str:
    """``path`` relative to the repository when it is inside it, for messages and ``folder``."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return path.as_posix()


def parse_table(path: Path) -> dict[str, dict[str, str]]:
    """The rows of the ``file | command | git sha | machine | date (UTC) | source`` table in the
    ``MANIFEST.md`` at ``path``, by file, as ``manifest.json`` entries.

    Raises:
        ManifestError: no such file or table, a row that does not parse, a file named twice.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{_name(path)}: cannot read: {exc}") from None
    try:
        start = lines.index(HEADER) + 2
    except ValueError:
        raise ManifestError(f"{_name(path)}: no table with the header {HEADER!r}") from None
    if start > len(lines) or not re.fullmatch(r"\|(?:-+\|){6}", lines[start - 1].replace(" ", "")):
        raise ManifestError(f"{_name(path)}:{start}: the table header has no |---| line under it")
    rows: dict[str, dict[str, str]] = {}
    for number, line in enumerate(lines[start:], start + 1):
        if not line.startswith("|"):
            break
        match = ROW.match(line)
        if match is None:
            raise ManifestError(
                f"{_name(path)}:{number}: not a row `file` | command | `sha` | machine | "
                f"YYYY-MM-DD HH:MM | source: {line[:80]!r}"
            )
        if match["file"] in rows:
            raise ManifestError(f"{_name(path)}:{number}: `{match['file']}` has a row already")
        rows[match["file"]] = {
            "command": match["command"],
            "git_sha": match["sha"],
            "machine": match["machine"],
            "date_utc": match["date"],
            "source": match["source"],
        }
    if not rows:
        raise ManifestError(f"{_name(path)}:{start + 1}: the table has no rows")
    return rows


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{_name(path)}:{exc.lineno}: not JSON: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{_name(path)}: cannot read: {exc}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{_name(path)}:1: not a JSON object")
    return data


def render(folder: Path) -> str:
    """The ``manifest.json`` text this script writes for ``folder``: its ``MANIFEST.md`` rows (and
    its subfolders' when the existing copy says ``includes_subfolders``), with ``note`` and
    ``includes_subfolders`` kept from the existing copy.

    Raises:
        ManifestError: a ``MANIFEST.md`` that cannot be parsed, an existing copy that is not JSON.
    """
    existing = folder / MANIFEST_JSON
    old = _read_json(existing) if existing.is_file() else {}
    files = parse_table(folder / MANIFEST_MD)
    if old.get(SUBFOLDERS_KEY) is True:
        for md in sorted(folder.rglob(f"*/{MANIFEST_MD}")):
            sub = md.parent.relative_to(folder).as_posix()
            files.update({f"{sub}/{name}": row for name, row in parse_table(md).items()})
    data: dict[str, Any] = {
        "files": dict(sorted(files.items())),
        "folder": _name(folder),
        "note": old.get("note", DEFAULT_NOTE),
    }
    if old.get(SUBFOLDERS_KEY) is True:
        data[SUBFOLDERS_KEY] = True
    data[MARKER_KEY] = MARKER
    return json.dumps(data, indent=2) + "\n"


def marked_folders(results: Path = RESULTS) -> list[Path]:
    """Folders under ``results`` whose ``manifest.json`` carries ``"generated_by": MARKER``.

    Raises:
        ManifestError: a ``manifest.json`` that is not JSON.
    """
    return sorted(
        path.parent
        for path in results.rglob(MANIFEST_JSON)
        if _read_json(path).get(MARKER_KEY) == MARKER
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("folders", nargs="*", type=Path, help="default: every marked folder")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if any differ")
    ap.add_argument(
        "--adopt", action="store_true", help="replace the folders' unmarked manifest.json too"
    )
    args = ap.parse_args(argv)
    try:
        folders = args.folders or marked_folders()
        for folder in folders:
            if not folder.is_dir():
                raise ManifestError(f"{_name(folder)}: not a folder")
            path = folder / MANIFEST_JSON
            if not args.adopt and path.is_file() and _read_json(path).get(MARKER_KEY) != MARKER:
                raise ManifestError(
                    f'{_name(path)}: no "{MARKER_KEY}": "{MARKER}" (a run may have written '
                    "it); --adopt replaces it"
                )
        texts = {folder: render(folder) for folder in folders}
    except ManifestError as exc:
        print(f"sync_manifests: {exc}", file=sys.stderr)
        return 2
    stale = [
        folder
        for folder, text in texts.items()
        if not (folder / MANIFEST_JSON).is_file()
        or (folder / MANIFEST_JSON).read_text(encoding="utf-8") != text
    ]
    for folder in stale:
        name = _name(folder / MANIFEST_JSON)
        if args.check:
            print(f"{name}: differs from {MANIFEST_MD} (run python {MARKER})", file=sys.stderr)
        else:
            (folder / MANIFEST_JSON).write_text(texts[folder], encoding="utf-8")
            print(f"wrote {name}")
    if not stale:
        print(f"{len(texts)} manifest.json up to date")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
