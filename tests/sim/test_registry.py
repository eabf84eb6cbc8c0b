"""The registry of simulated engines (``sim/registry.py``) and the ``sim:hf-cpu`` builder."""

from __future__ import annotations

from dataclasses import replace

import pytest

from superinfer.sim.config import SimConfig
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.hf_cpu import HOST_CPU, SIM_HF_CPU, SMOLLM2_135M, hf_cpu_sim_config
from superinfer.sim.profiles import PROFILES, SIM_SGLANG, SIM_TRTLLM
from superinfer.sim.registry import (
    FAMILIES,
    HF_CPU,
    ROOFLINE,
    SIM_ENGINES,
    get_sim_engine,
    roofline_sim_config,
)


def test_every_sim_engine_is_listed_with_its_family() -> None:
    got = {e.engine_id: (e.family, e.native_policy, e.fixed_hardware) for e in SIM_ENGINES.values()}
    assert got == {
        "sim:vllm": (ROOFLINE, "fcfs", False),
        "sim:sglang": (ROOFLINE, "fcfs", False),  # SGLang 0.5.23's --schedule-policy default
        "sim:trtllm": (ROOFLINE, "fcfs", False),
        "sim:hf-cpu": (HF_CPU, "fcfs", True),
    }
    assert FAMILIES == ("roofline", "hf-cpu")
    assert all(SIM_ENGINES[name].profile is p for name, p in PROFILES.items())
    assert SIM_ENGINES["sim:hf-cpu"].profile is SIM_HF_CPU
    assert "sim:hf-cpu" not in PROFILES  # fixed model and host: not a cell/fleet engine


def test_unknown_engine_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: sim:hf-cpu, sim:sglang, sim:trtllm, sim:vllm"):
        get_sim_engine("sim:nope")


def test_roofline_config_is_what_the_harness_builds() -> None:
    got = roofline_sim_config("sim:trtllm", model="llama-3.1-70b", gpu="a100", tp=4, replicas=2,
                              router="cache_aware", cpu_kv_ratio=0.5, horizon_s=9.0)  # fmt: skip
    want = SimConfig(SIM_TRTLLM, get_model("llama-3.1-70b"), get_gpu("a100"), tp=4, replicas=2,
                     router="cache_aware", cpu_kv_ratio=0.5, horizon_s=9.0)  # fmt: skip
    assert got == want


def test_roofline_config_refuses_the_cpu_engine_and_unknown_names() -> None:
    with pytest.raises(KeyError, match="fixed model and host"):
        roofline_sim_config("sim:hf-cpu", model="llama-3.1-8b", gpu="a100")
    with pytest.raises(KeyError, match="unknown model"):
        roofline_sim_config("sim:vllm", model="gpt-9", gpu="a100")


def test_hf_cpu_config_is_what_run_sim_hf_cpu_cell_builds() -> None:
    # harness/engines/sim.py run_sim_hf_cpu_cell, spelt out
    profile = replace(
        SIM_HF_CPU,
        block_size_tokens=16,
        token_budget=128,
        token_budget_large_gpu=128,
        max_num_seqs=8,
        max_num_seqs_large_gpu=8,
    )
    want = SimConfig(profile, SMOLLM2_135M, HOST_CPU, tp=1, replicas=1, num_gpu_blocks_override=64)
    got = hf_cpu_sim_config(page_size_tokens=16, num_blocks=64, max_batch_tokens=128,
                            max_num_seqs=8)  # fmt: skip
    assert got == want
    default = hf_cpu_sim_config()
    assert default.profile == SIM_HF_CPU
    # SGLang's mechanics at the same limits: its prefill batches, admission and radix cache
    sg = hf_cpu_sim_config(page_size_tokens=16, num_blocks=64, max_batch_tokens=512,
                           max_num_seqs=8, mechanics="sglang").profile  # fmt: skip
    assert (sg.name, sg.block_size_tokens, sg.token_budget, sg.max_num_seqs) == (
        "sim:hf-cpu", 16, 512, 8,
    )  # fmt: skip
    assert (sg.mixed_batches, sg.admission, sg.prefix_cache) == (
        SIM_SGLANG.mixed_batches, SIM_SGLANG.admission, "radix",
    )  # fmt: skip
    assert (sg.cpu_kv_ratio, sg.kv_memory) == (0.0, "utilization")
    # the harness sends ignore_eos, for which SGLang holds a running request's whole remaining
    # output (ratio 1.0, never decayed), and its admission charges the whole remaining prompt
    assert (sg.reserve_ratio_init, sg.reserve_ratio_min, sg.reserve_ratio_decay) == (1.0, 1.0, 0.0)
    assert sg.reserve_whole_prompt and not SIM_SGLANG.reserve_whole_prompt
    assert sg.prefill_runs_whole and not SIM_SGLANG.prefill_runs_whole
    with pytest.raises(ValueError, match="mechanics 'x': one of hf, sglang"):
        hf_cpu_sim_config(mechanics="x")
    assert default.num_gpu_blocks_override == 256
    assert (default.model, default.gpu, default.tp, default.replicas) == (
        SMOLLM2_135M,
        HOST_CPU,
        1,
        1,
    )
