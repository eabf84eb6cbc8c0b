"""The TensorRT-LLM adapter's StepState change sets, both modes, equal the difference of
consecutive full snapshots (issue 21), over random workloads on the 1.2 double."""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superinfer.adapters.manager import build_plugin_manager
from superinfer.adapters.trtllm import plugin
from superinfer.adapters.trtllm.gate import TrtllmGate
from superinfer.adapters.trtllm.slo_table import InMemorySloTable
from tests.adapters.trtllm.helpers import (
    Arrival,
    RandomPolicy,
    Recorder,
    make_llm,
    output_len_by_prompt,
    run_mode_a,
    run_mode_b,
)
from tests.adapters.trtllm.test_mode_b import _install, workloads
from tests.change_sets import assert_change_sets_exact

pytestmark = pytest.mark.usefixtures("trtllm12")
_FIXTURE = HealthCheck.function_scoped_fixture


def _pm(policy: str, seed: int) -> object:
    return build_plugin_manager(
        RandomPolicy(seed, reject_rate=0.05) if policy == "random" else policy
    )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(arrivals=workloads(), policy=st.sampled_from(["fcfs", "superinfer", "random"]),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_mode_b_change_sets_equal_the_snapshot_difference(
    trtllm12: ModuleType, arrivals: list[Arrival], policy: str, seed: int
) -> None:
    from tensorrt_llm._fake import FakeClock
    from tensorrt_llm.llmapi import KvCacheConfig

    plugin.uninstall()
    clock = FakeClock()
    table = InMemorySloTable()
    recorder = Recorder()
    pm = _pm(policy, seed)
    pm.register(recorder)  # type: ignore[attr-defined]
    _install(pm, clock, table)
    try:
        llm = make_llm(
            max_batch_size=4, max_num_tokens=48, _fake_clock=clock,
            kv_cache_config=KvCacheConfig(max_tokens=112, tokens_per_block=8,
                                          event_buffer_max_size=0),
            _fake_output_len=output_len_by_prompt(arrivals),
        )  # fmt: skip
        run_mode_b(llm, arrivals, table, max_steps=600)
    finally:
        plugin.uninstall()
    assert assert_change_sets_exact(recorder.states) == len(recorder.states) > 0


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(arrivals=workloads(), policy=st.sampled_from(["fcfs", "priority", "superinfer"]))
def test_mode_a_change_sets_equal_the_snapshot_difference(
    trtllm12: ModuleType, arrivals: list[Arrival], policy: str
) -> None:
    llm = make_llm(_fake_output_len=output_len_by_prompt(arrivals))
    recorder = Recorder()
    pm = build_plugin_manager(policy)
    pm.register(recorder)
    gate = TrtllmGate(llm, pm.hook, clock=llm._clock)
    run_mode_a(gate, arrivals)
    assert assert_change_sets_exact(recorder.states) == len(recorder.states) > 0
