"""Mode B against the 1.2 double: installation, and the contract the real executor relies on."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superinfer.adapters.manager import build_plugin_manager
from superinfer.adapters.trtllm import plugin
from superinfer.adapters.trtllm.engine import UnsupportedEngineError, load_engine
from superinfer.adapters.trtllm.scheduler import SuperinferScheduler
from superinfer.adapters.trtllm.slo_table import InMemorySloTable
from superinfer.policy_core.types import ScheduleDecision, StepState
from superinfer.policy_core.validation import PolicyError
from tests.adapters.trtllm.helpers import (
    BATCH,
    CHAT,
    Arrival,
    ContractChecker,
    RandomPolicy,
    Recorder,
    make_llm,
    output_len_by_prompt,
    run_mode_b,
    sampling,
)

pytestmark = pytest.mark.usefixtures("trtllm12")


class InnerSpy:
    """Stands in for the wrapped SimpleScheduler and records what the wrapper hands it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[list[Any], Any]] = []

    def schedule_request(self, active: list[Any], inflight: Any) -> Any:
        self.calls.append((list(active), inflight))
        return self.inner.schedule_request(active, inflight)

    def can_schedule(self, requests: list[Any]) -> bool:
        return bool(self.inner.can_schedule(requests))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)


def _install(policy: Any, clock: Any, table: InMemorySloTable | None = None) -> Any:
    pm = build_plugin_manager(policy) if isinstance(policy, str) else policy
    plugin.install(
        pm.hook, slo_table=table or InMemorySloTable(), clock=clock, record_admissions=True
    )
    return pm


def test_install_wraps_both_executors_of_a_kv_size_estimation(trtllm12: ModuleType) -> None:
    from tensorrt_llm._fake import FakeClock
    from tensorrt_llm._torch.pyexecutor import py_executor_creator
    from tensorrt_llm._torch.pyexecutor.scheduler import RequestScheduler
    from tensorrt_llm.llmapi import KvCacheConfig

    built: list[Any] = []
    original = py_executor_creator.create_py_executor_instance

    def spy(*args: Any, **kwargs: Any) -> Any:
        built.append(original(*args, **kwargs))
        return built[-1]

    py_executor_creator.create_py_executor_instance = spy
    clock = FakeClock()
    _install("fcfs", clock)
    llm = make_llm(
        kv_cache_config=KvCacheConfig(max_tokens=None, tokens_per_block=8), _fake_clock=clock
    )
    assert len(built) == 2, "estimation builds a throw-away executor first"
    assert built[0].is_shutdown and built[1] is llm._engine
    for executor in built:
        assert isinstance(executor.scheduler, SuperinferScheduler)
        assert isinstance(executor.scheduler, RequestScheduler)
    assert built[0].scheduler is not built[1].scheduler
    assert built[1].scheduler.limits.max_batch_size == 8
    # the final executor works: one request runs to completion
    handle = llm.generate_async(list(range(10)), None)
    while llm._fake_has_work():
        llm._fake_step()
    assert handle._fake_next() is not None


def test_install_and_uninstall_are_idempotent(trtllm12: ModuleType) -> None:
    from tensorrt_llm._fake import FakeClock
    from tensorrt_llm._torch.pyexecutor import _util, py_executor_creator

    original = py_executor_creator.create_py_executor_instance
    assert original is _util.create_py_executor_instance
    assert not plugin.is_installed()
    _install("fcfs", FakeClock())
    _install("priority", FakeClock())
    wrapped = py_executor_creator.create_py_executor_instance
    assert wrapped.__superinfer_original__ is original, "one wrapper, not a wrapper of a wrapper"
    assert plugin.is_installed()
    llm = make_llm()
    assert llm._engine.scheduler.inner.__class__.__name__ == "SimpleScheduler"
    plugin.uninstall()
    plugin.uninstall()
    assert py_executor_creator.create_py_executor_instance is original
    assert not plugin.is_installed()
    assert type(make_llm()._engine.scheduler).__name__ == "SimpleScheduler"


