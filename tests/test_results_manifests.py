"""Every committed result sits in a folder whose ``MANIFEST.md`` names it, with the command that
made it, the git sha, the machine and the date.

The files checked are those git tracks (``git ls-files``: committed or staged), so outputs that
are not committed (``requests.parquet``, ``cells/``, a local ``superinfer report`` into
``results/compare/``) need no row until they are added.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
MANIFEST = "MANIFEST.md"
# | `file` | command | `sha` | machine | date (UTC) | source |
ROW = re.compile(
    r"^\| `(?P<file>[^`]+)` \| (?P<command>.+?) \| `(?P<sha>[0-9a-f]{7,40}(?:\+|-dirty)?)` "
    r"\| (?P<machine>.+?) \| (?P<date>\d{4}-\d{2}-\d{2} \d{2}:\d{2}) \| (?P<source>.+) \|$"
)


def _result_files() -> dict[Path, set[str]]:
    """Tracked files under results/, by folder (relative to results/)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "--", "results"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    by_folder: dict[Path, set[str]] = defaultdict(set)
    for line in out.splitlines():
        path = Path(line).relative_to("results")
        if (RESULTS / path).is_file():  # a deleted but still indexed file is not there to list
            by_folder[path.parent].add(path.name)
    return by_folder


def _manifest_rows(folder: Path) -> dict[str, dict[str, str]]:
    rows = {}
    for line in (RESULTS / folder / MANIFEST).read_text().splitlines():
        if line.startswith("| `"):
            match = ROW.match(line)
            assert match, f"results/{folder}/{MANIFEST}: malformed row {line!r}"
            rows[match["file"]] = match.groupdict()
    return rows


def test_results_has_folders_only() -> None:
    assert sorted(_result_files().get(Path("."), set())) == []


def test_every_result_file_is_in_its_folders_manifest() -> None:
    for folder, files in sorted(_result_files().items()):
        assert MANIFEST in files, f"results/{folder}/ has no {MANIFEST}"
        rows = _manifest_rows(folder)
        assert sorted(rows) == sorted(files - {MANIFEST}), f"results/{folder}/{MANIFEST}"


def test_manifest_rows_say_command_machine_and_source() -> None:
    for folder in sorted(_result_files()):
        for name, row in _manifest_rows(folder).items():
            for field in ("command", "machine", "source"):
                assert row[field].strip(), f"results/{folder}/{MANIFEST}: {name}: empty {field}"
