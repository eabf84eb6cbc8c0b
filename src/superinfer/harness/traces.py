"""Trace loaders: real request traces into validated rows (arrival, prompt and output lengths).

Every loader rejects malformed input with a :class:`TraceFormatError` naming the file, the line
and the field; nothing malformed is skipped silently.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from superinfer.harness.errors import TraceFormatError

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "TraceRow",
    "load_azure_csv",
    "load_mooncake_jsonl",
    "parse_azure_timestamp",
]

#: Tokens per hashed block in the Mooncake traces (kvcache-ai/Mooncake FAST25-release README).
MOONCAKE_BLOCK_TOKENS = 512

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace.

    Attributes:
        arrival_s: seconds since the trace's own epoch (for Azure: the Unix epoch, naive time).
        prompt_tokens: input tokens, >= 1.
        output_tokens: output tokens, >= 1.
        line: 1-based line in the source file.
        block_hashes: prefix-chained KV block hashes of the prompt (Mooncake ``hash_ids``).
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    line: int
    block_hashes: tuple[int, ...] = ()


def parse_azure_timestamp(text: str) -> float:
    """Seconds since the Unix epoch of ``YYYY-MM-DD HH:MM:SS[.fffffff]`` (naive, read as UTC).

    Azure's timestamps carry 7 fractional digits (.NET 100 ns ticks), which
    ``datetime.strptime('%f')`` rejects, so the fraction is parsed separately.

    Raises:
        ValueError: not of that form.
    """
    head, _, frac = text.strip().partition(".")
    if frac and not frac.isdigit():
        raise ValueError(text)
    whole = datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
    seconds = (whole - datetime(1970, 1, 1)).total_seconds()
    return seconds + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _positive_int(path: Path, line: int, field: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TraceFormatError(path, line, field, f"{text!r} is not an integer") from None
    if value < 1:
        raise TraceFormatError(path, line, field, f"{value} must be >= 1")
    return value


def _json_positive_int(path: Path, line: int, field: str, value: object) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TraceFormatError(path, line, field, f"{value!r} is not an integer")
    if value < 1:
        raise TraceFormatError(path, line, field, f"{value} must be >= 1")
    return value


def load_azure_csv(path: Path) -> list[TraceRow]:
    """Load an Azure LLM inference trace (2023, ``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Args:
        path: the CSV file.

    Returns:
        Rows in file order; arrival times strictly as in the file (must not decrease).

    Raises:
        TraceFormatError: missing or empty file, missing column, unparseable or decreasing
            timestamp, non-integer or non-positive length.
    """
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceFormatError(path, None, None, f"cannot read ({exc.strerror})") from None
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(path, None, None, "empty file (no header)")
        header = [h.strip() for h in header]
        for col in _AZURE_COLUMNS:
            if col not in header:
                raise TraceFormatError(path, 1, col, f"missing column (header: {','.join(header)})")
        i_ts, i_in, i_out = (header.index(c) for c in _AZURE_COLUMNS)
        rows: list[TraceRow] = []
        last = float("-inf")
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue  # blank line
            if len(row) < len(header):
                raise TraceFormatError(
                    path, line, None, f"{len(row)} fields, header has {len(header)}"
                )
            try:
                arrival = parse_azure_timestamp(row[i_ts])
            except ValueError:
                raise TraceFormatError(
                    path, line, "TIMESTAMP", f"{row[i_ts]!r} is not 'YYYY-MM-DD HH:MM:SS.fffffff'"
                ) from None
            if arrival < last:
                raise TraceFormatError(
                    path, line, "TIMESTAMP", f"{row[i_ts]!r} is earlier than the line before"
                )
            last = arrival
            prompt = _positive_int(path, line, "ContextTokens", row[i_in])
            output = _positive_int(path, line, "GeneratedTokens", row[i_out])
            rows.append(TraceRow(arrival, prompt, output, line))
    if not rows:
        raise TraceFormatError(path, None, None, "no requests (header only)")
    return rows


def load_mooncake_jsonl(path: Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[TraceRow]:
    """Load a Mooncake trace (JSON Lines: ``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids``), as in ``kvcache-ai/Mooncake`` ``FAST25-release/traces/*.jsonl``.

    Arrival times are returned as the file gives them (``timestamp / 1000`` s); the conversation
    trace quantizes them to about 3 s buckets, which a workload may spread.

    Args:
        path: the ``.jsonl`` file.
        block_tokens: tokens per hashed block; ``len(hash_ids)`` must be
            ``ceil(input_length / block_tokens)``.

    Raises:
        TraceFormatError: missing or empty file, a line that is not a JSON object, a missing or
            non-integer field, a decreasing timestamp, or ``hash_ids`` of the wrong length.
    """
    try:
        fh = path.open(encoding="utf-8")
    except OSError as exc:
        raise TraceFormatError(path, None, None, f"cannot read ({exc.strerror})") from None
    rows: list[TraceRow] = []
    last = float("-inf")
    with fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, line, None, f"not JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceFormatError(path, line, None, "not a JSON object")
            for key in ("timestamp", "input_length", "output_length", "hash_ids"):
                if key not in obj:
                    raise TraceFormatError(path, line, key, "missing")
            ts = obj["timestamp"]
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts != ts or ts < 0:
                raise TraceFormatError(path, line, "timestamp", f"{ts!r} is not a time >= 0 (ms)")
            if ts < last:
                raise TraceFormatError(
                    path, line, "timestamp", f"{ts} is earlier than the line before"
                )
            last = ts
            prompt = _json_positive_int(path, line, "input_length", obj["input_length"])
            output = _json_positive_int(path, line, "output_length", obj["output_length"])
            hashes = obj["hash_ids"]
            if not isinstance(hashes, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hashes
            ):
                raise TraceFormatError(path, line, "hash_ids", "not a list of integers >= 0")
            expected = -(-prompt // block_tokens)
            if len(hashes) != expected:
                raise TraceFormatError(
                    path,
                    line,
                    "hash_ids",
                    f"{len(hashes)} blocks, but "
                    f"input_length {prompt} needs {expected} of {block_tokens}",
                )
            rows.append(TraceRow(ts / 1000.0, prompt, output, line, tuple(hashes)))
    if not rows:
        raise TraceFormatError(path, None, None, "no requests (empty file)")
    return rows
