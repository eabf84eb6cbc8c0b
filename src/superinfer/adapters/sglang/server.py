"""Start, wait for and stop a real SGLang server, with or without the plugin (tests, benches).

:class:`SGLangServer` builds the command exactly as ``superinfer serve --engine sglang`` does
(:func:`.launch.launch_command`, then :func:`.launch.server_command`: the CPU recipe without a
CUDA GPU), adds ``--host 127.0.0.1 --port <free port> --sleep-on-idle``, starts it in its own
process group with its output in a log file that is kept, waits (bounded) until ``/health``
answers 200, and stops the whole group (SIGTERM, then SIGKILL). With the plugin, its counters
are in a JSON stats file (:mod:`.stats`) read by :meth:`SGLangServer.stats`.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from superinfer.adapters.sglang.launch import (
    NATIVE_POLICIES,
    launch_command,
    server_command,
)
from superinfer.adapters.sglang.stats import ENV_STATS_FILE, read_stats
from superinfer.adapters.sglang.steplog import ENV_STEP_LOG

__all__ = [
    "DEFAULT_START_TIMEOUT_S",
    "SGLangServer",
    "ServerStartError",
    "exit_on_sigterm",
    "free_port",
]

#: Start-up bound: 39-70 s measured on 2 idle cores (../shared/engines/sglang-cpu.md, "Costs"),
#: with room for a machine shared by other jobs.
DEFAULT_START_TIMEOUT_S = 300.0

#: SIGTERM to SIGKILL: shutdown takes ~8 s on 2 cores.
STOP_GRACE_S = 30.0

_CAUSE = re.compile(
    r"(Error|Exception|error:|SystemExit|superinfer:|Killed|Traceback)", re.IGNORECASE
)


_BIND_ERROR = "error while attempting to bind on address"


class ServerStartError(RuntimeError):
    """The server did not come up; the message is one line: the cause and the log's last line."""


