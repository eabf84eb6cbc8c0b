"""Double of ``tensorrt_llm.bindings.executor``: finish reasons and the KV retention config.

``KvCacheRetentionConfig`` mirrors the C++ class re-exported as
``tensorrt_llm.llmapi.KvCacheRetentionConfig`` (engine notes §2.2), including its validation:
priorities in [0, 100], ranges non-empty and non-overlapping.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import timedelta

__all__ = ["FinishReason", "KvCacheRetentionConfig", "KvCacheTransferMode"]

MIN_RETENTION_PRIORITY = 0
MAX_RETENTION_PRIORITY = 100
DEFAULT_RETENTION_PRIORITY = 35


class FinishReason(enum.IntEnum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


class KvCacheTransferMode(enum.Enum):
    DRAM = 0
    GDS = 1
    POSIX_DEBUG_FALLBACK = 2


def _check_priority(priority: int) -> None:
    if not MIN_RETENTION_PRIORITY <= priority <= MAX_RETENTION_PRIORITY:
        raise ValueError(f"retention priority must be in [0, 100], got {priority}")


class _TokenRangeRetentionConfig:
    def __init__(
        self,
        token_start: int,
        token_end: int | None = None,
        priority: int = DEFAULT_RETENTION_PRIORITY,
        duration_ms: timedelta | None = None,
    ) -> None:
        if token_start < 0 or (token_end is not None and token_end <= token_start):
            raise ValueError(f"bad token range [{token_start}, {token_end})")
        if duration_ms is not None and not isinstance(duration_ms, timedelta):
            raise TypeError("duration_ms must be a datetime.timedelta")
        _check_priority(priority)
        self.token_start = token_start
        self.token_end = token_end
        self.priority = priority
        self.duration_ms = duration_ms

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TokenRangeRetentionConfig) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return (
            f"TokenRangeRetentionConfig({self.token_start}, {self.token_end}, "
            f"priority={self.priority}, duration_ms={self.duration_ms})"
        )


class KvCacheRetentionConfig:
    TokenRangeRetentionConfig = _TokenRangeRetentionConfig

    def __init__(
        self,
        token_range_retention_configs: Sequence[_TokenRangeRetentionConfig],
        decode_retention_priority: int = DEFAULT_RETENTION_PRIORITY,
        decode_duration_ms: timedelta | None = None,
        transfer_mode: KvCacheTransferMode = KvCacheTransferMode.DRAM,
        directory: str | None = None,
    ) -> None:
        ranges = sorted(token_range_retention_configs, key=lambda r: r.token_start)
        for a, b in zip(ranges, ranges[1:], strict=False):
            if a.token_end is None or a.token_end > b.token_start:
                raise ValueError("token ranges of a retention config must not overlap")
        _check_priority(decode_retention_priority)
        self.token_range_retention_configs = list(ranges)
        self.decode_retention_priority = decode_retention_priority
        self.decode_duration_ms = decode_duration_ms
        self.transfer_mode = transfer_mode
        self.directory = directory

    def _fake_priority_of_token(self, index: int) -> tuple[int, timedelta | None]:
        """Double-only helper: (priority, duration) of prompt token ``index``."""
        for r in self.token_range_retention_configs:
            if r.token_start <= index and (r.token_end is None or index < r.token_end):
                return r.priority, r.duration_ms
        return DEFAULT_RETENTION_PRIORITY, None
