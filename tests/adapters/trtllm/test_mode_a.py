"""Mode A against the 1.2 double: the gate, retention from placement, KV events, precision."""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

import pytest

from superinfer.adapters.hookspecs import hookimpl
from superinfer.adapters.manager import build_plugin_manager
from superinfer.adapters.trtllm.apply import RetentionRange
from superinfer.adapters.trtllm.gate import (
    GateConfig,
    GateStatus,
    RequestNotAdmittedError,
    TrtllmGate,
)
from superinfer.adapters.trtllm.precision_router import PrecisionRouter
from superinfer.adapters.trtllm.slo_table import InMemorySloTable
from superinfer.policy_core.types import (
    KVLocation,
    KVPrecision,
    Placement,
    PreemptMode,
    RequestView,
    ScheduleDecision,
    StepState,
)
from tests.adapters.trtllm.helpers import (
    BATCH,
    CHAT,
    Arrival,
    FixedPlacement,
    Recorder,
    make_llm,
    output_len_by_prompt,
    run_mode_a,
    sampling,
)

pytestmark = pytest.mark.usefixtures("trtllm12")


def _gate(policy: Any = "priority", *plugins: Any, **llm_kwargs: Any) -> TrtllmGate:
    pm = build_plugin_manager(policy)
    for p in plugins:
        pm.register(p)
    llm = make_llm(**llm_kwargs)
    return TrtllmGate(llm, pm.hook, clock=llm._clock)


def _prompt(base: int, n: int = 20) -> tuple[int, ...]:
    return tuple(range(base, base + n))


def test_config_comes_from_the_llm_and_its_created_event(trtllm12: ModuleType) -> None:
    from tensorrt_llm.llmapi import KvCacheConfig

    gate = _gate()
    assert gate.config == GateConfig(8, 256, 8, 16, True, KVPrecision.FP16)
    events = _gate(
        kv_cache_config=KvCacheConfig(
            max_tokens=None, tokens_per_block=8, event_buffer_max_size=100
        )
    )
    assert events.config.kv_capacity_blocks is None
    assert events.kv_capacity_blocks == 3686 // 8  # 0.9 x the double's 4096 tokens
    with pytest.raises(ValueError, match="cannot tell the engine's KV capacity"):
        _gate(kv_cache_config=KvCacheConfig(max_tokens=None, tokens_per_block=8))


def test_held_requests_are_admitted_in_the_policys_order(trtllm12: ModuleType) -> None:
    # 16 blocks of 8 tokens; each request reserves ceil((20 + 6) / 8) = 4 blocks to completion
    arrivals = [Arrival(f"b{i}", 0, BATCH, _prompt(100 * i), 3 + i, 6) for i in range(4)]
    arrivals += [
        Arrival("b4", 1, BATCH, _prompt(500), 6, 6),
        Arrival("c1", 1, CHAT, _prompt(600), 6, 6),
        Arrival("b5", 1, BATCH, _prompt(700), 6, 6),
        Arrival("c2", 2, CHAT, _prompt(800), 6, 6),
    ]
    gate = _gate("priority", _fake_output_len=output_len_by_prompt(arrivals))
    log = run_mode_a(gate, arrivals)
    assert log.start_order == ["b0", "b1", "b2", "b3", "c1", "c2", "b4", "b5"]
    # b0 finishes with its 3rd token (step 2), freeing 4 blocks for one request, and so on
    assert [log.first_scheduled[n] for n in ("c1", "c2", "b4", "b5")] == [3, 4, 5, 6]
    assert gate.counters.admitted == [
        ("b0",),
        ("b1",),
        ("b2",),
        ("b3",),
        ("c1",),
        ("c2",),
        ("b4",),
        ("b5",),
    ]
    fcfs = _gate("fcfs", _fake_output_len=output_len_by_prompt(arrivals))
    assert run_mode_a(fcfs, arrivals).start_order == [
        "b0",
        "b1",
        "b2",
        "b3",
        "b4",
        "c1",
        "b5",
        "c2",
    ]