#: SGLang draws its rendezvous port from 22000-29999 (``utils/network.py::
#: get_free_port_below_ephemeral``); the server port comes from outside that range.
_SGLANG_PORTS = range(22000, 30000)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", attempts: int = 64) -> int:
    """A TCP port free on ``host`` now, below the kernel's ephemeral range.

    Not a ``bind(0)`` port: the kernel hands such a port out again to the next ``bind(0)``, and
    the scheduler's gloo transport binds ephemeral ports while the server starts (seen: the
    server's own port taken, uvicorn failing with "address already in use").

    Raises:
        OSError: no free port found in ``attempts`` tries.
    """
    candidates = [p for p in range(10000, _ephemeral_low()) if p not in _SGLANG_PORTS]
    for port in random.sample(candidates, min(attempts, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free TCP port on {host} below the ephemeral range")


def _log_cause(lines: Sequence[str]) -> str | None:
    """The last line of the log that names an error (the exception line of a traceback)."""
    for line in reversed(lines):
        text = line.strip()
        if text and _CAUSE.search(text) and not text.startswith(("File ", "Traceback")):
            return text
    return None


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit(143)`` in this (main) thread.

    Python's default SIGTERM action ends the process without running ``finally`` blocks, so a
    bench killed by SIGTERM would leave the servers it started running in their own process
    groups (seen: ``pkill -f sglang_cpu.py`` left a busy scheduler behind). With this, the
    ``finally: server.stop()`` of every caller runs. Call it from a program's entry point only.
    """

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


class SGLangServer:
    """One ``sglang.launch_server`` process group on 127.0.0.1.

    Args:
        policy: a registered policy name (through the plugin) or one of
            :data:`.launch.NATIVE_POLICIES` (SGLang's own scheduling, no plugin).
        engine_args: more ``sglang.launch_server`` arguments (the CPU recipe fills the rest).
        kv_policy: prefix-cache placement policy through the plugin (``lru``, ``lfu``, ``reuse``).
        policy_opts: ``key=value`` policy options.
        config_path: adapter configuration file.
        log_path: where the server's stdout and stderr go (kept); a temporary file by default.
        stats_path: the plugin's stats file; next to the log by default (plugin policies only).
        step_log_path: where the scheduler appends one CSV line per batch (:mod:`.steplog`),
            under any policy, native included; none by default.
        env: extra environment variables for the server (e.g. ``SGLANG_CLIP_...``).
        start_timeout_s: the bound on start-up.
        cpu: force the CPU recipe on or off; ``None``: on without a CUDA GPU.

    Raises:
        ConfigError, UnknownPolicyError: from :func:`.launch.launch_command`, before any start.
    """

    def __init__(
        self,
        policy: str,
        engine_args: Sequence[str] = (),
        *,
        kv_policy: str | None = None,
        policy_opts: Sequence[str] = (),
        config_path: str | None = None,
        log_path: str | Path | None = None,
        stats_path: str | Path | None = None,
        step_log_path: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        cpu: bool | None = None,
    ) -> None:
        self.policy = policy
        self.host = "127.0.0.1"
        self.port = free_port(self.host)
        self.plugin = policy not in NATIVE_POLICIES
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"sglang-{policy}-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.stats_path: Path | None = None
        if self.plugin:
            self.stats_path = Path(stats_path or self.log_path.with_suffix(".stats.json"))
        self.start_timeout_s = start_timeout_s
        self.startup_s: float | None = None
        self.recipe_line: str | None = None
        environ = {**os.environ, **(env or {})}
        if self.stats_path is not None:
            environ[ENV_STATS_FILE] = str(self.stats_path)
        self.step_log_path = Path(step_log_path) if step_log_path is not None else None
        if self.step_log_path is not None:
            environ[ENV_STEP_LOG] = str(self.step_log_path)
        args = [*engine_args, "--host", self.host, "--port", str(self.port)]
        if "--sleep-on-idle" not in args:
            args.append("--sleep-on-idle")  # an idle scheduler busy-polls a core otherwise
        argv, environ = launch_command(
            args,
            policy=policy,
            policy_opts=policy_opts,
            config_path=config_path,
            kv_policy=kv_policy,
            environ=environ,
        )
        self._cpu = cpu
        self.argv, self.env = argv, environ
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> SGLangServer:
        """Start the server and wait until ``/health`` answers 200.

        Returns:
            ``self``.

        Raises:
            ServerStartError: it exited, or did not answer within ``start_timeout_s``; one line
                with the cause and the log's last line (the server is stopped first, as it is
                when anything else, e.g. ``SystemExit`` from SIGTERM, interrupts the wait).
            ServeError: sglang is missing, or the CPU fixture cannot be built.
        """
        self.argv, self.env, self.recipe_line = server_command(self.argv, self.env, cpu=self._cpu)
        if self.stats_path is not None and self.stats_path.exists():
            self.stats_path.unlink()
        begin = time.monotonic()
        with self.log_path.open("wb") as log:
            if self.recipe_line:
                log.write((self.recipe_line + "\n").encode())
                log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop() ends all of it
            )
        try:
            self._wait_ready(begin)
        except BaseException:  # a failed start, or the bench interrupted (SIGTERM, Ctrl-C)
            self.stop()
            raise
        self.startup_s = time.monotonic() - begin
        return self

    def _log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def _fail(self, what: str) -> ServerStartError:
        lines = self._log_lines()
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "(empty)")
        cause = _log_cause(lines) or what
        return ServerStartError(
            f"sglang server ({self.policy}) {what}: {cause} [log {self.log_path}, last line: "
            f"{last[:300]}]"
        )

    def _wait_ready(self, begin: float) -> None:
        assert self.proc is not None
        while True:
            code = self.proc.poll()
            if code is not None:
                raise self._fail(f"exited with code {code} before /health answered")
            bind_error = next((ln for ln in self._log_lines() if _BIND_ERROR in ln), None)
            if bind_error is not None:  # uvicorn does not exit after this; the scheduler lives
                raise self._fail(f"cannot listen on port {self.port}")
            if time.monotonic() - begin > self.start_timeout_s:
                raise self._fail(f"did not answer /health within {self.start_timeout_s:.0f} s")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL it after :data:`STOP_GRACE_S`; the log is kept.

        Returns:
            The server's exit code (``None`` if it was never started).
        """
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (scheduler, detokenizer)
        except (ProcessLookupError, PermissionError):
            pass
        return proc.wait()

    def stats(self) -> dict[str, Any] | None:
        """The plugin's last counters (:mod:`.stats`); ``None`` without the plugin or before any."""
        return read_stats(self.stats_path) if self.stats_path is not None else None

    def post(self, route: str, body: Mapping[str, Any], timeout_s: float = 300.0) -> Any:
        """POST JSON to ``route``; the decoded reply.

        Raises:
            urllib.error.HTTPError: a non-2xx answer (its body readable with ``.read()``).
        """
        req = urllib.request.Request(
            f"{self.url}{route}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())

    def get(self, route: str, timeout_s: float = 30.0) -> Any:
        """GET ``route``; the decoded JSON reply."""
        with urllib.request.urlopen(f"{self.url}{route}", timeout=timeout_s) as resp:
            return json.loads(resp.read())

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
