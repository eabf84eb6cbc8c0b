"""Every committed result sits in a folder whose ``MANIFEST.md`` names it, with the command that
made it, the git sha, the machine and the date.

The files checked are those git tracks (``git ls-files``: committed or staged), so outputs that
are not committed (``requests.parquet``, ``cells/``, a local ``superinfer report`` into
``results/compare/``) need no row until they are added.

A ``manifest.json`` is either written by the run that made its folder or, when it carries
``"generated_by": "scripts/sync_manifests.py"``, a copy of the folder's ``MANIFEST.md`` table that
only that script writes; such a copy must equal what the script would write now.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from types import ModuleType

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


def _sync() -> ModuleType:
    """``scripts/sync_manifests.py`` as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "sync_manifests", ROOT / "scripts" / "sync_manifests.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_manifest_json_copies_are_what_the_script_writes() -> None:
    sync = _sync()
    folders = sync.marked_folders(RESULTS)
    assert folders, "no manifest.json carries the marker: the check would pass on nothing"
    for folder in folders:
        path = folder / "manifest.json"
        assert path.read_text(encoding="utf-8") == sync.render(folder), (
            f"{path.relative_to(ROOT)} differs from its MANIFEST.md: run "
            "python scripts/sync_manifests.py"
        )


def test_manifest_json_kinds_are_marked() -> None:
    """A copy of the table carries the marker and its row names the script; a file a run wrote
    carries neither (so no hand-kept copy escapes the check above)."""
    sync = _sync()
    for folder, files in sorted(_result_files().items()):
        if "manifest.json" not in files:
            continue
        data = json.loads((RESULTS / folder / "manifest.json").read_text(encoding="utf-8"))
        marked = data.get(sync.MARKER_KEY) == sync.MARKER
        row = _manifest_rows(folder)["manifest.json"]
        where = f"results/{folder}/manifest.json"
        assert marked == (sync.MARKER in row["command"]), (
            f"{where}: the marker and its MANIFEST.md row's command disagree on who writes it"
        )
        assert marked or not set(data) <= {"files", "folder", "note"}, (
            f"{where} looks like a copy of MANIFEST.md without the marker: "
            "python scripts/sync_manifests.py --adopt results/" + folder.as_posix()
        )


_TABLE = (
    "# t\n\n| file | command | git sha | machine | date (UTC) | source |\n"
    "|---|---|---|---|---|---|\n"
    "| `a.csv` | `make a` | `abc1234` | vm | 2026-12-01 12:00 | the run |\n"
)


def test_sync_script_writes_checks_and_refuses_bad_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sync = _sync()
    (tmp_path / "MANIFEST.md").write_text(_TABLE, encoding="utf-8")
    assert sync.main([str(tmp_path)]) == 0
    entry = json.loads((tmp_path / "manifest.json").read_text())["files"]["a.csv"]
    assert entry == {"command": "`make a`", "git_sha": "abc1234", "machine": "vm",
                     "date_utc": "2026-12-01 12:00", "source": "the run"}  # fmt: skip
    assert sync.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "MANIFEST.md").write_text(_TABLE.replace("make a", "make b"), encoding="utf-8")
    assert sync.main(["--check", str(tmp_path)]) == 1  # drift
    capsys.readouterr()
    (tmp_path / "MANIFEST.md").write_text(_TABLE + "| `b.csv` | x | abc1234 | vm | now | y |\n")
    assert sync.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MANIFEST.md:6: not a row" in err, err
    (tmp_path / "manifest.json").write_text('{"created_utc": "run-written"}')
    (tmp_path / "MANIFEST.md").write_text(_TABLE, encoding="utf-8")
    assert sync.main([str(tmp_path)]) == 2  # not marked: a run's file is never replaced
    assert "--adopt" in capsys.readouterr().err