def test_never_more_in_flight_than_the_batch_cap(trtllm12: ModuleType) -> None:
    recorder = Recorder()
    gate = _gate("fcfs", recorder, max_batch_size=2)
    arrivals = [Arrival(f"r{i}", 0, CHAT, _prompt(50 * i, 4), 3, 3) for i in range(5)]
    peak = 0
    original = gate.llm._engine._fake_step

    def step() -> None:
        nonlocal peak
        peak = max(peak, len(gate.in_flight))
        original()

    gate.llm._engine._fake_step = step
    log = run_mode_a(gate, arrivals)
    assert peak == 2 and len(log.finished) == 5
    assert all(len(s.running) <= 2 and s.max_num_seqs == 2 for s in recorder.states)
    assert [v.request_id for v in recorder.finished] == ["r0", "r1", "r2", "r3", "r4"]
    assert all(v.generated_tokens == 3 for v in recorder.finished)


class RejectBatch:
    """Rejects batch requests; preempts chat requests with 2+ tokens to admit others (FCFS)."""

    name = "reject-batch"

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        reject = {v.request_id: "batch_not_served" for v in state.waiting if v.slo.name == "batch"}
        preempt = {
            v.request_id: PreemptMode.RECOMPUTE
            for v in state.running
            if v.generated_tokens >= 2 and state.waiting
        }
        live = len(state.running) - len(preempt)
        admit = [v for v in state.waiting if v.request_id not in reject]
        admit = admit[: max(0, state.max_num_seqs - live)]
        return ScheduleDecision(
            num_tokens={
                v.request_id: v.pending_tokens
                for v in state.running
                if v.request_id not in preempt and v.computed_tokens
            }
            | {v.request_id: v.pending_tokens for v in admit},
            admit=tuple(v.request_id for v in admit),
            reject=reject,
            preempt=preempt,
        )


def test_rejections_and_aborts_are_accounted_for(trtllm12: ModuleType) -> None:
    recorder = Recorder()
    gate = _gate(RejectBatch(), recorder)
    kept = gate.submit(list(_prompt(0)), sampling(4), slo=CHAT, request_id="c")
    dropped = gate.submit(list(_prompt(100)), sampling(4), slo=BATCH, request_id="b")
    assert (kept.status, dropped.status) == (GateStatus.SUBMITTED, GateStatus.REJECTED)
    assert dropped.handle is None and dropped.reason == "batch_not_served"
    gate.abort("c")
    assert kept.status is GateStatus.ABORTED
    assert [(v.request_id, r) for v, r in recorder.aborted] == [
        ("b", "batch_not_served"),
        ("c", "cancelled"),
    ]
    while gate.llm._fake_has_work():
        gate.llm._fake_step()
    out = kept.handle._fake_next()
    assert out.finished and out.outputs[0].finish_reason == "cancelled"
    gate.submit([1, 2], sampling(2), slo=CHAT, request_id="x")
    with pytest.raises(ValueError, match="already live"):
        gate.submit([1, 2], sampling(2), slo=CHAT, request_id="x")
    with pytest.raises(ValueError, match="non-empty sequence of int"):
        gate.submit([], sampling(2), slo=CHAT)
    with pytest.raises(ValueError, match="set by the gate"):
        gate.submit([1], sampling(2), slo=CHAT, streaming=False)


def test_preemptions_cannot_be_applied_from_outside_and_are_counted(trtllm12: ModuleType) -> None:
    gate = _gate(RejectBatch(), max_batch_size=1)
    arrivals = [Arrival("c0", 0, CHAT, _prompt(0), 5, 5), Arrival("c1", 3, CHAT, _prompt(50), 5, 5)]
    log = run_mode_a(gate, arrivals)
    assert log.finished == ["c0", "c1"]
    # c1 arrives while c0 (3 tokens) holds the only slot: the policy preempts c0 to admit c1,
    # which the gate cannot do, so c1 waits for c0's finish (the next scheduling point)
    assert gate.counters.num_preempt_ignored == 1
    assert gate.counters.num_admit_deferred == 1
    assert log.first_scheduled["c1"] == 5


