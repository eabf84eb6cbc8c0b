"""Trace loaders: real request traces into validated rows (arrival, prompt and output lengths).

Every loader rejects malformed input with a :class:`TraceFormatError` naming the file, the line
and the field; nothing malformed is skipped silently.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from superinfer.harness.errors import TraceFormatError

__all__ = ["TraceRow", "load_azure_csv", "parse_azure_timestamp"]

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace.

    Attributes:
        arrival_s: seconds since the trace's own epoch (for Azure: the Unix epoch, naive time).
        prompt_tokens: input tokens, >= 1.
        output_tokens: output tokens, >= 1.
        line: 1-based line in the source file.
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    line: int


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
