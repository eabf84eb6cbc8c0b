"""The ``sim:hf-cpu`` step-time model: batch shapes, the fit, and its use by the simulator."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from superinfer.adapters.manager import build_plugin_manager
from superinfer.policy_core.types import SLO
from superinfer.sim.config import SimConfig
from superinfer.sim.engine import Simulator
from superinfer.sim.hf_cpu import (
    FEATURES,
    HOST_CPU,
    KV_BYTES_PER_TOKEN_FP32,
    SIM_HF_CPU,
    SMOLLM2_135M,
    HFCPUStepTime,
    StepSample,
    features,
    hf_cpu_sim_config,
    shape_of,
    shape_of_totals,
)
from superinfer.sim.request import RequestSpec
from superinfer.sim.step_time import BatchShape

TRUE = HFCPUStepTime((0.02, 0.004, 0.001, 0.0005, 0.00002, 1e-7, 0.03, 0.0003))


def test_shape_of_classifies_pieces_as_the_simulator_does() -> None:
    # a prefill chunk of 30 on 10 computed, a first chunk of 5 that samples, two decodes
    shape = shape_of([(10, 30, False), (0, 5, True), (99, 1, True), (7, 1, True)])
    assert shape == BatchShape(
        num_tokens=37,
        num_samples=3,
        prefill_attn_pairs=30 * (10 + 31 / 2) + 5 * (0 + 6 / 2),
        prefill_kv_tokens=40 + 5,
        decode_kv_tokens=100 + 8,
        num_seqs=4,
        prefill_tokens=35,
        num_prefill_seqs=2,
    )
    # the 10 computed tokens of the first chunk are its held prefix
    assert features(shape) == (1.0, 37.0, 4.0, 3.0, 153.0, 37.0 * 153, 1.0, 10.0)
    assert features(shape_of([(99, 1, True)]))[-2:] == (0.0, 0.0)  # one decode: neither term


def test_a_steps_totals_give_the_same_features_as_its_pieces() -> None:
    pieces = [(10, 30, False), (0, 5, True), (99, 1, True), (7, 1, True)]
    totals = shape_of_totals(37, 4, 3, 153, prefix_tokens=10)
    assert features(totals) == features(shape_of(pieces))
    assert features(shape_of_totals(2, 2, 2, 300))[-1] == 0.0  # no prefix column: 0


def test_smollm2_kv_bytes_are_fp32_pages_of_every_layer() -> None:
    assert KV_BYTES_PER_TOKEN_FP32 == 2 * 30 * 3 * 64 * 4 == 46080
    assert SIM_HF_CPU.limits(HOST_CPU) == (256, 32)


def _samples(model: HFCPUStepTime) -> list[StepSample]:
    shapes = (
        [shape_of([(0, n, True)]) for n in (16, 64, 128, 256)]
        + [shape_of([(c, 1, True)] * b) for b in (1, 4, 8, 16) for c in (32, 200)]
        + [shape_of([(40, 100, False), (60, 1, True), (90, 1, True)])]
        + [shape_of([(300, 50, True)])]
    )
    return [StepSample(s, model.step_time_s(s)) for s in shapes]


def test_fit_recovers_the_coefficients_that_generated_the_steps() -> None:
    model, report = HFCPUStepTime.fit(_samples(TRUE))
    for got, want in zip(model.coefficients, TRUE.coefficients, strict=True):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert report.num_samples == 14 and report.dropped == ()
    assert report.mean_abs_rel_err < 1e-9


def test_fit_sets_aside_steps_slowed_from_outside() -> None:
    samples = _samples(TRUE)
    slowed = {2, 6, 9}  # another process took the core during these steps
    noisy = [
        StepSample(s.shape, s.duration_s * (3.0 if i in slowed else 1.0))
        for i, s in enumerate(samples)
    ]
    model, report = HFCPUStepTime.fit(noisy)
    for got, want in zip(model.coefficients, TRUE.coefficients, strict=True):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert report.num_outliers == 3 and report.inlier_mean_abs_rel_err < 1e-9
    assert report.mean_abs_rel_err == pytest.approx(3 * (2 / 3) / 14)  # scored on every step


def test_fit_drops_a_term_that_would_be_negative() -> None:
    samples = _samples(TRUE)
    bent = [StepSample(s.shape, s.duration_s - 0.002 * s.shape.num_seqs) for s in samples]
    model, report = HFCPUStepTime.fit(bent)
    assert all(c >= 0 for c in model.coefficients)
    assert report.dropped  # the bent data asks for a negative term; it is removed, not kept


def test_decode_coefficients_match_the_step_time_of_a_decode_batch() -> None:
    shape = shape_of([(c, 1, True) for c in (10, 50, 300)])
    a, b = TRUE.decode_coefficients(3)
    assert a + b * shape.decode_kv_tokens == pytest.approx(TRUE.step_time_s(shape), rel=1e-12)
    lone = shape_of([(40, 1, True)])
    a, b = TRUE.decode_coefficients(1)
    assert a + b * lone.decode_kv_tokens == pytest.approx(TRUE.step_time_s(lone), rel=1e-12)
    # by hand: c0 + (c_tok + c_seq + c_samp) + c_kv * 41 + c_qk * 41, no batched-step cost
    assert TRUE.step_time_s(lone) == pytest.approx(0.02 + 0.0055 + 41 * (0.00002 + 1e-7))


def test_bad_coefficients_and_files_are_rejected_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="need 8 coefficients"):
        HFCPUStepTime((1.0,))
    with pytest.raises(ValueError, match="num_seqs must be finite and >= 0"):
        HFCPUStepTime((0.1, 0.1, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0))
    bad = tmp_path / "fit.json"
    bad.write_text(json.dumps({"coefficients": {"intercept": 1.0}}))
    with pytest.raises(ValueError, match=f"{bad}: not a step-time calibration"):
        HFCPUStepTime.from_file(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"coefficients": TRUE.to_dict()}))
    assert HFCPUStepTime.from_file(good) == TRUE
    assert list(TRUE.to_dict()) == list(FEATURES)
    older = tmp_path / "older.json"  # written before multi_seq, prefix_tokens: read as 0
    old = {k: v for k, v in TRUE.to_dict().items() if k not in ("multi_seq", "prefix_tokens")}
    older.write_text(json.dumps({"coefficients": old}))
    assert HFCPUStepTime.from_file(older).coefficients == (*TRUE.coefficients[:-2], 0.0, 0.0)


def test_the_default_model_is_a_real_fit() -> None:
    default = HFCPUStepTime()
    assert default.coefficients[0] > 0  # a fixed per-step cost was measured
    assert all(math.isfinite(c) and c >= 0 for c in default.coefficients)


def test_simulator_repeats_decodes_with_the_fitted_model_as_with_single_steps() -> None:
    """A repeated decode run (closed form from decode_coefficients) gives the same token times as
    asking the policy every step (max_repeat_steps=1)."""
    slo = SLO("chat")
    reqs = [RequestSpec(f"r{i}", 0.05 * i, 20 + 7 * i, 12, 12, slo) for i in range(4)]
    config = SimConfig(SIM_HF_CPU, SMOLLM2_135M, HOST_CPU, num_gpu_blocks_override=256)

    def run(repeat: int) -> list[tuple[float | None, float | None]]:
        pm = build_plugin_manager("fcfs", {"max_repeat_steps": str(repeat)})
        result = Simulator(config, pm.hook, step_time=TRUE).run(reqs)
        return [(r.first_token_s, r.finish_s) for r in result.requests]

    repeated, single = run(64), run(1)
    for (f1, e1), (f2, e2) in zip(repeated, single, strict=True):
        assert f1 == pytest.approx(f2, rel=1e-9) and e1 == pytest.approx(e2, rel=1e-9)


def test_sglang_mechanics_admit_a_long_prompt_only_with_room_for_all_of_it() -> None:
    """On the SGLang CPU server's profile four 600-token prompts (chunks of 128) and their 50
    output tokens share a 1,024-token pool: with the whole prompt and output held at admission
    (SGLang's PrefillAdder) none is ever preempted; charging only the first chunk admits a
    second request beside the first one's decode, whose later chunks then find no room."""
    slo = SLO("batch")
    reqs = [RequestSpec(f"r{i}", 0.0, 600, 50, 50, slo) for i in range(4)]
    config = hf_cpu_sim_config(
        page_size_tokens=16, num_blocks=64, max_batch_tokens=128, max_num_seqs=8,
        mechanics="sglang",
    )  # fmt: skip

    def preemptions(cfg: SimConfig) -> list[int]:
        result = Simulator(cfg, build_plugin_manager("fcfs").hook, step_time=TRUE).run(reqs)
        assert all(r.finish_s is not None for r in result.requests)
        return [r.num_preemptions for r in result.requests]

    assert preemptions(config) == [0, 0, 0, 0]
    chunk_only = replace(config, profile=replace(config.profile, reserve_whole_prompt=False))
    assert sum(preemptions(chunk_only)) > 0
