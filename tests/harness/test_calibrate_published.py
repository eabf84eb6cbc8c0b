"""``calibrate --engine published``: which published rows become which setups, and the split."""

from __future__ import annotations

from superinfer.harness.offline.calibrate_published import (
    Setup,
    _metric_key,
    _Row,
    _split,
    setup_of,
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
