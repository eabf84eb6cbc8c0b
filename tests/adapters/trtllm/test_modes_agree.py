"""The same policy decisions through Mode A (front-end gate) and Mode B (in-engine scheduler).

One scripted workload on the 1.2 double: four batch requests fill the KV cache, then chat and
batch requests queue behind them. Both modes must start every request in the same engine iteration
and in the same order, the policy's, which differs from the engine's own FIFO.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from superinfer.adapters.manager import build_plugin_manager
from superinfer.adapters.trtllm import plugin
from superinfer.adapters.trtllm.gate import TrtllmGate
from superinfer.adapters.trtllm.slo_table import InMemorySloTable
from tests.adapters.trtllm.helpers import (
    BATCH,
    CHAT,
    Arrival,
    RunLog,
    make_llm,
    output_len_by_prompt,
    run_mode_a,
    run_mode_b,
)

pytestmark = pytest.mark.usefixtures("trtllm12")


def _prompt(base: int) -> tuple[int, ...]:
    return tuple(range(base, base + 20))  # 3 blocks of 8; 4 blocks reserved with 6 new tokens


WORKLOAD = [
    *(Arrival(f"b{i}", 0, BATCH, _prompt(100 * i), 3 + i, 6) for i in range(4)),
    Arrival("b4", 1, BATCH, _prompt(500), 6, 6),
    Arrival("c1", 1, CHAT, _prompt(600), 2, 6),
    Arrival("b5", 1, BATCH, _prompt(700), 5, 6),
    Arrival("c2", 2, CHAT, _prompt(800), 4, 6),
    Arrival("c3", 3, CHAT, _prompt(900), 6, 6),
    Arrival("b6", 3, BATCH, _prompt(1000), 1, 6),
]


def _mode_a(policy: str) -> RunLog:
    llm = make_llm(_fake_output_len=output_len_by_prompt(WORKLOAD))
    gate = TrtllmGate(llm, build_plugin_manager(policy).hook, clock=llm._clock)
    return run_mode_a(gate, WORKLOAD)


def _mode_b(policy: str) -> RunLog:
    from tensorrt_llm._fake import FakeClock

    clock = FakeClock()
    table = InMemorySloTable()
    plugin.install(build_plugin_manager(policy).hook, slo_table=table, clock=clock)
    try:
        llm = make_llm(_fake_clock=clock, _fake_output_len=output_len_by_prompt(WORKLOAD))
        return run_mode_b(llm, WORKLOAD, table)
    finally:
        plugin.uninstall()


def _engine_fifo() -> RunLog:
    llm = make_llm(_fake_output_len=output_len_by_prompt(WORKLOAD))
    return run_mode_b(llm, WORKLOAD, InMemorySloTable())


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        ("priority", ["b0", "b1", "b2", "b3", "c1", "c2", "c3", "b4", "b5", "b6"]),
        ("fcfs", ["b0", "b1", "b2", "b3", "b4", "c1", "b5", "c2", "c3", "b6"]),
    ],
)
def test_both_modes_start_the_same_requests_at_the_same_iterations(
    trtllm12: ModuleType, policy: str, order: list[str]
) -> None:
    a, b = _mode_a(policy), _mode_b(policy)
    assert a.start_order == b.start_order == order
    assert a.first_scheduled == b.first_scheduled
    assert a.first_token == b.first_token
    assert sorted(a.finished) == sorted(b.finished) == sorted(x.name for x in WORKLOAD)


def test_the_policy_changes_what_the_engine_alone_does(trtllm12: ModuleType) -> None:
    fifo = _engine_fifo()
    assert fifo.start_order == ["b0", "b1", "b2", "b3", "b4", "c1", "b5", "c2", "c3", "b6"]
    priority = _mode_b("priority")
    # chat requests start earlier under the policy, batch ones later
    assert priority.first_scheduled["c3"] < fifo.first_scheduled["c3"]
    assert priority.first_scheduled["b4"] > fifo.first_scheduled["b4"]
