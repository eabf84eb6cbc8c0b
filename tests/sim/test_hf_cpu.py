"""The ``sim:hf-cpu`` step-time model: batch shapes, the fit, and its use by the simulator."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
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
    find_spill,
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


def test_sglang_mixed_batches_count_their_decodes_context_as_prefix_like_its_step_log() -> None:
    # SGLang runs a mixed batch as one extend batch: each decode extends its c held tokens by
    # one, and the server's step log adds those c to prefix_tokens (10 + 99 + 7 here)
    pieces = [(10, 30, False), (0, 5, True), (99, 1, True), (7, 1, True)]
    logged = shape_of_totals(37, 4, 3, 153, prefix_tokens=116)
    assert features(shape_of(pieces), extend_decodes=True) == features(logged)
    assert features(shape_of(pieces))[-1] == 10.0  # hf's log: decodes are decodes
    # a decode-only step is a decode batch either way
    assert features(shape_of([(99, 1, True)]), extend_decodes=True)[-1] == 0.0
    mixed = replace(TRUE, extend_decodes=True)
    extra = mixed.step_time_s(shape_of(pieces)) - TRUE.step_time_s(shape_of(pieces))
    assert extra == pytest.approx(TRUE.coefficients[-1] * 106, rel=1e-12)
    decode = shape_of([(99, 1, True)])
    assert mixed.step_time_s(decode) == TRUE.step_time_s(decode)


def test_mixed_batches_follow_the_mechanics_unless_set() -> None:
    assert hf_cpu_sim_config().profile.mixed_batches is True
    assert hf_cpu_sim_config(mechanics="sglang").profile.mixed_batches is False
    on = hf_cpu_sim_config(mechanics="sglang", mixed_batches=True)
    assert on.profile.mixed_batches is True
    with pytest.raises(ValueError, match="mixed_batches=0 needs mechanics=sglang"):
        hf_cpu_sim_config(mixed_batches=False)


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


# -- the spill regime ---------------------------------------------------------------------------

SPILLING = replace(TRUE, spill_tokens=3072.0, spill_s_per_token=5e-5)


def test_the_spill_term_adds_its_cost_per_key_token_only_past_the_threshold() -> None:
    below = shape_of([(1535, 1, True), (1535, 1, True)])  # 3,072 key tokens: not past it
    above = shape_of([(1536, 1, True), (1535, 1, True)])  # 3,073
    assert SPILLING.step_time_s(below) == TRUE.step_time_s(below)
    assert SPILLING.step_time_s(above) == pytest.approx(TRUE.step_time_s(above) + 5e-5 * 3073)
    assert TRUE.repeatable and not SPILLING.repeatable
    assert TRUE.spill_dict() == {}
    assert SPILLING.spill_dict() == {"threshold_tokens": 3072.0, "s_per_token": 5e-5}
    with pytest.raises(ValueError, match="spill threshold must be > 0"):
        replace(TRUE, spill_tokens=0.0)
    with pytest.raises(ValueError, match="spill cost must be finite and >= 0"):
        replace(TRUE, spill_s_per_token=-1e-6)
    with pytest.raises(ValueError, match="a spill cost needs a finite spill threshold"):
        replace(TRUE, spill_s_per_token=1e-6)


def test_find_spill_splits_the_ratio_where_its_level_changes() -> None:
    kv = np.arange(100.0, 8000.0, 50.0)  # 158 steps
    ratio = np.where(kv > 4992, 2.0, 1.0)  # 60 steps above 4,992 run twice as slow
    assert find_spill(kv, ratio) == 4992.0
    assert find_spill(kv, np.where(kv > 4992, 1.15, 1.0)) is None  # under SPILL_MIN_JUMP
    # 9 slow steps: a split that keeps SPILL_MIN_STEPS above it leaves them a minority there
    assert find_spill(kv, np.where(kv > 7500, 2.0, 1.0)) is None
    assert find_spill(kv, np.ones_like(kv)) is None
    assert find_spill(np.array([]), np.array([])) is None
    with pytest.raises(ValueError, match="158 KV sizes for 3 ratios"):
        find_spill(kv, np.ones(3))


def _spill_samples(model: HFCPUStepTime) -> list[StepSample]:
    """The 14 steps of :func:`_samples`, 208 decode batches of 1-16 requests up to 2,256 key
    tokens and, past a gap, 40 steps of 6,000-7,950 (the spill regime is rare, as on the real
    engine): any threshold in the gap splits them the same way."""
    small = [shape_of([(c, 1, True)] * b) for b in range(1, 17) for c in range(20, 150, 10)]
    big = [shape_of([(c, 1, True)] * 10) for c in range(599, 799, 5)]
    return _samples(model) + [StepSample(s, model.step_time_s(s)) for s in small + big]


def test_fit_finds_a_spill_and_recovers_its_cost() -> None:
    model, report = HFCPUStepTime.fit(_spill_samples(SPILLING))
    assert model.spill_tokens == 2304.0  # the first multiple of 128 past 16 x 141 = 2,256
    assert model.spill_s_per_token == pytest.approx(5e-5, rel=1e-6)
    for got, want in zip(model.coefficients, TRUE.coefficients, strict=True):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert report.mean_abs_rel_err < 1e-9 and report.num_outliers == 0
    no_spill, _ = HFCPUStepTime.fit(_spill_samples(TRUE))
    assert no_spill.spill_s_per_token == 0.0 and no_spill.spill_tokens == math.inf


def test_a_split_whose_steps_above_are_faster_keeps_the_model_without_spill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A change point whose steps above run faster than the refit below predicts (median excess
    per key token <= 0) is dropped: the fit over all the steps stands, with no spill."""
    monkeypatch.setattr("superinfer.sim.hf_cpu.find_spill", lambda kv, ratio: 2304.0)
    samples = [
        StepSample(s.shape, s.duration_s * (0.9 if features(s.shape)[4] > 2304 else 1.0))
        for s in _spill_samples(TRUE)
    ]
    model, _ = HFCPUStepTime.fit(samples)
    assert model.spill_tokens == math.inf and model.spill_s_per_token == 0.0
    monkeypatch.setattr("superinfer.sim.hf_cpu.find_spill", lambda kv, ratio: None)
    assert model == HFCPUStepTime.fit(samples)[0]  # the fit with no split at all


