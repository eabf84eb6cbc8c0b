"""``calibrate --engine published``: which published rows become which setups, and the split."""

from __future__ import annotations

import pytest

from superinfer.harness.offline.calibrate_published import (
    Setup,
    _fit_request_latency,
    _metric_key,
    _Row,
    _split,
    median_itl_s,
    setup_of,
    with_request_latency,
)

ROW = {
    "row_id": "2", "engine": "trtllm", "engine_version": "0.17 (TensorRT-engine backend)",
    "model": "Llama-3.1-8B", "weight_dtype": "FP8", "kv_dtype": "FP8 (doc: ...)",
    "gpu": "H100 SXM 80GB", "tp": "1", "isl": "128", "osl": "128", "num_prompts": "30000",
    "request_rate": "inf (offline)", "metric": "total_output_tok_s", "percentile": "",
    "value": "28836.77",
}  # fmt: skip


def test_a_trtllm_table_row_becomes_its_setup() -> None:
    setup, why = setup_of(ROW)
    assert why == ""
    assert setup == Setup("trtllm-0.17", "llama-3.1-8b", "h100-80gb", 1, "fp8", "fp8", 128, 128,
                          30000, None)  # fmt: skip
    assert setup.label == "trtllm-0.17 llama-3.1-8b fp8 h100-80gb tp1 128/128 inf n30000"


def test_unsupported_rows_say_why() -> None:
    assert setup_of({**ROW, "gpu": "B200 180GB"}) == (None, "GPU 'B200 180GB' not modelled")
    online = {**ROW, "engine": "sglang", "engine_version": "0.3.0", "isl": "sharegpt",
              "osl": "sharegpt", "request_rate": "4", "weight_dtype": "BF16"}  # fmt: skip
    setup, _ = setup_of(online)
    assert (setup.isl, setup.rate, setup.weight_dtype, setup.release) == (
        0, 4.0, "fp16", "sglang-0.3.0")  # fmt: skip
    assert _metric_key({"metric": "ttft_ms", "percentile": "mean"}) == "ttft_ms:mean"
    assert _metric_key({"metric": "ttft_ms", "percentile": "p99"}) is None


def test_split_alternates_by_row_id_within_a_group() -> None:
    setup, _ = setup_of(ROW)
    rows = [_Row({**ROW, "row_id": str(i)}, setup, "total_output_tok_s") for i in (9, 3, 5, 7)]
    online = _Row(ROW, Setup(**{**setup.__dict__, "rate": 2.0}), "ttft_ms:mean")
    _split([*rows, online])
    assert {r.row["row_id"]: r.split for r in rows} == {
        "3": "fit", "5": "score", "7": "fit", "9": "score"}  # fmt: skip
    assert online.split == "score"


def test_lowest_rate_ttft_rows_fit_the_request_latency_and_the_rest_score() -> None:
    online = {**ROW, "engine": "sglang", "engine_version": "0.3.0", "isl": "sharegpt",
              "osl": "sharegpt", "request_rate": "4", "weight_dtype": "BF16"}  # fmt: skip
    setup, _ = setup_of(online)
    at8 = Setup(**{**setup.__dict__, "rate": 8.0})
    rows = {(s.rate, m): _Row({**ROW, "row_id": "1"}, s, m) for s in (setup, at8)
            for m in ("ttft_ms:p50", "tpot_ms:p50", "itl_ms:p50")}  # fmt: skip
    lone = _Row(ROW, Setup(**{**setup.__dict__, "model": "llama-3.1-70b"}), "ttft_ms:p50")
    _split([*rows.values(), lone])
    assert {k: r.split for k, r in rows.items()} == {
        (4.0, "ttft_ms:p50"): "fit", (4.0, "tpot_ms:p50"): "fit", (4.0, "itl_ms:p50"): "score",
        (8.0, "ttft_ms:p50"): "score", (8.0, "tpot_ms:p50"): "score",
        (8.0, "itl_ms:p50"): "score"}  # fmt: skip
    assert lone.split == "score"  # one rate only: nothing to score a fit on


def test_request_latency_is_the_median_gap_of_the_fit_ttft_rows() -> None:
    setup, _ = setup_of(ROW)
    rows = [_Row({**ROW, "row_id": str(i), "value": str(v)}, Setup(**{**setup.__dict__,
            "rate": float(i)}), "ttft_ms:mean", split) for i, v, split in
            ((1, 20.0, "fit"), (2, 30.0, "fit"), (3, 19.0, "fit"), (4, 99.0, "score"))]  # fmt: skip
    sims = {r.setup: {"ttft_ms:mean": 15.0} for r in rows}
    fitted = _fit_request_latency(rows, sims)
    assert fitted == {"trtllm-0.17": {"s": pytest.approx(0.005), "fit_rows": [1, 2, 3]}}
    shifted = with_request_latency({"ttft_ms:p50": 10.0, "e2e_latency_ms:p50": 100.0,
                                    "tpot_ms:p50": 7.0}, 0.005)  # fmt: skip
    assert shifted == {"ttft_ms:p50": 15.0, "e2e_latency_ms:p50": 105.0, "tpot_ms:p50": 7.0}
    assert _fit_request_latency(rows[:1], {rows[0].setup: {"ttft_ms:mean": 25.0}}) == {
        "trtllm-0.17": {"s": 0.0, "fit_rows": [1]}}  # fmt: skip


class _Done:
    def __init__(self, gaps: list[tuple[float, int, float]]) -> None:
        self.token_gaps = gaps


def test_median_itl_counts_every_gap_or_one_per_burst() -> None:
    reqs = [_Done([(0.5, 1, 0.0), (0.1, 4, 0.3)]), _Done([(0.2, 2, 0.2)]), _Done([])]
    # per-step streaming: 0.5 x1, 0.1 x1, 0.1 x3, 0.2 x1, 0.2 x1 -> 7 gaps, median 0.1
    assert median_itl_s(reqs) == pytest.approx(0.1)
    # bursts: 0.5, 0.4, 0.4 -> median 0.4
    assert median_itl_s(reqs, bursts=True) == pytest.approx(0.4)
    assert median_itl_s([_Done([])]) is None


def test_simulate_lists_the_steps_its_per_iteration_metrics_are_the_means_of() -> None:
    from superinfer.harness.offline.calibrate_published_sim import load_rows, simulate
    from superinfer.harness.workload.data import data_dir
    from superinfer.sim.engine_costs import load_costs

    base = data_dir()
    assert base is not None
    raw = next(r for r in load_rows(base / "published" / "engine_perf.csv") if r["row_id"] == "680")
    setup, _ = setup_of(raw)
    assert (
        setup is not None
        and setup.label == "sglang-0.2.13 llama-3.1-8b fp16 a100-80gb tp1 1024/64 inf n300"
    )
    steps: list[tuple[float, int, int]] = []
    m = simulate(setup, load_costs(), base, steps=steps)
    # the WukLab run: 300 prompts of 1,024 tokens in 512-token chunks, 64 tokens out, each step
    # priced alone (a per-iteration setup runs with ``max_repeat_steps`` 1), divisor 1
    assert len(steps) == 965 and {k for _, _, k in steps} == {1}
    assert m["per_iter_forward_ms"] == pytest.approx(1e3 * sum(g for g, _, _ in steps) / 965)
    assert m["_cpu_b"] == pytest.approx(sum(n for _, n, _ in steps) / 965)
