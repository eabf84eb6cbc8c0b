"""The run directory: ``summary.csv``, ``metrics.csv``, ``requests.parquet``,
``timeline.parquet``, ``manifest.json``, ``report.md`` (and the report's PNG plots).

Every file is written to a temporary name in the same directory and renamed into place, so a
reader never sees a half-written file. A whole run directory is written into a temporary
sibling directory and renamed into place (:func:`staged_dir`), so a failed run leaves the
previous run whole, never a mix of old and new files. Files and directories get the modes the
umask allows (0644 and 0755 under umask 022), not ``mkstemp``'s 0600.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Iterator
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.harness.errors import UserError
from superinfer.harness.report.metrics import SUMMARY_COLUMNS, metrics_long

__all__ = [
    "RUN_FILES",
    "check_out_dir",
    "check_out_file",
    "git_sha",
    "manifest",
    "short_sha",
    "staged_dir",
    "write_atomic",
    "write_run",
]

#: Float format of CSV files: enough digits to compare runs, few enough to read.
CSV_FLOAT_FORMAT = "%.6g"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it to ``path``
    (mode ``0666`` less the umask: 0644 under umask 022)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_out_dir(path: Path, flag: str = "--out") -> Path:
    """``path`` if a run directory can be written there; checked before any work.

    The directory may exist (it is replaced whole) or not (it is created, with its parents);
    its parent, or the nearest ancestor that exists, must be a writable directory (a run is
    staged in a sibling directory and renamed into place).

    Raises:
        UserError: ``path`` exists and is not a directory (a file, ``/dev/null``), a component
            of it is a file (``file/sub``), or the place cannot be written; one line naming
            ``flag``.
    """
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: exists and is not a directory")
    if path.resolve() == Path(path.resolve().anchor):
        raise UserError(f"{flag} {path}: a run directory cannot be the file system root")
    _check_writable_parent(path, flag)
    return path


def _check_writable_parent(path: Path, flag: str) -> None:
    """The nearest existing ancestor of ``path`` must be a directory this process can write
    in (probed with a temporary directory); else a :class:`UserError` naming ``flag``."""
    parent = path.resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: {parent} is not a directory")
    try:
        probe = tempfile.mkdtemp(prefix=".superinfer-probe-", dir=parent)
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot write in {parent} ({exc.strerror})") from None
    os.rmdir(probe)


def check_out_file(path: Path, flag: str = "--out") -> Path:
    """``path`` if a file can be written there (replaced if it exists); checked before any
    work.

    Raises:
        UserError: ``path`` is a directory, a component of it is a file, or its directory cannot
            be written; one line naming ``flag``.
    """
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a directory (give a file name)")
    _check_writable_parent(path, flag)
    return path


#: The files a ``bench`` run directory is made of (:func:`write_run` and the report's plots).
RUN_FILES = frozenset(
    {
        "summary.csv",
        "metrics.csv",
        "requests.parquet",
        "timeline.parquet",
        "steps.parquet",
        "manifest.json",
        "report.md",
        "ttft_cdf.png",
        "e2e_cdf.png",
        "attainment.png",
        "kv_hbm.png",
        "queue.png",
        "sweep.png",
    }
)


@contextlib.contextmanager
def staged_dir(out_dir: Path, owned: Collection[str] = RUN_FILES) -> Iterator[Path]:
    """Stage a run directory: yield a temporary sibling of ``out_dir`` to write into; when the
    block ends without an exception, the stage replaces ``out_dir`` and gets mode ``0777`` less
    the umask. On an exception the stage is removed and ``out_dir`` is left as it was.

    The previous run's files (names in ``owned``) are all dropped, so old and new results never
    mix; anything else in ``out_dir`` that the new run did not write (a ``MANIFEST.md``, a
    ``README.md``, a calibration file, a folder) is moved into the new directory.

    Raises:
        UserError: ``out_dir`` exists and is not a directory.
    """
    check_out_dir(out_dir)
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        yield stage
        os.chmod(stage, 0o777 & ~_umask())
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old",
                                        dir=out_dir.parent))  # fmt: skip
            os.replace(out_dir, old)
        try:
            os.replace(stage, out_dir)
        except BaseException:
            if old is not None:
                os.replace(old, out_dir)
            raise
        if old is not None:
            for entry in old.iterdir():
                if entry.name not in owned and not (out_dir / entry.name).exists():
                    os.replace(entry, out_dir / entry.name)
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def git_sha() -> str:
    """Commit of the source tree this package runs from, with ``-dirty`` if a tracked file
    outside ``results/`` is modified."""
    root = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        # Reference results are written by the very runs this sha labels: they do not count.
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":/",
                ":(top,exclude)results",
            ],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def short_sha(length: int) -> str:
    """:func:`git_sha` cut to its first ``length`` characters, ``-dirty`` kept: ``"0123abc-dirty"``
    for ``length`` 7 of a modified tree (``"unknown"`` outside a git checkout, cut alike)."""
    full = git_sha()
    head, _, mark = full.partition("-")
    return head[:length] + (f"-{mark}" if mark else "")


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for dist in ("superinfer", "numpy", "pandas", "pyarrow", "pluggy"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def manifest(info: dict[str, Any], *, command: list[str] | None = None) -> dict[str, Any]:
    """The manifest of a run: its config and facts, versions, git sha, seed and hardware."""
    return {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else sys.argv,
        "git_sha": git_sha(),
        "seed": info.get("config", {}).get("seed"),
        "versions": _versions(),
        "host": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        **info,
    }


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def write_run(
    out_dir: Path,
    summary: pd.DataFrame,
    requests: pd.DataFrame,
    meta: dict[str, Any],
    report_md: str,
    timeline: pd.DataFrame | None = None,
    steps: pd.DataFrame | None = None,
) -> None:
    """Write the files of a run directory (atomically, each): ``summary.csv``, ``metrics.csv``
    (the summary in long format, :func:`~superinfer.harness.report.metrics.metrics_long`),
    ``requests.parquet``, ``manifest.json``, ``report.md`` and, when given, ``timeline.parquet``
    and (for real engines) ``steps.parquet``.
    """
    summary = summary[[*SUMMARY_COLUMNS, *[c for c in summary if c not in SUMMARY_COLUMNS]]]
    write_atomic(
        out_dir / "summary.csv",
        lambda p: summary.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT),
    )
    metrics = metrics_long(summary, requests)
    write_atomic(
        out_dir / "metrics.csv",
        lambda p: metrics.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT),
    )
    write_atomic(
        out_dir / "requests.parquet",
        lambda p: requests.to_parquet(p, index=False, compression="zstd"),
    )
    write_atomic(
        out_dir / "manifest.json",
        lambda p: _write_text(p, json.dumps(meta, indent=2, default=str) + "\n"),
    )
    write_atomic(out_dir / "report.md", lambda p: _write_text(p, report_md))
    if timeline is not None:
        write_atomic(
            out_dir / "timeline.parquet",
            lambda p: timeline.to_parquet(p, index=False, compression="zstd"),
        )
    if steps is not None and not steps.empty:
        write_atomic(
            out_dir / "steps.parquet",
            lambda p: steps.to_parquet(p, index=False, compression="zstd"),
        )