def test_placement_becomes_retention_priorities_in_the_engine(trtllm12: ModuleType) -> None:
    placement = FixedPlacement([Placement.PIN, Placement.OFFLOAD, Placement.DROP])
    gate = _gate("fcfs", placement)
    first = gate.submit(list(_prompt(0, 28)), sampling(2), slo=CHAT, request_id="a")  # 3 blocks
    assert first.retention == (
        RetentionRange(0, 8, 100),
        RetentionRange(8, 16, 35),
        RetentionRange(16, 24, 1),
    )
    ((nodes, free_hbm, free_cpu),) = placement.calls
    assert [(n.node_id, n.parent_id, n.hit_count) for n in nodes] == [
        ("a#0", None, 0),
        ("a#1", "a#0", 0),
        ("a#2", "a#1", 0),
    ]
    assert (free_hbm, free_cpu) == (16, 0)
    assert placement.sizes == [(0, gate.kv_capacity_blocks)]  # 3 new blocks fit in the 16 free
    engine_request = gate.llm._engine.waiting_queue[0][1]
    ranges = engine_request.kv_cache_retention_config.token_range_retention_configs
    assert [(r.token_start, r.token_end, r.priority) for r in ranges] == [
        (0, 8, 100),
        (8, 16, 35),
        (16, 24, 1),
    ]
    while gate.llm._fake_has_work():
        gate.llm._fake_step()
        while (out := first.handle._fake_next()) is not None:
            gate.on_output(first, out)
    gate.poll()
    # the engine stored the prompt's blocks at those priorities, and reported them
    path = gate.table.match(list(_prompt(0, 28)))
    assert [gate.table.priority(n) for n in path] == [100, 35, 1]


def test_a_shared_prefix_is_seen_through_kv_events(trtllm12: ModuleType) -> None:
    placement = FixedPlacement([Placement.KEEP] * 4)
    recorder = Recorder()
    gate = _gate("fcfs", placement, recorder)
    a = gate.submit(list(_prompt(0, 28)), sampling(2), slo=CHAT, request_id="a")
    while gate.llm._fake_has_work():
        gate.llm._fake_step()
        while (out := a.handle._fake_next()) is not None:
            gate.on_output(a, out)
    gate.poll()
    stored = gate.table.match(list(_prompt(0, 28)))
    assert len(stored) == 3 and len(gate.table) == 3
    shared = list(_prompt(0, 16)) + [900 + t for t in range(12)]  # first 2 blocks shared
    b = gate.submit(shared, sampling(2), slo=CHAT, request_id="b")
    nodes = placement.calls[-1][0]
    assert [(n.node_id, n.hit_count, n.location) for n in nodes] == [
        (stored[0], 0, KVLocation.HBM),
        (stored[1], 0, KVLocation.HBM),
        ("b#2", 0, KVLocation.HBM),
    ]
    assert nodes[1].parent_id == stored[0] and nodes[2].parent_id == stored[1]
    assert gate.table.view(stored[0]).hit_count == 1 and gate.table.view(stored[1]).in_use
    assert b.status is GateStatus.SUBMITTED
    # a held request sees how much of its prompt the cache holds (what lpm sorts by)
    held = gate.preview(shared, 2, CHAT)
    assert held.prefix_hit_tokens == 16
    assert [s.num_prefill_tokens for s in recorder.steps][:1] == [28]


def test_iteration_stats_feed_step_finished(trtllm12: ModuleType) -> None:
    recorder = Recorder()
    gate = _gate("fcfs", recorder)
    arrivals = [Arrival("r", 0, CHAT, _prompt(0), 3, 3)]
    run_mode_a(gate, arrivals)
    assert [(s.step_index, s.num_prefill_tokens, s.num_decode_tokens) for s in recorder.steps] == [
        (0, 20, 0),
        (1, 0, 1),
        (2, 0, 1),
    ]
    assert [s.used_hbm_blocks for s in recorder.steps] == [3, 3, 0]
    assert gate.counters.num_step_reports == 3


