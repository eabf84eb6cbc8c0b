"""Where the data files are: the shared data directory, or a verified download cache.

Data files are never part of this repository. Lookup order for a trace file:

1. ``$SUPERINFER_DATA/traces/<file>`` (or ``$SUPERINFER_DATA/<file>``) when the variable is set;
2. ``shared/data/traces/<file>`` in the nearest ancestor of the working directory, or of this
   package's source, that has a ``shared/data`` folder (the checkout's ``../shared``);
3. the download cache (``$XDG_CACHE_HOME/superinfer`` or ``~/.cache/superinfer``), filled from the
   file's public source URL on first use and checked against its sha256 (the digests listed in
   ``shared/data/traces/README.md``).
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from superinfer.harness.errors import DataError

__all__ = ["TRACE_FILES", "TraceFile", "data_dir", "trace_path"]

_AZURE = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/b469a113cedca53ddc3bdea71a143dc4b7d8700c/data/"
_MOONCAKE = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/"
_SARATHI = "https://raw.githubusercontent.com/microsoft/sarathi-serve/72339db5b120614033b317880ad3a05a5e4c9415/data/processed_traces/"
_MLENERGY = "https://raw.githubusercontent.com/ml-energy/leaderboard-v2/c3af7f31e231a2a7021c5f8e2a54dd712d02e6e2/benchmark/llm_text_generation/chat/sharegpt/"


@dataclass(frozen=True, slots=True)
class TraceFile:
    """A public data file: its name, where it comes from, and its sha256."""

    name: str
    url: str
    sha256: str


TRACE_FILES: dict[str, TraceFile] = {
    f.name: f
    for f in (
        TraceFile(
            "AzureLLMInferenceTrace_conv.csv",
            _AZURE + "AzureLLMInferenceTrace_conv.csv",
            "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        ),
        TraceFile(
            "AzureLLMInferenceTrace_code.csv",
            _AZURE + "AzureLLMInferenceTrace_code.csv",
            "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
        ),
        TraceFile(
            "conversation_trace.jsonl",
            _MOONCAKE + "conversation_trace.jsonl",
            "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        ),
        TraceFile(
            "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
            _SARATHI + "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
            "6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f",
        ),
        TraceFile(
            "ShareGPT_V3_filtered_500.json",
            _MLENERGY + "ShareGPT_V3_filtered_500.json",
            "1dfcb9e6a6b794145128a3d2dd2f3c83aff8f11c806654e77aede2b0cda30e0e",
        ),
    )
}


def data_dir() -> Path | None:
    """The shared data directory, or ``None`` when there is none.

    Raises:
        DataError: ``SUPERINFER_DATA`` is set but is not a directory.
    """
    env = os.environ.get("SUPERINFER_DATA")
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise DataError(f"SUPERINFER_DATA={env}: not a directory")
        return path
    starts = [Path.cwd().resolve(), Path(__file__).resolve().parent]
    for start in starts:
        for base in (start, *start.parents):
            candidate = base / "shared" / "data"
            if candidate.is_dir():
                return candidate
    return None


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "superinfer" / "traces"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(entry: TraceFile, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    try:
        with urllib.request.urlopen(entry.url, timeout=60) as resp, tmp.open("wb") as out:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise DataError(
            f"{entry.name}: not found locally and download from {entry.url} "
            f"failed ({exc}); set SUPERINFER_DATA to the shared data folder"
        ) from None
    got = _sha256(tmp)
    if got != entry.sha256:
        tmp.unlink(missing_ok=True)
        raise DataError(f"{entry.name}: downloaded file has sha256 {got}, expected {entry.sha256}")
    os.replace(tmp, dest)


def trace_path(name: str, *, download: bool = True) -> Path:
    """Path of trace file ``name`` (e.g. ``AzureLLMInferenceTrace_conv.csv``).

    Raises:
        DataError: not found locally and not downloadable (or the download failed its check).
    """
    base = data_dir()
    if base is not None:
        for candidate in (base / "traces" / name, base / name):
            if candidate.is_file():
                return candidate
    cached = _cache_dir() / name
    if cached.is_file():
        return cached
    entry = TRACE_FILES.get(name)
    if entry is None or not download:
        where = f"{base}/traces" if base else "no shared data folder (set SUPERINFER_DATA)"
        raise DataError(f"{name}: trace not found ({where})")
    _download(entry, cached)
    return cached