def test_install_refuses_other_versions_without_patching(
    trtllm12: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorrt_llm._fake import FakeClock
    from tensorrt_llm._torch.pyexecutor import py_executor_creator

    monkeypatch.setattr(trtllm12, "__version__", "1.3.0rc3")
    original = py_executor_creator.create_py_executor_instance
    with pytest.raises(UnsupportedEngineError, match="1.3.0rc3"):
        _install("fcfs", FakeClock())
    assert py_executor_creator.create_py_executor_instance is original


def test_wrap_refuses_kv_manager_v2_and_foreign_schedulers(trtllm12: ModuleType) -> None:
    from tensorrt_llm._torch.pyexecutor.resource_manager import ResourceManagerType

    engine = load_engine()
    llm = make_llm()
    executor = llm._engine
    hook = build_plugin_manager("fcfs").hook
    kv = executor.resource_manager.resource_managers[ResourceManagerType.KV_CACHE_MANAGER]

    class KVCacheManagerV2:
        tokens_per_block = 8
        kv_cache_map: dict[int, Any] = {}

    executor.resource_manager.resource_managers[ResourceManagerType.KV_CACHE_MANAGER] = (
        KVCacheManagerV2()
    )
    with pytest.raises(UnsupportedEngineError, match="KVCacheManagerV2 is KV cache manager V2"):
        plugin.wrap_executor(executor, engine=engine, hook=hook)
    executor.resource_manager.resource_managers[ResourceManagerType.KV_CACHE_MANAGER] = kv
    wrapper = plugin.wrap_executor(executor, engine=engine, hook=hook)
    assert plugin.wrap_executor(executor, engine=engine, hook=hook) is wrapper
    executor.scheduler = object()
    with pytest.raises(UnsupportedEngineError, match="expected 1.2's SimpleScheduler"):
        plugin.wrap_executor(executor, engine=engine, hook=hook)


@st.composite
def workloads(draw: Any) -> list[Arrival]:
    """Up to 12 requests over 7 steps; prompt + output fit one step's budget (48 tokens)."""
    arrivals: dict[tuple[int, ...], Arrival] = {}
    for i in range(draw(st.integers(1, 12))):
        max_tokens = draw(st.integers(1, 10))
        base = draw(st.sampled_from([0, 1000 * (i + 1)]))  # 0: shares a prefix with others
        prompt = tuple(base + t for t in range(draw(st.integers(1, 36))))
        arrivals.setdefault(
            prompt,
            Arrival(
                f"r{i}",
                draw(st.integers(0, 6)),
                draw(st.sampled_from([CHAT, BATCH])),
                prompt,
                draw(st.integers(1, max_tokens)),
                max_tokens,
            ),
        )
    return list(arrivals.values())


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    arrivals=workloads(),
    policy=st.sampled_from(["fcfs", "priority", "random"]),
    capacity=st.sampled_from(["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"]),
    chunked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_contract_holds_on_random_workloads(
    trtllm12: ModuleType,
    arrivals: list[Arrival],
    policy: str,
    capacity: str,
    chunked: bool,
    seed: int,
) -> None:
    from tensorrt_llm._fake import FakeClock
    from tensorrt_llm.llmapi import CapacitySchedulerPolicy, KvCacheConfig, SchedulerConfig

    plugin.uninstall()
    clock = FakeClock()
    table = InMemorySloTable()
    recorder = Recorder()
    pm = build_plugin_manager(
        RandomPolicy(seed, reject_rate=0.05) if policy == "random" else policy
    )
    pm.register(recorder)
    _install(pm, clock, table)
    llm = make_llm(
        max_batch_size=4,
        max_num_tokens=48,
        enable_chunked_prefill=chunked,
        scheduler_config=SchedulerConfig(CapacitySchedulerPolicy(capacity)),
        kv_cache_config=KvCacheConfig(max_tokens=112, tokens_per_block=8, event_buffer_max_size=0),
        _fake_clock=clock,
        _fake_output_len=output_len_by_prompt(arrivals),
    )
    wrapper = llm._engine.scheduler
    spy = InnerSpy(wrapper.inner)
    wrapper.inner = spy
    checker = ContractChecker(wrapper, max_batch_size=4, max_num_tokens=48)
    llm._engine.scheduler = checker
    kv = llm._engine._kv_cache_manager.impl
    step = llm._engine._fake_step

    def step_and_check() -> None:
        calls = len(recorder.states)
        checker.can_schedule(list(llm._engine.active_requests))
        assert len(recorder.states) == calls, "can_schedule reached the policy"
        step()
        kv._fake_check_invariants()

    llm._engine._fake_step = step_and_check
    log = run_mode_b(llm, arrivals, table, max_steps=600)

    rejected = {v.request_id for v, _ in recorder.aborted}
    assert len(recorder.arrived) == len(arrivals), "every request was reported once"
    assert len(recorder.finished) + len(rejected) == len(arrivals)
    assert set(log.finished) == {a.name for a in arrivals}, "every request got a final output"
    assert all(reason == "random_reject" for _, reason in recorder.aborted)
    assert len(spy.calls) == len(checker.started) > 0
    for (handed, inflight), started, paused in zip(
        spy.calls, checker.started, checker.paused, strict=True
    ):
        assert inflight is llm._engine.inflight_req_ids, "inflight ids passed through untouched"
        hidden = started - {r.py_request_id for r in handed}
        assert hidden <= paused, "a started request was hidden from the capacity scheduler"


def test_can_schedule_reaches_neither_the_policy_nor_the_requests(trtllm12: ModuleType) -> None:
    from tensorrt_llm._fake import FakeClock

    clock = FakeClock()
    recorder = Recorder()
    pm = build_plugin_manager("priority")
    pm.register(recorder)
    _install(pm, clock)
    llm = make_llm(_fake_clock=clock)
    for i in range(3):  # 12 + 32 tokens = 6 blocks each: two fit in 16 blocks, not three
        llm.generate_async([i] * 12, None)
    llm._fake_step()
    executor = llm._engine
    checker = ContractChecker(executor.scheduler, 8, 256)
    calls = len(recorder.states)
    active = list(executor.active_requests)
    assert checker.can_schedule(active[:2]) is True
    assert checker.can_schedule(active) is False
    assert len(recorder.states) == calls
    assert executor.scheduler.counters.num_calls == calls


def test_rejection_ends_the_request_with_a_cancelled_output(trtllm12: ModuleType) -> None:
    from tensorrt_llm._fake import FakeClock

    class RejectBatch:
        name = "reject-batch"

        from superinfer.adapters.hookspecs import hookimpl

        @hookimpl
        def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
            reject = {v.request_id: "batch_not_served" for v in state.waiting if v.slo is BATCH}
            admit = [v for v in state.waiting if v.request_id not in reject]
            return ScheduleDecision(
                num_tokens={
                    **{v.request_id: 1 for v in state.running},
                    **{v.request_id: v.pending_tokens for v in admit},
                },
                admit=tuple(v.request_id for v in admit),
                reject=reject,
            )

    clock = FakeClock()
    recorder = Recorder()
    pm = build_plugin_manager(RejectBatch())
    pm.register(recorder)
    table = InMemorySloTable()
    _install(pm, clock, table)
    llm = make_llm(_fake_clock=clock)
    chat = llm.generate_async(list(range(8)), None)
    batch = llm.generate_async(list(range(100, 108)), None)
    table.put(chat.request_id, CHAT)
    table.put(batch.request_id, BATCH)
    while llm._fake_has_work():
        llm._fake_step()
    out = batch._fake_next()
    assert out is not None and out.finished and out.outputs[0].finish_reason == "cancelled"
    assert out.outputs[0].token_ids == []
    assert [(v.slo.name, reason) for v, reason in recorder.aborted] == [
        ("batch", "batch_not_served")
    ]
    assert [v.slo.name for v in recorder.finished] == ["chat"]
    assert llm._engine.scheduler.counters.num_rejected == 1


def test_preemption_pauses_by_recompute_and_the_request_resumes(trtllm12: ModuleType) -> None:
    from tensorrt_llm._fake import FakeClock

    class PreemptOnce:
        """Preempts request 1 at the third scheduling point, else FCFS."""

        name = "preempt-once"

        from superinfer.adapters.hookspecs import hookimpl

        def __init__(self) -> None:
            self.calls = 0
            from superinfer.policy_core.policies.fcfs import FCFSPolicy

            self.fcfs = FCFSPolicy(max_repeat_steps=1)  # asked at every step

        @hookimpl
        def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
            from superinfer.policy_core.types import PreemptMode

            self.calls += 1
            if self.calls == 3 and any(v.request_id == "1" for v in state.running):
                rest = {v.request_id: 1 for v in state.running if v.request_id != "1"}
                return ScheduleDecision(num_tokens=rest, preempt={"1": PreemptMode.RECOMPUTE})
            return self.fcfs.schedule(state)

    clock = FakeClock()
    recorder = Recorder()
    pm = build_plugin_manager(PreemptOnce())
    pm.register(recorder)
    _install(pm, clock)
    llm = make_llm(_fake_clock=clock)
    first = llm.generate_async(list(range(16)), None)
    llm.generate_async(list(range(50, 66)), None)
    while llm._fake_has_work():
        llm._fake_step()
    steps = llm._engine._fake_log
    assert steps[2][3] == [1], "paused at the third step"
    assert steps[3][1] == [1], "re-prefilled (prompt + 2 generated tokens) at the next"
    done = recorder.finished[[v.request_id for v in recorder.finished].index("1")]
    assert (done.generated_tokens, done.num_preemptions) == (32, 1)
    tokens = []
    while (out := first._fake_next()) is not None:
        tokens = out.outputs[0].token_ids
    assert len(tokens) == 32, "the stream continues across the pause"


def test_hooks_report_arrivals_steps_and_finishes(trtllm12: ModuleType) -> None:
    from tensorrt_llm._fake import FakeClock

    clock = FakeClock(100.0)
    recorder = Recorder()
    pm = build_plugin_manager("fcfs")
    pm.register(recorder)
    table = InMemorySloTable()
    _install(pm, clock, table)
    llm = make_llm(_fake_clock=clock, _fake_output_len=lambda prompt, sp: 3)
    handle = llm.generate_async(list(range(20)), None)
    table.put(handle.request_id, CHAT, arrival_s=99.5)
    unknown = llm.generate_async(list(range(40, 45)), None)
    while llm._fake_has_work():
        llm._fake_step()
    assert [(v.request_id, v.slo.name, v.arrival_s) for v in recorder.arrived] == [
        ("1", "chat", 99.5),
        ("2", "default", 100.0),
    ]
    assert [(v.request_id, v.generated_tokens) for v in recorder.finished] == [("1", 3), ("2", 3)]
    assert recorder.finished[0].first_token_s == pytest.approx(100.01)
    # steps: both prefills, then two decode steps for both; reported as each step ends
    assert [(s.num_prefill_tokens, s.num_decode_tokens) for s in recorder.steps] == [
        (25, 0),
        (0, 2),
        (0, 2),
    ]
    assert [s.finished_ids for s in recorder.steps] == [(), (), ("1", "2")]
    assert [round(s.duration_s, 6) for s in recorder.steps] == [0.01, 0.01, 0.01]
    assert unknown is not None


def test_decode_only_decisions_repeat_until_the_active_list_changes(
    trtllm12: ModuleType,
) -> None:
    from tensorrt_llm._fake import FakeClock

    recorder = Recorder()
    pm = build_plugin_manager("fcfs")  # max_repeat_steps=1024 on decode-only steps
    pm.register(recorder)
    _install(pm, FakeClock())
    llm = make_llm(_fake_output_len=lambda prompt, sp: 6 if prompt[0] == 0 else 10)
    llm.generate_async(list(range(0, 12)), sampling(10))
    llm.generate_async(list(range(50, 62)), sampling(10))
    for _ in range(3):
        llm._fake_step()
    llm.generate_async(list(range(90, 102)), sampling(10))  # an arrival ends the repeat
    while llm._fake_has_work():
        llm._fake_step()
    wrapper = llm._engine.scheduler
    # asked: the prefill, the first decode, the arrival, its first decode, after each finish
    assert len(recorder.states) == wrapper.counters.num_calls == 6
    assert len(llm._engine._fake_log) == 13 and wrapper.counters.num_repeated == 7
    assert len(recorder.steps) == len(llm._engine._fake_log), "every step is still reported"


def test_an_inapplicable_decision_stops_the_step(trtllm12: ModuleType) -> None:
    from tensorrt_llm._fake import FakeClock

    from superinfer.adapters.hookspecs import hookimpl

    class Greedy:
        name = "greedy"

        @hookimpl
        def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
            ids = tuple(v.request_id for v in state.waiting)
            return ScheduleDecision(num_tokens=dict.fromkeys(ids, 10_000), admit=ids)

    _install(build_plugin_manager(Greedy()), FakeClock())
    llm = make_llm()
    llm.generate_async(list(range(10)), None)
    with pytest.raises(PolicyError, match="exceed"):
        llm._fake_step()


@pytest.mark.parametrize(("policy", "victim"), [("fcfs", "3"), ("priority", "1")])
def test_kv_pressure_preempts_the_policys_last_ranked_request(
    trtllm12: ModuleType, policy: str, victim: str
) -> None:
    from tensorrt_llm._fake import FakeClock
    from tensorrt_llm.llmapi import CapacitySchedulerPolicy, KvCacheConfig, SchedulerConfig

    clock = FakeClock()
    recorder = Recorder()
    pm = build_plugin_manager(policy)
    pm.register(recorder)
    table = InMemorySloTable()
    _install(pm, clock, table)
    llm = make_llm(
        scheduler_config=SchedulerConfig(CapacitySchedulerPolicy.MAX_UTILIZATION),
        kv_cache_config=KvCacheConfig(max_tokens=48, tokens_per_block=8, event_buffer_max_size=0),
        _fake_clock=clock,
        _fake_output_len=lambda prompt, sp: 10,
    )
    checker = ContractChecker(llm._engine.scheduler, 8, 256)
    llm._engine.scheduler = checker
    for i, slo in enumerate([BATCH, CHAT, CHAT]):  # 15-token prompts: 2 blocks, a 3rd at 16
        handle = llm.generate_async(list(range(100 * i, 100 * i + 15)), None)
        table.put(handle.request_id, slo)
    while llm._fake_has_work():
        llm._fake_step()
    first_pause = next(paused for paused in checker.paused if paused)
    # fcfs preempts the latest admitted; priority the lowest-ranked (the batch request)
    assert first_pause == {int(victim)}
    assert sorted(v.request_id for v in recorder.finished) == ["1", "2", "3"]
    assert all(v.generated_tokens == 10 for v in recorder.finished)