def test_submitted_requests_are_registered_for_an_in_engine_scheduler(trtllm12: ModuleType) -> None:
    table = InMemorySloTable()
    llm = make_llm()
    gate = TrtllmGate(llm, build_plugin_manager("fcfs").hook, clock=llm._clock, slo_table=table)
    rec = gate.submit([1, 2, 3], sampling(2), slo=BATCH)
    entry = table.lookup(rec.handle.request_id)
    assert entry is not None and entry.slo is BATCH and entry.arrival_s == rec.arrival_s


class LowPrecisionForBatch:
    name = "low-precision-for-batch"

    def __init__(self) -> None:
        self.seen: list[tuple[RequestView, StepState]] = []

    @hookimpl
    def superinfer_kv_precision(self, request: RequestView, state: StepState) -> KVPrecision | None:
        self.seen.append((request, state))
        return KVPrecision.INT4 if request.slo.name == "batch" else None


def test_precision_routes_to_the_engine_with_that_kv_dtype(trtllm12: ModuleType) -> None:
    from tensorrt_llm.llmapi import KvCacheConfig

    planner = LowPrecisionForBatch()
    pm = build_plugin_manager("fcfs")
    pm.register(planner)
    gates = {}
    for dtype in ("auto", "fp8"):
        llm = make_llm(
            kv_cache_config=KvCacheConfig(max_tokens=128, tokens_per_block=8, dtype=dtype)
        )
        gate = TrtllmGate(llm, pm.hook, clock=llm._clock)
        gates[gate.config.kv_precision] = gate
    router = PrecisionRouter(gates, pm.hook)
    chat = router.submit(list(_prompt(0)), sampling(4), slo=CHAT)
    batch = router.submit(list(_prompt(100)), sampling(4), slo=BATCH)
    assert chat.request_id in gates[KVPrecision.FP16].in_flight
    assert batch.request_id in gates[KVPrecision.FP8].in_flight  # int4 rounds up to fp8
    assert router.routed == {KVPrecision.FP16: 1, KVPrecision.FP8: 1}
    request, state = planner.seen[1]
    assert (request.slo.name, request.kv_precision, request.prompt_tokens) == ("batch", "fp16", 20)
    assert len(state.running) == 1, "the state is the fp16 engine's, with chat in flight"


def test_async_generate_streams_and_raises_for_rejected(trtllm12: ModuleType) -> None:
    gate = _gate(RejectBatch(), max_batch_size=2)

    async def consume(prompt: tuple[int, ...], slo: Any) -> int:
        tokens = 0
        async for out in gate.generate(list(prompt), sampling(5), slo=slo):
            tokens = len(out.outputs[0].token_ids)
        return tokens

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(consume(_prompt(50 * i), CHAT) for i in range(4)),
            consume(_prompt(999), BATCH),
            return_exceptions=True,
        )

    results = asyncio.run(main())
    assert results[:4] == [5, 5, 5, 5]
    assert isinstance(results[4], RequestNotAdmittedError)
    assert "rejected: batch_not_served" in str(results[4])
    assert not gate.held and not gate.in_flight


def test_the_registered_reuse_placement_policy_runs_behind_the_gate(trtllm12: ModuleType) -> None:
    """The real ``reuse`` plugin takes every argument of the hookspec: the gate must pass them."""
    pm = build_plugin_manager("fcfs", kv_policy="reuse")
    llm = make_llm()
    gate = TrtllmGate(llm, pm.hook, clock=llm._clock)
    first = gate.submit(list(_prompt(0, 28)), sampling(2), slo=CHAT, request_id="a")
    assert gate.counters.num_placement_calls == 1  # asked, answered (keep: the engine default)
    assert first.retention == () and "a" in gate.in_flight  # submitted to the engine
