"""``bench`` defaults merged once: engine family < suite and spec ``[bench]`` < the user's."""

from __future__ import annotations

from typing import Any

import pytest

from superinfer.harness.bench import HEADLINE_POLICIES, bench_config
from superinfer.harness.errors import UserError

PARAMS: dict[str, Any] = {
    "workload": None, "trace": None, "engines": "sim:vllm", "model": "llama-3.1-70b",
    "gpu": "a100-80gb", "tp": 4, "replicas": 4, "router": "round_robin", "cpu_kv_ratio": None,
    "kv_quant": False, "kv_quant_opts": {}, "kv_policy": None, "policies": None,
    "rate_scale": None, "duration_s": None, "start_s": None, "length_scale": None,
    "max_prompt_tokens": None, "max_output_tokens": None, "engine_options": {}, "url": None,
    "backend": "openai", "policy_opt": (), "seed": 0, "suite": None,
}  # fmt: skip


def test_defaults_by_engine_family() -> None:
    sim = bench_config(PARAMS, given=set())
    assert (sim.workload, sim.trace, sim.rate_scale, sim.start_s) == (
        "azure-mixed",
        "azure",
        1.0,
        0.0,
    )
    hf = bench_config({**PARAMS, "engines": "hf"}, given={"engines"})
    assert (hf.workload, hf.trace, hf.engines) == (None, "azure", ("hf",))
    assert (hf.rate_scale, hf.duration_s, hf.start_s, hf.length_scale) == (
        0.05,
        200.0,
        100.0,
        0.125,
    )
    assert (hf.max_prompt_tokens, hf.max_output_tokens) == (256, 64)


def test_suite_defaults_yield_to_the_user() -> None:
    headline = bench_config({**PARAMS, "suite": "headline"}, given={"suite"})
    assert (headline.trace, headline.workload, headline.rate_scale) == ("azure", None, 0.6)
    assert headline.policies == HEADLINE_POLICIES
    mine = bench_config(
        {**PARAMS, "suite": "headline", "rate_scale": 0.3}, given={"suite", "rate_scale"}
    )
    assert mine.rate_scale == 0.3
    rotation = bench_config({**PARAMS, "suite": "rotation"}, given={"suite"})
    assert (rotation.workload, rotation.replicas, rotation.duration_s) == (
        "mooncake-chat",
        6,
        600.0,
    )


def test_conflicts_fail_in_one_line() -> None:
    with pytest.raises(UserError, match=r"^give --workload or --trace, not both$"):
        bench_config(
            {**PARAMS, "workload": "azure-mixed", "trace": "azure"}, given={"workload", "trace"}
        )
    with pytest.raises(UserError, match=r"^--kv-quant-opt needs --kv-quant$"):
        bench_config({**PARAMS, "kv_quant_opts": {"hysteresis": "0.1"}}, given={"kv_quant_opts"})


def test_a_gpu_or_model_alias_is_recorded_by_its_canonical_name() -> None:
    given = {"gpu", "model"}
    cfg = bench_config({**PARAMS, "gpu": "A100", "model": "meta-llama/Llama-3.1-8B"}, given=given)
    assert (cfg.gpu, cfg.model) == ("a100-80gb", "llama-3.1-8b")
    cfg = bench_config({**PARAMS, "gpu": "h200-141gb"}, given={"gpu"})
    assert cfg.gpu == "h200"
    # an unknown name is left for the run to report (one line naming the known ones)
    assert bench_config({**PARAMS, "gpu": "b300"}, given={"gpu"}).gpu == "b300"
