"""Field-level readers shared by the trace loaders: text decoding, CSV/JSON records, and checked
integers, seconds and hash lists, each failing with a ``TraceFormatError`` that names the file,
line and field."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path

from superinfer.harness.errors import TraceFormatError
from superinfer.harness.workload.limits import MAX_HASH, MAX_TOKENS

__all__ = [
    "SHOWN_CHARS",
    "check_hashes",
    "csv_header",
    "csv_records",
    "finite_seconds",
    "json_object",
    "json_positive_int",
    "lenient_positive_int",
    "numbered_lines",
    "positive_int",
    "read_trace_text",
    "require_columns",
    "show_value",
]

#: Longest value quoted in an error message.
SHOWN_CHARS = 40


def show_value(value: object) -> str:
    """``repr(value)``, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def read_trace_text(path: Path) -> str:
    """The file as text (UTF-8, a leading BOM dropped), or a one-line error."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(path, None, None, f"cannot read ({exc.strerror})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceFormatError(path, line, None, f"not UTF-8 (byte {exc.start})") from None


def numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` split on ``\\n`` only, as editors count lines."""
    for number, line in enumerate(text.split("\n"), start=1):
        yield number, line.rstrip("\r")


def _in_bounds(path: Path, line: int, field: str, value: int) -> int:
    if value < 1:
        raise TraceFormatError(path, line, field, f"{show_value(value)} must be >= 1")
    if value > MAX_TOKENS:
        raise TraceFormatError(
            path, line, field, f"{show_value(value)} is over the limit of {MAX_TOKENS:,} tokens"
        )
    return value


def positive_int(path: Path, line: int, field: str, text: str) -> int:
    """A token count in ``[1, MAX_TOKENS]`` written as a decimal integer.

    Raises:
        TraceFormatError: not an integer, or out of bounds (the message names the bound).
    """
    try:
        value = int(text)
    except ValueError:
        raise TraceFormatError(path, line, field, f"{show_value(text)} is not an integer") from None
    return _in_bounds(path, line, field, value)


def lenient_positive_int(path: Path, line: int, field: str, text: str) -> int:
    """A positive integer written as ``12`` or ``12.0`` (pandas writes integral floats so)."""
    try:
        return positive_int(path, line, field, text)
    except TraceFormatError:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value.is_integer()):
            raise
        return positive_int(path, line, field, str(int(value)))


def json_positive_int(path: Path, line: int, field: str, value: object) -> int:
    """A token count in ``[1, MAX_TOKENS]`` from a JSON value (an integral float is accepted).

    Raises:
        TraceFormatError: not an integer, or out of bounds (the message names the bound).
    """
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TraceFormatError(path, line, field, f"{show_value(value)} is not an integer")
    return _in_bounds(path, line, field, value)


def finite_seconds(path: Path, line: int, field: str, value: float, unit: float) -> float:
    """``value * unit`` as a finite time >= 0 s."""
    try:
        seconds = float(value) * unit
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise TraceFormatError(path, line, field, f"{show_value(value)} is not a finite time >= 0")
    return seconds


def check_hashes(
    path: Path, line: int, field: str, hashes: object, prompt: int, block_tokens: int
) -> tuple[int, ...]:
    if not isinstance(hashes, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h <= MAX_HASH for h in hashes
    ):
        raise TraceFormatError(path, line, field, "not a list of integers in [0, 2^63)")
    expected = -(-prompt // block_tokens)
    if len(hashes) != expected:
        raise TraceFormatError(
            path,
            line,
            field,
            f"{len(hashes)} blocks, but input_length {prompt} needs {expected} of {block_tokens}",
        )
    return tuple(hashes)


def csv_records(
    path: Path, text: str, columns: tuple[str, ...] = ()
) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line, {column: cell})`` per non-blank data row; the header is line 1 and must name
    every one of ``columns`` (checked before any row, so a missing column is what is reported).

    Raises:
        TraceFormatError: empty file, duplicate header names, a missing column, a row with
            fewer fields than the
            header or with a value past its last column (empty trailing fields pass), or a CSV
            syntax error.
    """
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(path, None, None, "empty file (no header)")
        header = [h.strip() for h in header]
        dupes = sorted({h for h in header if header.count(h) > 1})
        if dupes:
            raise TraceFormatError(path, 1, dupes[0], "column named twice in the header")
        require_columns(path, header, columns)
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue  # blank line
            extra = any(cell.strip() for cell in row[len(header) :])  # trailing commas pass
            if len(row) < len(header) or extra:
                raise TraceFormatError(
                    path, line, None, f"{len(row)} fields, header has {len(header)}"
                )
            yield line, dict(zip(header, row[: len(header)], strict=True))
    except csv.Error as exc:
        raise TraceFormatError(path, reader.line_num or None, None, f"bad CSV ({exc})") from None


def require_columns(path: Path, header: list[str], columns: tuple[str, ...]) -> None:
    for col in columns:
        if col not in header:
            raise TraceFormatError(path, 1, col, f"missing column (header: {','.join(header)})")


def csv_header(path: Path, text: str) -> list[str]:
    first = text.split("\n", 1)[0]
    try:
        return [h.strip() for h in next(csv.reader([first]), [])]
    except csv.Error:
        return []


def json_object(path: Path, line: int, text: str) -> dict[str, object]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, line, None, f"not JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # >4300-digit integers, deep nesting
        raise TraceFormatError(path, line, None, f"not usable JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(path, line, None, "not a JSON object")
    return obj
