"""Trace loaders: real request traces and prompt sets into validated rows.

Every loader rejects malformed input with a :class:`TraceFormatError` naming the file, the line
and the field; nothing malformed is skipped silently, and no other exception escapes (a
Hypothesis fuzz test in ``tests/harness/test_trace_fuzz.py`` holds every loader to that).

- :func:`load_azure_csv`: Azure 2023 ``conv``/``code``; wall-clock arrivals (100 ns), lengths.
- :func:`load_mooncake_jsonl`: Mooncake; ms arrivals in ~3 s buckets, lengths, 512-token hashes.
- :func:`load_sharegpt_lengths_csv`: sarathi-serve's ShareGPT length table; lengths only.
- :func:`load_sharegpt_prompts_json`: ShareGPT first-turn prompts; text and its token count.
- :func:`load_table`: a user's CSV or JSONL through a :class:`ColumnMap`; optional arrivals,
  block hashes and text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from superinfer.harness.errors import DataError, TraceFormatError
from superinfer.harness.workload.trace_fields import (
    check_hashes,
    csv_header,
    csv_records,
    finite_seconds,
    json_object,
    json_positive_int,
    lenient_positive_int,
    numbered_lines,
    positive_int,
    read_trace_text,
    require_columns,
    show_value,
)

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "TIME_UNITS",
    "ColumnMap",
    "LengthRow",
    "TraceRow",
    "load_azure_csv",
    "load_mooncake_jsonl",
    "load_sharegpt_lengths_csv",
    "load_sharegpt_prompts_json",
    "load_table",
    "mistral_v1_token_counter",
    "parse_azure_timestamp",
]

#: Tokens per hashed block in the Mooncake traces (kvcache-ai/Mooncake FAST25-release README).
MOONCAKE_BLOCK_TOKENS = 512

#: Seconds per unit of a numeric arrival column; ``datetime`` columns hold date-time strings.
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "datetime": 1.0}

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_SHAREGPT_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace with arrival times.

    Attributes:
        arrival_s: seconds since the trace's own epoch (for Azure: the Unix epoch, naive time).
        prompt_tokens: input tokens, >= 1.
        output_tokens: output tokens, >= 1.
        line: 1-based line in the source file.
        block_hashes: prefix-chained KV block hashes of the prompt (Mooncake ``hash_ids``).
        prompt: the prompt text, when the file has it.
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    line: int
    block_hashes: tuple[int, ...] = ()
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class LengthRow:
    """One request of a file without arrival times (a length table or a prompt set).

    Attributes:
        prompt_tokens: input tokens, >= 1.
        output_tokens: output tokens, >= 1, or ``None`` when the file has none (prompt sets:
            the workload then sets a fixed output length, as vLLM's ``--sharegpt-output-len``).
        line: 1-based line in the source file.
        block_hashes: prefix-chained KV block hashes, when the file has them.
        prompt: the prompt text, when the file has it.
        key: the row's own id in the file (ShareGPT ``id``), or ``""``.
    """

    prompt_tokens: int
    output_tokens: int | None
    line: int
    block_hashes: tuple[int, ...] = ()
    prompt: str | None = None
    key: str = ""


@dataclass(frozen=True, slots=True)
class ColumnMap:
    """Which column (CSV) or key (JSONL) of a user's trace holds what.

    Attributes:
        prompt_tokens: input length column. May be ``None`` when ``prompt`` is given: the text is
            then tokenized (:func:`mistral_v1_token_counter`).
        output_tokens: output length column.
        arrival: arrival time column, or ``None`` for a length-only file (the workload then
            draws arrivals). Times must not decrease from one row to the next.
        time_unit: unit of ``arrival``: ``s``, ``ms``, ``us``, or ``datetime`` for date-time
            strings (``YYYY-MM-DD HH:MM:SS[.f...]`` read as UTC, or ISO 8601 with an offset).
        block_hashes: prefix-chained KV block hash column (a JSON list in JSONL; in CSV a JSON
            list or integers separated by spaces), or ``None``.
        hash_block_tokens: tokens per hashed block; required with ``block_hashes``, and then
            ``len(hashes) == ceil(prompt_tokens / hash_block_tokens)`` is checked.
        prompt: prompt text column, or ``None``.

    Raises:
        ValueError: an unknown ``time_unit``, no source of prompt length, or hashes without a
            block size.
    """

    prompt_tokens: str | None
    output_tokens: str
    arrival: str | None = None
    time_unit: str = "s"
    block_hashes: str | None = None
    hash_block_tokens: int = 0
    prompt: str | None = None

    def __post_init__(self) -> None:
        if self.time_unit not in TIME_UNITS:
            raise ValueError(f"time_unit must be one of {', '.join(TIME_UNITS)}")
        if self.prompt_tokens is None and self.prompt is None:
            raise ValueError("map prompt_tokens, or prompt to count its tokens")
        if self.block_hashes is not None and self.hash_block_tokens < 1:
            raise ValueError("block_hashes needs hash_block_tokens >= 1")

    def columns(self) -> tuple[str, ...]:
        """The mapped column names, in a fixed order."""
        named = (self.arrival, self.prompt_tokens, self.output_tokens, self.block_hashes)
        return tuple(c for c in (*named, self.prompt) if c is not None)


# -- Azure ----------------------------------------------------------------------------------


def parse_azure_timestamp(text: str) -> float:
    """Seconds since the Unix epoch of ``YYYY-MM-DD HH:MM:SS[.fffffff]`` (naive, read as UTC).

    Azure's timestamps carry 7 fractional digits (.NET 100 ns ticks), which
    ``datetime.strptime('%f')`` rejects, so the fraction is parsed separately.

    Raises:
        ValueError: not of that form.
    """
    head, _, frac = text.strip().partition(".")
    if frac and not (frac.isascii() and frac.isdigit()):
        raise ValueError(text)
    whole = datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
    seconds = (whole - datetime(1970, 1, 1)).total_seconds()
    return seconds + (int(frac) / 10 ** len(frac) if frac else 0.0)


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
    text = read_trace_text(path)
    rows: list[TraceRow] = []
    last = float("-inf")
    for line, rec in csv_records(path, text, _AZURE_COLUMNS):
        stamp = rec["TIMESTAMP"]
        try:
            arrival = parse_azure_timestamp(stamp)
        except ValueError:
            raise TraceFormatError(
                path, line, "TIMESTAMP", f"{show_value(stamp)} is not 'YYYY-MM-DD HH:MM:SS.fffffff'"
            ) from None
        if arrival < last:
            raise TraceFormatError(
                path, line, "TIMESTAMP", f"{show_value(stamp)} is earlier than the line before"
            )
        last = arrival
        prompt = positive_int(path, line, "ContextTokens", rec["ContextTokens"])
        output = positive_int(path, line, "GeneratedTokens", rec["GeneratedTokens"])
        rows.append(TraceRow(arrival, prompt, output, line))
    if not rows:
        require_columns(path, csv_header(path, text), _AZURE_COLUMNS)
        raise TraceFormatError(path, None, None, "no requests (header only)")
    return rows


# -- Mooncake -------------------------------------------------------------------------------


def load_mooncake_jsonl(path: Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[TraceRow]:
    """Load a Mooncake trace (JSON Lines: ``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids``), as in ``kvcache-ai/Mooncake`` ``FAST25-release/traces/*.jsonl``.

    Arrival times are returned as the file gives them (``timestamp / 1000`` s); the conversation
    trace quantizes them to about 3 s buckets, which a workload may spread
    (:func:`superinfer.harness.workload.arrivals.spread_buckets`).

    Args:
        path: the ``.jsonl`` file.
        block_tokens: tokens per hashed block; ``len(hash_ids)`` must be
            ``ceil(input_length / block_tokens)``.

    Raises:
        TraceFormatError: missing or empty file, a line that is not a JSON object, a missing or
            non-integer field, a decreasing timestamp, or ``hash_ids`` of the wrong length.
    """
    rows: list[TraceRow] = []
    last = float("-inf")
    for line, text in numbered_lines(read_trace_text(path)):
        if not text.strip():
            continue
        obj = json_object(path, line, text)
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in obj:
                raise TraceFormatError(path, line, key, "missing")
        ts = obj["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts != ts or ts < 0:
            raise TraceFormatError(
                path, line, "timestamp", f"{show_value(ts)} is not a time >= 0 (ms)"
            )
        finite_seconds(path, line, "timestamp", ts, 1e-3)
        if ts < last:
            raise TraceFormatError(path, line, "timestamp", f"{ts} is earlier than the line before")
        last = ts
        prompt = json_positive_int(path, line, "input_length", obj["input_length"])
        output = json_positive_int(path, line, "output_length", obj["output_length"])
        hashes = check_hashes(path, line, "hash_ids", obj["hash_ids"], prompt, block_tokens)
        # ts / 1000 rather than ts * 1e-3: exact for the integer milliseconds of the file.
        rows.append(TraceRow(ts / 1000.0, prompt, output, line, hashes))
    if not rows:
        raise TraceFormatError(path, None, None, "no requests (empty file)")
    return rows


# -- ShareGPT -------------------------------------------------------------------------------


def load_sharegpt_lengths_csv(path: Path) -> list[LengthRow]:
    """Load the ShareGPT length table (``microsoft/sarathi-serve``
    ``data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv``): prompt and reply
    lengths of 30,731 ShareGPT conversations under the Llama-2 tokenizer, no arrival times.

    Columns ``num_prefill_tokens`` and ``num_decode_tokens`` are required; ``num_total_tokens``,
    when present, must be their sum (``pd_ratio`` is ignored).

    Raises:
        TraceFormatError: missing or empty file, missing column, a non-integer or non-positive
            length, or a total that is not the sum.
    """
    text = read_trace_text(path)
    rows: list[LengthRow] = []
    for line, rec in csv_records(path, text, _SHAREGPT_COLUMNS):
        prompt = positive_int(path, line, "num_prefill_tokens", rec["num_prefill_tokens"])
        output = positive_int(path, line, "num_decode_tokens", rec["num_decode_tokens"])
        if "num_total_tokens" in rec:
            total = positive_int(path, line, "num_total_tokens", rec["num_total_tokens"])
            if total != prompt + output:
                raise TraceFormatError(
                    path, line, "num_total_tokens", f"{total} != {prompt} + {output}"
                )
        rows.append(LengthRow(prompt, output, line))
    if not rows:
        require_columns(path, csv_header(path, text), _SHAREGPT_COLUMNS)
        raise TraceFormatError(path, None, None, "no requests (header only)")
    return rows


#: The tokenizer behind :func:`mistral_v1_token_counter` (cached: loading takes about 1 s).
_MISTRAL_V1: list[Callable[[str], int]] = []


def mistral_v1_token_counter() -> Callable[[str], int]:
    """Token counter of Mistral-7B v0.1's tokenizer, shipped offline in ``mistral-common``.

    A SentencePiece BPE model with a 32,000-token vocabulary, the same algorithm and vocabulary
    size as Llama-2's, whose tokenizer counted the ShareGPT length table: counts from both
    ShareGPT files are then comparable. No BOS/EOS token is counted (a chat template adds a few
    tokens on a real engine, which tokenizes the text itself).

    Raises:
        DataError: ``mistral-common`` is not installed (``pip install 'superinfer[text]'``).
    """
    if not _MISTRAL_V1:
        try:
            from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
        except ImportError:
            raise DataError(
                "counting prompt tokens needs mistral-common: pip install 'superinfer[text]'"
            ) from None
        sp = MistralTokenizer.v1().instruct_tokenizer.tokenizer

        def count(text: str) -> int:
            return len(sp.encode(text, bos=False, eos=False))

        _MISTRAL_V1.append(count)
    return _MISTRAL_V1[0]


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _json_array_items(path: Path, text: str) -> Iterator[tuple[int, object]]:
    """``(line, item)`` for each item of a top-level JSON array, without loading it whole
    through one ``json.loads`` (so an error names the item's line)."""
    decoder = json.JSONDecoder()
    i = len(text) - len(text.lstrip())
    if i >= len(text) or text[i] != "[":
        raise TraceFormatError(path, _line_of(text, i), None, "not a JSON array")
    i += 1
    expect_item = True
    while True:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        if i >= len(text):
            raise TraceFormatError(path, _line_of(text, i), None, "not JSON (unterminated array)")
        if text[i] == "]":
            if text[i + 1 :].strip():
                raise TraceFormatError(path, _line_of(text, i), None, "not JSON (extra data)")
            return
        if not expect_item:
            if text[i] != ",":
                raise TraceFormatError(path, _line_of(text, i), None, "not JSON (expected ',')")
            i += 1
            expect_item = True
            continue
        try:
            item, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(path, exc.lineno, None, f"not JSON ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:
            raise TraceFormatError(
                path, _line_of(text, i), None, f"not usable JSON ({exc})"
            ) from None
        yield _line_of(text, i), item
        i, expect_item = end, False


def load_sharegpt_prompts_json(
    path: Path, count_tokens: Callable[[str], int] | None = None
) -> list[LengthRow]:
    """Load ShareGPT prompts (``ShareGPT_V3_filtered_500.json`` of ``ml-energy/leaderboard-v2``):
    a JSON array of ``{"id", "conversations": [{"from": "human", "value": PROMPT}, ...]}``.

    The first ``human`` turn of each conversation is the prompt. Rows carry its text (for real
    engines) and its token count (for the simulator); the file has no replies, so
    ``output_tokens`` is ``None``. Error fields name the item, e.g. ``[17].conversations``; the
    line is where the item starts.

    Args:
        path: the ``.json`` file.
        count_tokens: text -> tokens; :func:`mistral_v1_token_counter` by default.

    Raises:
        TraceFormatError: not a JSON array of such objects, a conversation with no human turn,
            or an empty prompt.
        DataError: no ``count_tokens`` given and ``mistral-common`` is not installed.
    """
    text = read_trace_text(path)
    items = list(_json_array_items(path, text))
    if not items:
        raise TraceFormatError(path, None, None, "no requests (empty array)")
    count = count_tokens or mistral_v1_token_counter()
    rows: list[LengthRow] = []
    for index, (line, item) in enumerate(items):
        if not isinstance(item, dict):
            raise TraceFormatError(path, line, f"[{index}]", "not a JSON object")
        turns = item.get("conversations")
        if not isinstance(turns, list):
            raise TraceFormatError(path, line, f"[{index}].conversations", "missing or not a list")
        prompt = next(
            (t.get("value") for t in turns if isinstance(t, dict) and t.get("from") == "human"),
            None,
        )
        if not isinstance(prompt, str) or not prompt.strip():
            raise TraceFormatError(
                path, line, f"[{index}].conversations", "no human turn with a non-empty 'value'"
            )
        key = item.get("id", "")
        rows.append(LengthRow(max(count(prompt), 1), None, line, prompt=prompt, key=str(key)))
    return rows


# -- a user's own trace -------------------------------------------------------------------------


def _parse_datetime(text: str) -> float:
    """Seconds since the Unix epoch of a date-time string (naive = UTC).

    Raises:
        ValueError: not a date-time.
    """
    try:
        return parse_azure_timestamp(text)
    except ValueError:
        stamp = datetime.fromisoformat(text.strip())
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def _cell_arrival(path: Path, line: int, cmap: ColumnMap, value: object) -> float:
    field = cmap.arrival or ""
    if cmap.time_unit == "datetime":
        if not isinstance(value, str):
            raise TraceFormatError(
                path, line, field, f"{show_value(value)} is not a date-time string"
            )
        try:
            return _parse_datetime(value)
        except (ValueError, OverflowError, OSError):
            raise TraceFormatError(
                path, line, field, f"{show_value(value)} is not a date-time (ISO 8601)"
            ) from None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise TraceFormatError(
                path, line, field, f"{show_value(value)} is not a number"
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceFormatError(path, line, field, f"{show_value(value)} is not a number")
    return finite_seconds(path, line, field, value, TIME_UNITS[cmap.time_unit])


def _cell_hashes(
    path: Path, line: int, cmap: ColumnMap, value: object, prompt: int
) -> tuple[int, ...]:
    field = cmap.block_hashes or ""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                value = json.loads(stripped)
            except (ValueError, RecursionError):
                raise TraceFormatError(path, line, field, "not a JSON list of integers") from None
        else:
            parts = stripped.split()
            if not all(p.isascii() and p.isdigit() for p in parts):
                raise TraceFormatError(path, line, field, "not a list of integers >= 0")
            value = [int(p) for p in parts]
    return check_hashes(path, line, field, value, prompt, cmap.hash_block_tokens)


def _table_row(
    path: Path, line: int, rec: dict[str, object], cmap: ColumnMap, count: Callable[[str], int]
) -> tuple[float | None, LengthRow]:
    for col in cmap.columns():
        if col not in rec:
            raise TraceFormatError(path, line, col, "missing")
        value = rec[col]
        if value is None or (isinstance(value, str) and not value.strip() and col != cmap.prompt):
            raise TraceFormatError(path, line, col, "empty")
    text: str | None = None
    if cmap.prompt is not None:
        raw = rec[cmap.prompt]
        if not isinstance(raw, str) or not raw.strip():
            raise TraceFormatError(path, line, cmap.prompt, "not a non-empty string")
        text = raw

    def length(col: str) -> int:
        value = rec[col]
        if isinstance(value, str):
            return lenient_positive_int(path, line, col, value)
        return json_positive_int(path, line, col, value)

    prompt = length(cmap.prompt_tokens) if cmap.prompt_tokens else max(count(text or ""), 1)
    output = length(cmap.output_tokens)
    hashes: tuple[int, ...] = ()
    if cmap.block_hashes is not None:
        hashes = _cell_hashes(path, line, cmap, rec[cmap.block_hashes], prompt)
    arrival = _cell_arrival(path, line, cmap, rec[cmap.arrival]) if cmap.arrival else None
    return arrival, LengthRow(prompt, output, line, hashes, text)


def load_table(
    path: Path,
    cmap: ColumnMap,
    *,
    fmt: str | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> list[TraceRow] | list[LengthRow]:
    """Load a user's own trace: a CSV with a header, or JSON Lines, read through ``cmap``.

    Args:
        path: the file.
        cmap: which column holds what.
        fmt: ``"csv"`` or ``"jsonl"``; by default from the suffix (``.jsonl``/``.json`` are
            JSON Lines, anything else CSV).
        count_tokens: text -> tokens, used when ``cmap.prompt_tokens`` is ``None``;
            :func:`mistral_v1_token_counter` by default.

    Returns:
        :class:`TraceRow` per row when ``cmap.arrival`` is set (times must not decrease), else
        :class:`LengthRow` per row.

    Raises:
        TraceFormatError: missing or empty file, a mapped column missing from the header (or a
            key from a line), an empty cell, a non-integer or non-positive length, a bad or
            decreasing time, or bad block hashes.
        DataError: a prompt column to tokenize and no tokenizer installed.
    """
    fmt = fmt or ("jsonl" if path.suffix.lower() in (".jsonl", ".json") else "csv")
    if fmt not in ("csv", "jsonl"):
        raise ValueError(f"fmt must be 'csv' or 'jsonl', got {fmt!r}")
    text = read_trace_text(path)
    records: Iterator[tuple[int, dict[str, object]]]
    if fmt == "csv":
        records = ((line, dict(rec)) for line, rec in csv_records(path, text, cmap.columns()))
    else:
        records = (
            (line, json_object(path, line, body))
            for line, body in numbered_lines(text)
            if body.strip()
        )
    count: Callable[[str], int] = count_tokens or (lambda s: mistral_v1_token_counter()(s))
    timed: list[TraceRow] = []
    untimed: list[LengthRow] = []
    last = float("-inf")
    for line, rec in records:
        arrival, row = _table_row(path, line, rec, cmap, count)
        if arrival is None:
            untimed.append(row)
            continue
        if arrival < last:
            raise TraceFormatError(
                path,
                line,
                cmap.arrival,
                f"{show_value(rec[cmap.arrival or ''])} is earlier than the line before",
            )
        last = arrival
        assert row.output_tokens is not None  # output_tokens is always mapped
        timed.append(
            TraceRow(
                arrival, row.prompt_tokens, row.output_tokens, line, row.block_hashes, row.prompt
            )
        )
    if not timed and not untimed:
        if fmt == "csv":
            require_columns(path, csv_header(path, text), cmap.columns())
        raise TraceFormatError(path, None, None, "no requests (empty file)")
    return timed if cmap.arrival else untimed
