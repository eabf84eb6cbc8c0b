"""Fuzz every trace loader: any input either loads into valid rows or raises TraceFormatError
with a one-line message naming the file; no other exception escapes."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superinfer.harness.errors import TraceFormatError
from superinfer.harness.workload.traces import (
    ColumnMap,
    LengthRow,
    TraceRow,
    load_azure_csv,
    load_mooncake_jsonl,
    load_sharegpt_lengths_csv,
    load_sharegpt_prompts_json,
    load_table,
)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Cells that are sometimes valid, sometimes subtly not.
_NUMBERS = st.one_of(
    st.integers(min_value=-3, max_value=10**6).map(str),
    st.integers(min_value=10**15, max_value=10**400).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "1.0", "1e3", "0x10", "١٢", "NaN", "-0", "+5", "1_000"]),
)
_STAMPS = st.one_of(
    st.sampled_from(
        [
            "2023-11-16 18:15:46.6805900",
            "2023-11-16 18:15:47",
            "2023-11-16 18:15:45.1",
            "2023-02-30 00:00:00",
            "2023-11-16 18:15:46.",
            "2023-11-16T18:15:46+01:00",
            "2023-11-16 18:15:46.²",
        ]
    ),
    st.text(max_size=12),
)
_CELLS = st.one_of(_NUMBERS, _STAMPS, st.text(max_size=8))


def _csv_text(header: list[str]) -> st.SearchStrategy[str]:
    header_s = st.one_of(st.just(header), st.lists(st.sampled_from([*header, "x", ""]), max_size=5))
    rows = st.lists(st.lists(_CELLS, min_size=0, max_size=5), max_size=6)

    def join(parts: tuple[list[str], list[list[str]], str]) -> str:
        head, body, sep = parts
        return sep.join([",".join(head), *(",".join(r) for r in body)]) + sep

    return st.tuples(header_s, rows, st.sampled_from(["\n", "\r\n"])).map(join)


_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-5, max_value=10**400),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=6),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def _jsonl_text(keys: list[str]) -> st.SearchStrategy[str]:
    value = st.one_of(
        _JSON,
        st.integers(min_value=0, max_value=10**7),
        st.lists(st.integers(min_value=0, max_value=20), max_size=4),
    )
    obj = st.dictionaries(st.sampled_from([*keys, "extra"]), value, max_size=len(keys) + 1)
    line = st.one_of(
        obj.map(lambda o: json.dumps(o)),  # json.dumps writes NaN/Infinity like the files could
        st.text(max_size=20),
        _JSON.map(json.dumps),
    )
    return st.lists(line, max_size=6).map("\n".join)


def _run(loader: Callable[[Path], Any], content: str | bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"trace{suffix}"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", errors="surrogatepass")
        try:
            rows = loader(path)
        except TraceFormatError as exc:
            message = str(exc)
            assert message.startswith(str(path)), message
            assert "\n" not in message and "\r" not in message, message
            return
    assert rows, "a loader returned no rows without an error"
    for row in rows:
        assert isinstance(row, (TraceRow, LengthRow))
        assert row.prompt_tokens >= 1 and row.line >= 1
        assert row.output_tokens is None or row.output_tokens >= 1
        if isinstance(row, TraceRow):
            assert row.arrival_s == row.arrival_s and abs(row.arrival_s) != float("inf")


def _count(text: str) -> int:
    return len(text.split())


_MAP = ColumnMap(
    "in", "out", arrival="t", time_unit="ms", block_hashes="h", hash_block_tokens=4, prompt="p"
)
_MAP_DATETIME = ColumnMap(None, "out", arrival="t", time_unit="datetime", prompt="p")

LOADERS: dict[str, tuple[Callable[[Path], Any], st.SearchStrategy[str], str]] = {
    "azure": (
        load_azure_csv,
        _csv_text(["TIMESTAMP", "ContextTokens", "GeneratedTokens"]),
        ".csv",
    ),
    "mooncake": (
        load_mooncake_jsonl,
        _jsonl_text(["timestamp", "input_length", "output_length", "hash_ids"]),
        ".jsonl",
    ),
    "sharegpt-lengths": (
        load_sharegpt_lengths_csv,
        _csv_text(["num_prefill_tokens", "num_decode_tokens", "num_total_tokens"]),
        ".csv",
    ),
    "sharegpt-prompts": (
        lambda p: load_sharegpt_prompts_json(p, count_tokens=_count),
        st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "id": _JSON,
                        "conversations": st.one_of(
                            _JSON,
                            st.lists(
                                st.dictionaries(
                                    st.sampled_from(["from", "value"]),
                                    st.one_of(st.sampled_from(["human", "gpt"]), _JSON),
                                ),
                                max_size=2,
                            ),
                        ),
                    }
                ),
                max_size=4,
            ).map(lambda items: json.dumps(items, indent=1)),
            _JSON.map(json.dumps),
            st.text(max_size=30),
        ),
        ".json",
    ),
    "user-csv": (
        lambda p: load_table(p, _MAP, count_tokens=_count),
        _csv_text(["t", "in", "out", "h", "p"]),
        ".csv",
    ),
    "user-jsonl": (
        lambda p: load_table(p, _MAP, count_tokens=_count),
        _jsonl_text(["t", "in", "out", "h", "p"]),
        ".jsonl",
    ),
    "user-jsonl-datetime": (
        lambda p: load_table(p, _MAP_DATETIME, count_tokens=_count),
        _jsonl_text(["t", "out", "p"]).map(lambda s: s),
        ".jsonl",
    ),
}


@pytest.mark.parametrize("name", list(LOADERS))
@FUZZ
@given(data=st.data())
def test_loader_raises_only_trace_format_errors(name: str, data: st.DataObject) -> None:
    loader, text, suffix = LOADERS[name]
    _run(loader, data.draw(text), suffix)


@pytest.mark.parametrize("name", list(LOADERS))
@FUZZ
@given(content=st.binary(max_size=200))
def test_loader_survives_arbitrary_bytes(name: str, content: bytes) -> None:
    loader, _, suffix = LOADERS[name]
    _run(loader, content, suffix)
