"""The step log's rows from hand-made batches (no server: tests/adapters/sglang/
test_server_cpu_native.py checks it inside a real scheduler)."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from superinfer.adapters.sglang.steplog import COLUMNS, StepLogger, step_row


@dataclass
class _Mode:
    name: str

    def is_decode(self) -> bool:
        return self.name == "decode"

    def is_extend(self) -> bool:
        return self.name in ("extend", "mixed")

    def is_mixed(self) -> bool:
        return self.name == "mixed"


@dataclass
class _Batch:
    mode: str
    n: int
    extend_num_tokens: int | None = None
    extend_lens: list[int] | None = None
    prefix_lens: list[int] | None = None
    seq_lens_sum: int | None = None
    seq_lens_cpu: Any = None
    reqs: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.forward_mode = _Mode(self.mode)
        self.reqs = list(range(self.n))


def test_an_extend_batch_counts_its_prompt_tokens_and_held_prefix() -> None:
    batch = _Batch("extend", 2, 300, [200, 100], [0, 64], seq_lens_sum=364)
    assert step_row(batch) == {
        "kind": "prefill",
        "num_seqs": 2,
        "num_tokens": 300,
        "num_prefill_tokens": 300,
        "num_decode_tokens": 0,
        "num_samples": 2,
        "kv_tokens": 364,
        "prefix_tokens": 64,
    }


def test_a_decode_batch_reads_seq_lens_cpu_and_a_mixed_one_splits_its_tokens() -> None:
    decode = step_row(_Batch("decode", 3, seq_lens_cpu=torch.tensor([10, 20, 31])))
    assert decode is not None
    assert (decode["kind"], decode["num_tokens"], decode["num_decode_tokens"]) == ("decode", 3, 3)
    assert (decode["kv_tokens"], decode["prefix_tokens"]) == (61, 0)
    mixed = step_row(_Batch("mixed", 3, 130, [128, 1, 1], [0, 40, 50], seq_lens_sum=220))
    assert mixed is not None
    assert (mixed["num_prefill_tokens"], mixed["num_decode_tokens"]) == (128, 2)
    assert step_row(_Batch("idle", 0)) is None


def test_the_logger_appends_one_line_per_batch_and_counts_retractions(tmp_path: Path) -> None:
    log = StepLogger(tmp_path / "steps.csv")
    sched = type("S", (), {"waiting_queue": [1, 2]})()
    retract = log.retract_decode(lambda b: ([7, 8], 0.5, []), object())
    assert retract == ([7, 8], 0.5, [])
    out = log.run_batch(lambda s, b: "result", sched, _Batch("decode", 2, seq_lens_sum=9))
    assert out == "result"
    log.run_batch(lambda s, b: None, sched, _Batch("idle", 0))  # runs no tokens: no line
    log.run_batch(lambda s, b: None, sched, _Batch("extend", 1, 5, [5], [0], seq_lens_sum=5))
    with (tmp_path / "steps.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    assert [(r["step_index"], r["kind"], r["retracted"], r["num_waiting"]) for r in rows] == [
        ("0", "decode", "2", "2"),
        ("1", "prefill", "0", "2"),
    ]
    assert rows[0]["gap_ms"] == "" and float(rows[1]["gap_ms"]) >= 0
    # a second logger on the same file appends without a second header
    StepLogger(tmp_path / "steps.csv").run_batch(
        lambda s, b: None, sched, _Batch("decode", 1, seq_lens_sum=3)
    )
    lines = (tmp_path / "steps.csv").read_text().splitlines()
    assert len(lines) == 4 and lines[0] == ",".join(COLUMNS)
