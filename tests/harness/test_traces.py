"""Trace loading: the real Azure files, and one-line errors naming file, line and field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from superinfer.harness.errors import TraceFormatError
from superinfer.harness.workload.data import trace_path
from superinfer.harness.workload.traces import (
    ColumnMap,
    LengthRow,
    TraceRow,
    load_azure_csv,
    load_mooncake_jsonl,
    load_sharegpt_lengths_csv,
    load_sharegpt_prompts_json,
    load_table,
    parse_azure_timestamp,
)
from superinfer.harness.workload.workload import build_workload

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW1 = "2023-11-16 18:15:46.6805900,374,44\n"
ROW2 = "2023-11-16 18:15:50.9951690,396,109\n"


def test_real_azure_traces_load_whole() -> None:
    conv = load_azure_csv(trace_path("AzureLLMInferenceTrace_conv.csv"))
    code = load_azure_csv(trace_path("AzureLLMInferenceTrace_code.csv"))
    assert (len(conv), len(code)) == (19_366, 8_819)
    assert round(conv[-1].arrival_s - conv[0].arrival_s, 1) == 3501.7  # README: 3,501.7 s
    assert (conv[0].prompt_tokens, conv[0].output_tokens, conv[0].line) == (374, 44, 2)


def test_seven_digit_fractions_are_exact() -> None:
    delta = parse_azure_timestamp("2023-11-16 18:15:50.9951690") - parse_azure_timestamp(
        "2023-11-16 18:15:46.6805900"
    )
    assert delta == pytest.approx(4.314579, abs=1e-6)


def test_workload_mixes_sources_on_their_shared_clock() -> None:
    wl = build_workload("azure", duration_s=120.0)
    first_code = next(r for r in wl.requests if r.source == "code")
    assert first_code.arrival_s == pytest.approx(
        77.29937, abs=1e-5
    )  # 18:17:03.97996 - 18:15:46.68059
    assert first_code.slo.name == "batch" and first_code.request_id == "code-2"
    assert wl.requests[0].request_id == "conv-2" and wl.requests[0].arrival_s == 0.0
    assert all(r.arrival_s < 120.0 for r in wl.requests)
    assert [r.arrival_s for r in wl.requests] == sorted(r.arrival_s for r in wl.requests)
    assert wl.absent_sources() == []
    # the first code request arrives at 77.3 s: a 60 s window has none, and says so
    short = build_workload("azure", duration_s=60.0)
    assert [s.name for s in short.absent_sources()] == ["code"]
    # a source whose class another source fills is not absent in the tables
    conv, code = short.sources
    twin = dataclasses.replace(code, name="code2", slo=conv.slo)
    both = dataclasses.replace(short, sources=(conv, code, twin))
    assert [s.name for s in both.absent_sources()] == ["code"]


def test_rate_scale_compresses_time() -> None:
    one = build_workload("azure-conv", duration_s=60.0)
    two = build_workload("azure-conv", rate_scale=2.0, duration_s=30.0)
    assert [r.request_id for r in one.requests] == [r.request_id for r in two.requests]
    for a, b in zip(one.requests, two.requests, strict=True):
        assert b.arrival_s == pytest.approx(a.arrival_s / 2)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", ":: empty file (no header)"),
        (HEADER, ":: no requests (header only)"),
        ("TIMESTAMP,ContextTokens\n" + ROW1, ":1: field 'GeneratedTokens': missing column"),
        (HEADER + ROW2 + ROW1, ":3: field 'TIMESTAMP': '2023-11-16 18:15:46.6805900' is earlier"),
        (HEADER + ROW1 + "yesterday,1,2\n", ":3: field 'TIMESTAMP': 'yesterday' is not"),
        (HEADER + ROW1 + "2023-11-16 18:15:47.1,-5,2\n", ":3: field 'ContextTokens': -5 must be"),
        (HEADER + "2023-11-16 18:15:47.1,5,abc\n", ":2: field 'GeneratedTokens': 'abc' is not an"),
        (HEADER + "2023-11-16 18:15:47.1,5\n", ":2: 2 fields, header has 3"),
    ],
)
def test_malformed_traces_name_file_line_and_field(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(content)
    with pytest.raises(TraceFormatError) as info:
        load_azure_csv(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert expected.replace("::", ":") in message.replace(str(path), "")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_azure_csv(tmp_path / "nope.csv")


def test_real_mooncake_trace_loads_with_block_hashes() -> None:
    rows = load_mooncake_jsonl(trace_path("conversation_trace.jsonl"))
    assert len(rows) == 12_031
    assert sum(len(r.block_hashes) for r in rows) == 288_500  # README: total block references
    assert all(r.block_hashes[0] == 0 for r in rows)  # every request shares block 0
    assert rows[-1].arrival_s == 3536.999


GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", ": no requests (empty file)"),
        ("[1, 2]\n", ":1: not a JSON object"),
        ("{nope\n", ":1: not JSON"),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 5}\n',
            ":1: field 'hash_ids': missing",
        ),
        (GOOD + GOOD.replace('"timestamp": 0', '"timestamp": -1'), ":2: field 'timestamp': -1 is"),
        (GOOD.replace("0,", "9,") + GOOD, ":2: field 'timestamp': 0 is earlier"),
        (GOOD.replace("600", '"600"'), ":1: field 'input_length': '600' is not an integer"),
        (GOOD.replace("[0, 1]", "[0]"), ":1: field 'hash_ids': 1 blocks, but input_length 600"),
        (GOOD.replace("[0, 1]", '[0, "x"]'), ":1: field 'hash_ids': not a list of integers"),
    ],
)
def test_malformed_mooncake_lines(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(content)
    with pytest.raises(TraceFormatError) as info:
        load_mooncake_jsonl(path)
    assert "\n" not in str(info.value)
    assert expected in str(info.value).replace(str(path), "")


# -- ShareGPT -----------------------------------------------------------------------------------


def test_real_sharegpt_length_table_loads_whole() -> None:
    rows = load_sharegpt_lengths_csv(trace_path("sharegpt_8k_filtered_stats_llama2_tokenizer.csv"))
    assert len(rows) == 30_731  # README: 30,731 rows
    assert (rows[0].prompt_tokens, rows[0].output_tokens, rows[0].line) == (74, 918, 2)
    assert max(r.prompt_tokens + r.output_tokens for r in rows) == 8_149  # README: max 8,149


def test_real_sharegpt_prompts_are_tokenized_with_mistral_v1() -> None:
    rows = load_sharegpt_prompts_json(trace_path("ShareGPT_V3_filtered_500.json"))
    assert len(rows) == 500
    assert rows[0].key == "fzcoUcK_0" and rows[0].prompt is not None
    assert rows[0].prompt.startswith("How to stop automatic updates from the WSUS Server")
    assert all(r.output_tokens is None for r in rows)
    # The file kept prompts of 4-800 Llama-7B tokens; Mistral v1's 32k SentencePiece model
    # counts them within the same range (2 to 792; 45,821 in all).
    counts = [r.prompt_tokens for r in rows]
    assert (min(counts), max(counts), sum(counts)) == (2, 792, 45_821)


def test_prompt_counter_can_be_replaced(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('[{"id": "a", "conversations": [{"from": "human", "value": "hi there"}]}]')
    rows = load_sharegpt_prompts_json(path, count_tokens=len)
    assert [(r.prompt_tokens, r.prompt, r.key, r.line) for r in rows] == [(8, "hi there", "a", 1)]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", ":1: not a JSON array"),
        ("[]", ": no requests (empty array)"),
        ('[\n{"id": 1, "conversations": []},\n 3]', ":2: field '[0].conversations': no human"),
        (
            '[{"id": 1, "conversations": [{"from": "human", "value": "x"}]},\n 3]',
            ":2: field '[1]':",
        ),
        ('[{"id": 1}]', ":1: field '[0].conversations': missing or not a list"),
        ('[{"id": 1, "conversations": [{"from": "human", "value": "x"}]}', ":1: not JSON (unterm"),
        ('[{"id": 1, "conversations": [{"from": "human", "value": "x"}]}] x', ": not JSON (extra"),
        ("[\n\n{nope}]", ":3: not JSON (Expecting property name"),
    ],
)
def test_malformed_prompt_sets(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(TraceFormatError) as info:
        load_sharegpt_prompts_json(path, count_tokens=len)
    assert "\n" not in str(info.value)
    assert expected in str(info.value).replace(str(path), "")


SG_HEADER = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (SG_HEADER, ": no requests (header only)"),
        ("num_prefill_tokens\n5\n", ":1: field 'num_decode_tokens': missing column"),
        (SG_HEADER + "5,6,12,0.8\n", ":2: field 'num_total_tokens': 12 != 5 + 6"),
        (SG_HEADER + "5,6,11,0.8\n0,6,6,0\n", ":3: field 'num_prefill_tokens': 0 must be >= 1"),
    ],
)
def test_malformed_length_tables(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "s.csv"
    path.write_text(content)
    with pytest.raises(TraceFormatError) as info:
        load_sharegpt_lengths_csv(path)
    assert expected in str(info.value).replace(str(path), "")


# -- a user's own trace -------------------------------------------------------------------------


def test_user_csv_with_mapping_times_in_ms_and_hashes(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text('t_ms,in,out,blocks\n0,600,5,0 1\n1500,100,7.0,"[0]"\n')
    cmap = ColumnMap(
        "in", "out", arrival="t_ms", time_unit="ms", block_hashes="blocks", hash_block_tokens=512
    )
    rows = load_table(path, cmap)
    assert rows == [
        TraceRow(0.0, 600, 5, 2, (0, 1)),
        TraceRow(1.5, 100, 7, 3, (0,)),
    ]


def test_user_jsonl_with_datetimes_and_prompt_text(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"when": "2024-01-01T00:00:00+01:00", "q": "hello world", "n": 3}\n\n'
        '{"when": "2024-01-01 00:00:02.5", "q": "abc", "n": 1}\n'
    )
    cmap = ColumnMap(None, "n", arrival="when", time_unit="datetime", prompt="q")
    rows = load_table(path, cmap, count_tokens=lambda s: len(s.split()))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.line, r.prompt) for r in rows] == [
        (1704063600.0, 2, 3, 1, "hello world"),
        (1704067202.5, 1, 1, 3, "abc"),
    ]


def test_user_csv_without_times_gives_length_rows(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("in,out\n3,4\n")
    assert load_table(path, ColumnMap("in", "out")) == [LengthRow(3, 4, 2)]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("t,in\n1,2\n", ":1: field 'out': missing column"),
        ("t,in,out\n1,,3\n", ":2: field 'in': empty"),
        ("t,in,out\n1,2,3\n0.5,2,3\n", ":3: field 't': '0.5' is earlier than the line before"),
        ("t,in,out\nnan,2,3\n", ":2: field 't': nan is not a finite time >= 0"),
        ("t,in,out\nsoon,2,3\n", ":2: field 't': 'soon' is not a number"),
        ("t,in,out\n1,2.5,3\n", ":2: field 'in': '2.5' is not an integer"),
        ("t,in,out,in\n1,2,3,4\n", ":1: field 'in': column named twice"),
    ],
)
def test_malformed_user_csv(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(content)
    with pytest.raises(TraceFormatError) as info:
        load_table(path, ColumnMap("in", "out", arrival="t"))
    assert "\n" not in str(info.value)
    assert expected in str(info.value).replace(str(path), "")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"t": 1, "in": 2}\n', ":1: field 'out': missing"),
        ('{"t": true, "in": 2, "out": 3}\n', ":1: field 't': True is not a number"),
        ('{"t": 1e400, "in": 2, "out": 3}\n', ":1: field 't': inf is not a finite time"),
        ('{"t": 1, "in": 2, "out": 3, "h": [0, 1]}\n', ":1: field 'h': 2 blocks, but"),
        ('{"t": 1, "in": 2, "out": 3, "h": "x"}\n', ":1: field 'h': not a list of integers"),
    ],
)
def test_malformed_user_jsonl(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(content)
    cmap = ColumnMap("in", "out", arrival="t", block_hashes="h", hash_block_tokens=16)
    if '"h"' not in content:
        cmap = ColumnMap("in", "out", arrival="t")
    with pytest.raises(TraceFormatError) as info:
        load_table(path, cmap)
    assert expected in str(info.value).replace(str(path), "")


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(HEADER.encode() + b"\xff\n")
    with pytest.raises(TraceFormatError, match=r":2: not UTF-8"):
        load_azure_csv(path)
