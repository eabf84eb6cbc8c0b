"""The plugin's counters, readable from outside SGLang's scheduler process.

The scheduler is a ``spawn`` child of the server, so the harness cannot ask the adapter object.
With ``SUPERINFER_STATS_FILE=PATH`` in the server's environment the adapter rewrites ``PATH`` as
one JSON object (write to a temporary file in the same folder, then ``os.replace``: a reader never
sees half a file) at most every :data:`WRITE_INTERVAL_S` seconds after a step, and always after the
step that leaves the scheduler with nothing to run (so the file is final once traffic stops).
:func:`read_stats` reads it back.

Fields (all counters since the scheduler started): ``pid``, ``policy``, ``kv_policy``,
``decisions``, ``invalid_decisions``, ``rejected``, ``bad_slo``, ``preempted``,
``retraction_points``, ``placements``, ``precision_plans``, ``steps``, ``policy_stats`` (the
scheduling policy's own counters, :func:`superinfer.adapters.hookspecs.policy_counters`:
``superinfer``'s ``ttft_boosts``, ``rejected``, tier moves; ``{}`` for a policy without),
``policy_us`` (``sum``, ``count``, ``p50``, ``p99``: wall time of each ``superinfer_schedule``
call, microseconds), ``step_us`` (the same for each ``Scheduler.run_batch``: the forward pass),
``placement_us`` (the same for each ``superinfer_kv_placement`` call, the node views not counted),
``kv`` (KV pool tokens after the step: ``total``, ``free``, ``cached`` in evictable radix nodes,
``in_use`` by requests), ``pins`` (prefix nodes pinned by the placement policy),
``written_unix_s``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_STATS_FILE",
    "WRITE_INTERVAL_S",
    "LatencyStats",
    "StatsFile",
    "Telemetry",
    "kv_usage",
    "read_stats",
]

ENV_STATS_FILE = "SUPERINFER_STATS_FILE"

#: Rewrites at most this often (seconds): a write costs ~0.1 ms, a CPU decode step ~40 ms.
WRITE_INTERVAL_S = 0.25

#: Percentiles are taken over the last this many samples (bounded memory in a long-lived server).
WINDOW = 4096


class LatencyStats:
    """Sum, count and windowed p50/p99 of durations, in microseconds, and the latest one
    (``last_s``, seconds; ``None`` before any)."""

    def __init__(self, window: int = WINDOW) -> None:
        self.sum_us = 0.0
        self.count = 0
        self.last_s: float | None = None  # the latest duration, s
        self._recent: deque[float] = deque(maxlen=window)

    def add(self, seconds: float) -> None:
        """Record one duration (seconds)."""
        self.last_s = seconds
        us = seconds * 1e6
        self.sum_us += us
        self.count += 1
        self._recent.append(us)

    def as_dict(self) -> dict[str, float | int | None]:
        """``{"sum", "count", "p50", "p99"}`` in microseconds; percentiles ``None`` when empty."""
        ordered = sorted(self._recent)

        def pct(q: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

        return {
            "sum": round(self.sum_us, 1),
            "count": self.count,
            "p50": pct(0.5),
            "p99": pct(0.99),
        }


class StatsFile:
    """Atomic, rate-limited JSON snapshots of an adapter's counters.

    Args:
        path: the file to rewrite.
        header: constant fields written into every snapshot (policy names, pid).
        interval_s: least time between two writes, unless forced.
    """

    def __init__(
        self, path: str | Path, header: Mapping[str, Any], interval_s: float = WRITE_INTERVAL_S
    ) -> None:
        self.path = Path(path)
        self.header = dict(header)
        self.interval_s = interval_s
        self._last = 0.0

    def due(self, *, force: bool = False) -> bool:
        """Whether :meth:`maybe_write` would write now: ``interval_s`` has passed, or ``force``."""
        return force or time.monotonic() - self._last >= self.interval_s

    def maybe_write(self, counters: Any, extra: Mapping[str, Any], *, force: bool = False) -> bool:
        """Write a snapshot if ``interval_s`` has passed (or ``force``); never raises ``OSError``.

        Returns:
            Whether a snapshot was written.
        """
        if not self.due(force=force):
            return False
        self._last = time.monotonic()
        body = dict(self.header)
        if is_dataclass(counters) and not isinstance(counters, type):
            body.update(asdict(counters))
        else:
            body.update(dict(counters))
        body.update(extra)
        body["written_unix_s"] = round(time.time(), 3)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".stats-", suffix=".json")
            with os.fdopen(fd, "w") as fh:
                json.dump(body, fh, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError:
            return False  # a full disk must not stop the scheduler
        return True


class Telemetry:
    """What the adapter measures about itself: policy, step and placement wall times, and the
    stats file.

    Args:
        path: the stats file (``SUPERINFER_STATS_FILE``), or ``None`` to write none.
        header: constant fields of every snapshot.
        policy_stats: the scheduling policy's counters (called only when a snapshot is written;
            its result is the ``policy_stats`` field), or ``None`` for no such field.
    """

    def __init__(
        self,
        path: str | None,
        header: Mapping[str, Any],
        policy_stats: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.policy = LatencyStats()
        self.step = LatencyStats()
        self.placement = LatencyStats()
        self.file = StatsFile(path, header) if path else None
        self.policy_stats = policy_stats

    @classmethod
    def from_env(
        cls,
        header: Mapping[str, Any],
        environ: Mapping[str, str] | None = None,
        policy_stats: Callable[[], Mapping[str, int]] | None = None,
    ) -> Telemetry:
        """A telemetry writing to ``$SUPERINFER_STATS_FILE`` when set (``policy_stats``: as in
        the class)."""
        env = os.environ if environ is None else environ
        path = env.get(ENV_STATS_FILE) or None
        return cls(path, {"pid": os.getpid(), **header}, policy_stats)

    def publish(self, counters: Any, *, force: bool = False, **more: Any) -> bool:
        """Snapshot ``counters`` (a dataclass), the timings and ``more`` fields (JSON values)
        when :meth:`StatsFile.due`; nothing is gathered otherwise (the policy's counters, the
        percentiles' sorts), as this runs after every step."""
        if self.file is None or not self.file.due(force=force):
            return False
        if self.policy_stats is not None:
            more["policy_stats"] = dict(self.policy_stats())
        extra = {
            **more,
            "steps": self.step.count,
            "policy_us": self.policy.as_dict(),
            "step_us": self.step.as_dict(),
            "placement_us": self.placement.as_dict(),
        }
        return self.file.maybe_write(counters, extra, force=True)  # due: checked above


def kv_usage(allocator: Any, tree_cache: Any) -> dict[str, int]:
    """KV pool tokens of an SGLang allocator and radix cache: ``total``, ``free``, ``cached``
    (evictable radix nodes) and ``in_use`` (held by requests: the rest)."""
    total, free = int(allocator.size), int(allocator.available_size())
    cached = int(tree_cache.evictable_size())
    return {"total": total, "free": free, "cached": cached, "in_use": total - free - cached}


def read_stats(path: str | Path) -> dict[str, Any] | None:
    """The last snapshot at ``path``, or ``None`` when none was written yet."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
