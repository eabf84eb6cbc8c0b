"""Metrics on a hand-made requests table, with every number worked out by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from superinfer.harness.report.metrics import add_latency_columns, summarize

NAN = float("nan")


def table() -> pd.DataFrame:
    rows = [
        # id, class, arrival, first, finish, generated, status, preemptions, ttft, tpot, deadline
        ("c1", "chat", 0.0, 0.2, 0.6, 5, "finished", 0, 1000.0, 100.0, NAN),  # tpot 100: meets
        ("c2", "chat", 1.0, 2.5, 3.0, 2, "finished", 1, 1000.0, 100.0, NAN),  # ttft 1500: miss
        ("c3", "chat", 1.5, NAN, NAN, 0, "rejected", 0, 1000.0, 100.0, NAN),  # miss
        ("b1", "batch", 0.0, 1.0, 4.0, 1, "finished", 2, NAN, NAN, 600.0),  # 1 token: no TPOT
    ]
    cols = [
        "request_id",
        "slo_class",
        "arrival_s",
        "first_token_s",
        "finish_s",
        "generated_tokens",
        "status",
        "num_preemptions",
        "slo_ttft_ms",
        "slo_tpot_ms",
        "slo_deadline_s",
    ]
    return add_latency_columns(pd.DataFrame(rows, columns=cols))


def test_latency_columns() -> None:
    df = table().set_index("request_id")
    assert df.loc["c1", ["ttft_ms", "e2e_ms", "tpot_ms"]].tolist() == pytest.approx([200, 600, 100])
    assert df.loc["c2", "tpot_ms"] == pytest.approx(500.0)
    assert math.isnan(df.loc["b1", "tpot_ms"])
    assert df["met_slo"].tolist() == [True, False, False, True]


def test_summary_rows() -> None:
    rows = summarize(
        table(), engine="e", policy="p", kv_peak_bytes={"all": 3e9, "chat": 2e9, "batch": 1e9}
    )
    by_class = {r["slo_class"]: r for r in rows}
    assert [r["slo_class"] for r in rows] == ["batch", "chat", "all"]
    chat = by_class["chat"]
    assert (chat["n_requests"], chat["n_finished"], chat["n_rejected"]) == (3, 2, 1)
    assert chat["slo_attainment"] == pytest.approx(1 / 3)
    assert chat["ttft_p50_ms"] == pytest.approx(850.0)
    assert chat["ttft_p99_ms"] == pytest.approx(200 + 0.99 * 1300)
    assert chat["goodput_rps"] == pytest.approx(0.25)  # 1 met over the 4 s window
    assert chat["throughput_rps"] == pytest.approx(0.5)
    assert chat["output_tok_s"] == pytest.approx(7 / 4)
    assert chat["preemptions"] == 1 and chat["kv_peak_gb"] == 2.0
    batch, everything = by_class["batch"], by_class["all"]
    assert batch["slo_attainment"] == 1.0 and math.isnan(batch["tpot_p50_ms"])
    assert everything["slo_attainment"] == 0.5
    assert everything["goodput_rps"] == pytest.approx(0.5)
    assert everything["output_tok_s"] == pytest.approx(2.0)
    assert everything["preemptions"] == 3 and everything["window_s"] == 4.0
