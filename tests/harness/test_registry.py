"""The engine registry: the one place that maps an engine id to its family."""

from __future__ import annotations

import pytest

from superinfer.harness.engines.registry import (
    HF_WORKLOAD,
    SIM_WORKLOAD,
    default_source,
    engine_family,
    family_kinds,
    run_dir,
    shaping_defaults,
)
from superinfer.harness.errors import UserError


def test_engine_ids_map_to_their_family() -> None:
    assert engine_family("sim:vllm").name == "sim"
    assert engine_family("sim:trtllm").name == "sim"
    assert engine_family("sim:hf-cpu").name == "sim-hf-cpu"
    assert engine_family("hf").name == "hf"
    assert engine_family("http").name == "http"
    assert engine_family("sglang").name == "sglang"
    assert [engine_family(e).label_only for e in ("sim:vllm", "hf", "http")] == [
        False,
        False,
        True,
    ]
    with pytest.raises(
        UserError, match=r"^unknown engine 'foo:bar'; engine families: sim, hf, sglang, http$"
    ):
        engine_family("foo:bar")


def test_runners_load_from_their_modules() -> None:
    from superinfer.harness.engines.http import run_http_cell
    from superinfer.harness.engines.sim import run_sim_cell, run_sim_hf_cpu_cell

    assert engine_family("sim:sglang").load_runner() is run_sim_cell
    assert engine_family("sim:hf-cpu").load_runner() is run_sim_hf_cpu_cell
    assert engine_family("http").load_runner() is run_http_cell
    from superinfer.harness.engines.sglang import run_sglang_cell

    assert engine_family("sglang").load_runner() is run_sglang_cell


def test_the_sglang_engine_runs_its_own_policies_beside_ours() -> None:
    from superinfer.harness.policies import select_policies

    family = engine_family("sglang")
    assert family.engine_policies == ("native", "lpm", "priority")
    assert run_dir(("sglang",)) == "results/sglang-cpu"
    own = family.engine_policies
    assert select_policies((), engine_policies=own, default=family.default_policies) == [
        "native", "lpm", "priority", "superinfer",
    ]  # fmt: skip
    assert select_policies(("native", "superinfer"), engine_policies=own) == [
        "native", "superinfer",
    ]  # fmt: skip
    with pytest.raises(UserError, match=r"^unknown policy 'native'; registered: "):
        select_policies(("native",))


def test_run_dir_shaping_and_source_follow_the_engines() -> None:
    assert run_dir(()) == "results/default"
    assert run_dir(("sim:vllm",)) == "results/default"
    assert run_dir(("hf", "sim:hf-cpu")) == "results/hf"
    assert run_dir(("http",)) == "results/http"
    assert run_dir(("hf", "http")) == "results/default"
    assert shaping_defaults(("sim:vllm",)) == dict(SIM_WORKLOAD)
    assert shaping_defaults(("sim:vllm", "hf")) == dict(HF_WORKLOAD)
    assert default_source(()) == ("workload", "azure-mixed")
    assert default_source(("sim:hf-cpu", "hf")) == ("trace", "azure")
    assert default_source(("hf", "sim:vllm")) == ("workload", "azure-mixed")
    assert family_kinds(("sim:vllm", "hf", "sim:hf-cpu", "http", "nope")) == {
        "sim-gpu",
        "real-cpu",
        "sim-cpu",
        "live",
    }