def test_a_calibration_file_carries_the_spill(tmp_path: Path) -> None:
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"coefficients": TRUE.to_dict(), "kv_spill": SPILLING.spill_dict()}))
    assert HFCPUStepTime.from_file(path) == SPILLING
    path.write_text(json.dumps({"coefficients": TRUE.to_dict(), "kv_spill": {"s_per_token": 1}}))
    with pytest.raises(ValueError, match="not a step-time calibration.*threshold_tokens"):
        HFCPUStepTime.from_file(path)


def test_the_simulator_times_each_step_of_a_spilling_model_on_its_own() -> None:
    """With a spill term a decode run is not linear in its KV: the policy's max_repeat_steps no
    longer changes the token times."""
    slo = SLO("chat")
    reqs = [RequestSpec(f"r{i}", 0.05 * i, 600 + 7 * i, 12, 12, slo) for i in range(8)]
    config = SimConfig(SIM_HF_CPU, SMOLLM2_135M, HOST_CPU, num_gpu_blocks_override=256)
    model = replace(TRUE, spill_tokens=1000.0, spill_s_per_token=5e-5)

    def run(repeat: int) -> list[tuple[float | None, float | None]]:
        pm = build_plugin_manager("fcfs", {"max_repeat_steps": str(repeat)})
        result = Simulator(config, pm.hook, step_time=model).run(reqs)
        return [(r.first_token_s, r.finish_s) for r in result.requests]

    assert run(64) == run(1)
    pm = build_plugin_manager("fcfs", {})
    plain = Simulator(config, pm.hook, step_time=TRUE).run(reqs)
    assert max(r.finish_s or 0 for r in plain.requests) < max(e or 0 for _, e in run(1))
