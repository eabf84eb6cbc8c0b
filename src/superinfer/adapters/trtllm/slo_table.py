"""Per-request SLO classes for the in-engine scheduler, keyed by the LLM API request id.

TensorRT-LLM 1.2 carries no priority or metadata from the LLM API to ``LlmRequest`` (priority is
hard-coded 0.5 in ``executor_request_to_llm_request``; engine notes §1.6), so the worker-side
scheduler looks the class up by ``LlmRequest.py_client_id``. In one process a dict does
(:class:`InMemorySloTable`); when the executor runs in an MPI-spawned worker process, the front end
appends JSON lines to a file the worker tails (:class:`FileSloTable`; same host).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from superinfer.policy_core.types import SLO

__all__ = ["FileSloTable", "InMemorySloTable", "SloEntry", "SloTable", "SloTableError"]


class SloTableError(ValueError):
    """A malformed SLO table file or an unknown class name (one line, naming file and line)."""


@dataclass(frozen=True, slots=True)
class SloEntry:
    """What the front end registered for one request.

    Attributes:
        slo: the request's SLO class.
        arrival_s: arrival instant on the host's monotonic clock (``time.monotonic``), in s, or
            ``None`` to let the scheduler use the instant it first sees the request.
    """

    slo: SLO
    arrival_s: float | None = None


class SloTable(Protocol):
    """Where the in-engine scheduler finds a request's SLO class."""

    def lookup(self, client_id: int) -> SloEntry | None:
        """The entry registered for LLM API request id ``client_id``, or ``None``."""
        ...


class InMemorySloTable:
    """A dict, for when the executor runs in this process (``TLLM_WORKER_USE_SINGLE_PROCESS=1``)."""

    def __init__(self) -> None:
        self._entries: dict[int, SloEntry] = {}

    def put(self, client_id: int, slo: SLO, arrival_s: float | None = None) -> None:
        """Register ``slo`` for LLM API request id ``client_id``."""
        self._entries[client_id] = SloEntry(slo, arrival_s)

    def lookup(self, client_id: int) -> SloEntry | None:
        return self._entries.get(client_id)

    def discard(self, client_id: int) -> None:
        """Forget a request (after it ended)."""
        self._entries.pop(client_id, None)


class FileSloTable:
    """An append-only JSON-lines file shared by the front end (writer) and the worker (reader).

    Each line is ``{"client_id": int, "slo": class name, "arrival_s": float | null}``. The reader
    reads new complete lines only when a lookup misses, so a scheduling step costs one dict lookup
    per request once every id is known.

    Args:
        path: the file; created by the first ``put``.
        classes: SLO classes by name; every name in the file must be one of them.
    """

    def __init__(self, path: str | os.PathLike[str], classes: Mapping[str, SLO]) -> None:
        self.path = Path(path)
        self.classes = dict(classes)
        self._entries: dict[int, SloEntry] = {}
        self._offset = 0
        self._line_no = 0
        self._lock = threading.Lock()

    def put(self, client_id: int, slo: SLO | str, arrival_s: float | None = None) -> None:
        """Append one entry (the writer side).

        Raises:
            SloTableError: ``slo`` names no known class.
        """
        name = slo if isinstance(slo, str) else slo.name
        if name not in self.classes:
            raise SloTableError(f"{self.path}: unknown SLO class {name!r}")
        line = json.dumps({"client_id": client_id, "slo": name, "arrival_s": arrival_s})
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")

    def lookup(self, client_id: int) -> SloEntry | None:
        entry = self._entries.get(client_id)
        if entry is None:
            self._refresh()
            entry = self._entries.get(client_id)
        return entry

    def _refresh(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # complete lines only; a line being written waits
        for raw in data[:end].splitlines():
            self._line_no += 1
            self._parse(raw)
        self._offset += end

    def _parse(self, raw: bytes) -> None:
        where = f"{self.path}:{self._line_no}"
        try:
            row = json.loads(raw)
            client_id, name = int(row["client_id"]), str(row["slo"])
            arrival = row.get("arrival_s")
            arrival_s = None if arrival is None else float(arrival)
        except (ValueError, KeyError, TypeError) as exc:
            raise SloTableError(f"{where}: not an SLO table line ({exc})") from None
        if name not in self.classes:
            raise SloTableError(f"{where}: unknown SLO class {name!r}")
        self._entries[client_id] = SloEntry(self.classes[name], arrival_s)
