"""Trace loading: the real Azure files, and one-line errors naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from superinfer.harness.data import trace_path
from superinfer.harness.errors import TraceFormatError
from superinfer.harness.traces import load_azure_csv, load_mooncake_jsonl, parse_azure_timestamp
from superinfer.harness.workload import build_workload

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
