"""The scheduling hooks against the real sglang 0.5.23 classes: ``calc_priority``,
``PrefillAdder`` admission and preemption, ``ScheduleBatch.retract_decode``, queue-full abort."""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import Any

import pytest

from tests.adapters.sglang.gate import require_sglang

require_sglang()

from sglang.srt.managers.schedule_batch import FINISH_LENGTH, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import (  # noqa: E402
    AddReqResult,
    PrefillAdder,
    SchedulePolicy,
)

from superinfer.adapters.hookspecs import hookimpl  # noqa: E402
from superinfer.adapters.sglang.view import EngineLimits, reserved_blocks  # noqa: E402
from superinfer.policy_core.types import (  # noqa: E402
    AdmissionRule,
    KVPrecision,
    PreemptMode,
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)
from tests.adapters.sglang.worlds import World, arrive, make_adapter, make_req  # noqa: E402


class Scripted:
    """A test policy: ``decide(state)`` gives the decision; lifecycle calls are recorded."""

    name = "scripted"

    def __init__(self, decide: Callable[[StepState], ScheduleDecision]) -> None:
        self.decide = decide
        self.states: list[StepState] = []
        self.events: list[tuple[str, str]] = []
        self.steps: list[StepStats] = []

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        self.states.append(state)
        return self.decide(state)

    @hookimpl
    def superinfer_request_arrived(self, request: RequestView, now_s: float) -> None:
        self.events.append(("arrived", request.request_id))

    @hookimpl
    def superinfer_request_finished(self, request: RequestView, now_s: float) -> None:
        self.events.append(("finished", request.request_id))

    @hookimpl
    def superinfer_request_aborted(self, request: RequestView, now_s: float, reason: str) -> None:
        self.events.append(("aborted", f"{request.request_id}: {reason}"))

    @hookimpl
    def superinfer_step_finished(self, stats: StepStats) -> None:
        self.steps.append(stats)


def sglang_fcfs_with_priority(world: World) -> SchedulePolicy:
    """SGLang's ``--schedule-policy fcfs --enable-priority-scheduling`` (larger priority first)."""
    return SchedulePolicy("fcfs", world.cache, False, True, False)


def chat_and_batch() -> list[Any]:
    return [
        make_req("b1", 8, first=0, slo="batch"),
        make_req("c1", 8, first=100, slo="chat"),
        make_req("b2", 8, first=200, slo="batch"),
        make_req("c2", 8, first=300, slo="chat"),
    ]


def rids(reqs: list[Any]) -> list[str]:
    return [r.rid for r in reqs]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("fcfs", ["b1", "c1", "b2", "c2"]), ("priority", ["c1", "c2", "b1", "b2"])],
)
def test_the_policy_orders_the_queue_through_the_real_calc_priority(
    policy: str, expected: list[str]
) -> None:
    world = World(256, "priority", "python")
    adapter = make_adapter(policy, world=world)
    queue: list[Any] = []
    arrive(adapter, queue, *chat_and_batch())
    native = SchedulePolicy.calc_priority
    # SGLang's own pass alone puts chat first (its priority = -rank: chat 0 > batch -1) ...
    alone = list(queue)
    native(sglang_fcfs_with_priority(world), alone)
    assert rids(alone) == ["c1", "c2", "b1", "b2"]
    # ... and through the hook the policy's admissions decide, fcfs included.
    adapter.calc_priority(native, sglang_fcfs_with_priority(world), queue, ScheduleBatch(reqs=[]))
    assert rids(queue) == expected
    assert adapter.decision is not None and list(adapter.decision.admit) == expected
    assert [r.priority for r in queue] == [0 if r.rid[0] == "c" else -1 for r in queue]


def test_the_state_reports_sglang_queues_kv_and_limits_exactly() -> None:
    world = World(256, "priority", "python")
    policy = Scripted(lambda s: ScheduleDecision())
    limits = EngineLimits(page_size=1, max_prefill_tokens=64, max_running_requests=8)
    adapter = make_adapter(policy, world=world, limits=limits)
    running = world.prefill([make_req("r", 20, first=500, slo="chat")])
    queue: list[Any] = []
    arrive(adapter, queue, make_req("w", 12, first=600, slo="batch", max_new=7))
    adapter.calc_priority(
        SchedulePolicy.calc_priority, sglang_fcfs_with_priority(world), queue, running
    )
    (state,) = policy.states
    assert (state.free_hbm_blocks, state.total_hbm_blocks) == (236, 256)
    assert (state.token_budget, state.max_num_seqs, state.block_size_tokens) == (65, 8, 1)
    assert state.mixed_batches is False  # SGLang's default: a prefill batch runs alone
    assert state.prefill_runs_whole is True  # add_chunked_req: an admitted prompt runs to its end
    (w,) = state.waiting
    assert (w.request_id, w.prompt_tokens, w.max_output_tokens, w.slo.name) == ("w", 12, 7, "batch")
    assert (w.computed_tokens, w.pending_tokens, w.kv_blocks) == (0, 12, 0)
    (r,) = state.running
    assert (r.request_id, r.computed_tokens, r.generated_tokens, r.pending_tokens) == (
        "r",
        20,
        1,
        1,
    )
    assert r.kv_blocks == 20
    # SGLang's PrefillAdder rule: r's remaining output cap (16 - 1 = 15 tokens; ratio 1.0
    # without a scheduler to read new_token_ratio from) is held back, and an admission is
    # charged its whole prompt and output cap
    assert state.admission is AdmissionRule.RESERVE_RATIO and state.reserve_whole_prompt
    assert state.reserved_hbm_blocks == 15


def _scheduler(chunked: Any, ratio: float) -> Any:
    """The two ``Scheduler`` attributes the views read."""
    tracker = types.SimpleNamespace(current=ratio)
    scheduler = types.SimpleNamespace(chunked_req=chunked, new_token_ratio_tracker=tracker)
    return types.SimpleNamespace(scheduler=scheduler, abort=lambda *a: None)


def test_the_chunked_request_is_a_running_prefill_with_its_prompt_left_reserved() -> None:
    world = World(256, "priority", "python")
    policy = Scripted(lambda s: ScheduleDecision())
    adapter = make_adapter(policy, world=world, limits=EngineLimits(max_running_requests=8))
    running = world.prefill([make_req("r", 20, first=500, slo="chat")])
    queue: list[Any] = []
    arrive(adapter, queue, make_req("c", 40, first=700, slo="batch", max_new=10))
    chunked = queue.pop()  # admitted earlier; 16 of its 40 prompt tokens ran in its chunks
    chunked.sampling_params.ignore_eos = True
    chunked.prefix_len = chunked.extend_end = 16
    arrive(adapter, queue, make_req("w", 12, first=600, slo="chat", max_new=7))
    adapter.engine = _scheduler(chunked, ratio=0.5)
    adapter.calc_priority(
        SchedulePolicy.calc_priority, sglang_fcfs_with_priority(world), queue, running
    )
    (state,) = policy.states
    assert [v.request_id for v in state.running] == ["r", "c"]
    c = state.running[1]
    assert (c.computed_tokens, c.pending_tokens, c.generated_tokens) == (16, 24, 0)
    assert (c.kv_blocks, c.prefix_hit_tokens, c.first_token_s) == (16, 0, None)
    assert [v.request_id for v in state.waiting] == ["w"]
    # r: 15 output tokens left x 0.5 (no ignore_eos) = 7.5; c: 10 x 1.0 (ignore_eos) and its 24
    # prompt tokens still to prefill: int(17.5) + 24 = 41
    assert state.reserved_hbm_blocks == 41
    # the token budget: the prefill budget plus one per decoding request (r; c does not decode)
    assert state.token_budget == 16384 + 1
    # SGLang's chunked request is never one of the queues' too, nor finished; if it were, it
    # would not be listed twice (the running batch's r, the waiting w) nor listed at all
    for stale in (running.reqs[0], queue[0]):
        adapter.engine = _scheduler(stale, ratio=0.5)
        adapter.calc_priority(
            SchedulePolicy.calc_priority, sglang_fcfs_with_priority(world), queue, running
        )
        assert [v.request_id for v in policy.states[-1].running] == ["r"]
        assert [v.request_id for v in policy.states[-1].waiting] == ["w"]
        assert policy.states[-1].reserved_hbm_blocks == 7  # int(7.5)
    chunked.finished_reason = FINISH_LENGTH(length=0)
    adapter.engine = _scheduler(chunked, ratio=0.5)
    adapter.calc_priority(
        SchedulePolicy.calc_priority, sglang_fcfs_with_priority(world), queue, running
    )
    assert [v.request_id for v in policy.states[-1].running] == ["r"]


def test_a_chunked_request_resumed_after_a_retraction_prefills_its_output_too() -> None:
    """SGLang re-prefills a retracted request's prompt and output so far
    (``full_untruncated_fill_ids``), in chunks like any prompt."""
    adapter = make_adapter(
        Scripted(lambda s: ScheduleDecision()), world=World(256, "lru", "python")
    )
    req = make_req("c", 40, first=700, slo="batch", max_new=10)
    req.output_ids.extend([1, 2, 3])  # 3 tokens out before it was retracted
    req.prefix_len = req.extend_end = 32  # 32 of its 43 tokens prefilled again
    view = adapter.view(req, running=True, chunked=True)
    assert (view.computed_tokens, view.pending_tokens, view.generated_tokens) == (32, 11, 3)
    # 11 tokens to prefill, and its cap less its output, 7 x 1.0 (no scheduler: ratio 1.0)
    assert reserved_blocks([], req, 1.0, 1) == 18


def test_reserved_blocks_clip_the_output_cap_and_round_up_to_pages() -> None:
    long = make_req("long", 8, max_new=5000)
    long.sampling_params.ignore_eos = True
    short = make_req("short", 8, max_new=3)
    # 4096 (SGLang's CLIP_MAX_NEW_TOKENS) + int(3 x 0.7) = 4098 tokens = 257 pages of 16
    assert reserved_blocks([long, short], None, 0.7, 16) == 257
    assert reserved_blocks([], None, 0.7, 16) == 0


def test_admission_follows_the_policy_and_sglang_can_only_refuse_more() -> None:
    world = World(256, "priority", "python")
    policy = Scripted(lambda s: ScheduleDecision(num_tokens={"c1": 8}, admit=("c1",)))
    adapter = make_adapter(policy, world=world)
    queue: list[Any] = []
    arrive(adapter, queue, *chat_and_batch())
    adapter.calc_priority(
        SchedulePolicy.calc_priority,
        sglang_fcfs_with_priority(world),
        queue,
        ScheduleBatch(reqs=[]),
    )
    assert rids(queue) == ["c1", "b1", "b2", "c2"]  # admitted first, then arrival order
    adder = PrefillAdder(1, world.cache, world.allocator, ScheduleBatch(reqs=[]), 0.7, 16384, None)
    results = []
    for req in queue:  # the shape of Scheduler._get_new_batch_prefill_raw's loop
        req.init_next_round_input(world.cache)
        res = adapter.add_one_req(PrefillAdder.add_one_req, adder, req, False, None)
        results.append(res)
        if res != AddReqResult.CONTINUE:
            break
    assert results == [AddReqResult.CONTINUE, AddReqResult.OTHER]
    assert rids(adder.can_run_list) == ["c1"]


def test_a_partial_allotment_waits_in_the_bank_until_it_covers_the_prompt() -> None:
    # SGLang would run all 8 prompt tokens of b1 at once: the policy's 3 per pass are banked, and
    # the real adder gets b1 on the third pass (3 + 3 + 3 >= 8).
    world = World(256, "priority", "python")
    policy = Scripted(lambda s: ScheduleDecision(num_tokens={"b1": 3}, admit=("b1",)))
    adapter = make_adapter(policy, world=world)
    queue: list[Any] = []
    arrive(adapter, queue, make_req("b1", 8, first=0, slo="batch"))
    results = []
    for _ in range(3):
        adapter.calc_priority(
            SchedulePolicy.calc_priority,
            sglang_fcfs_with_priority(world),
            queue,
            ScheduleBatch(reqs=[]),
        )
        adder = PrefillAdder(
            1, world.cache, world.allocator, ScheduleBatch(reqs=[]), 0.7, 16384, None
        )
        (req,) = queue
        req.init_next_round_input(world.cache)
        results.append(adapter.add_one_req(PrefillAdder.add_one_req, adder, req, False, None))
    assert results == [AddReqResult.OTHER, AddReqResult.OTHER, AddReqResult.CONTINUE]
    assert rids(adder.can_run_list) == ["b1"] and adapter.bank.tokens == {"b1": 9}


def test_victims_are_the_policys_released_through_the_real_prefill_adder() -> None:
    world = World(128, "priority", "python")
    wanted = ("x", "z")  # not SGLang's pick: it takes the least important, newest first (y)

    def decide(state: StepState) -> ScheduleDecision:
        if not state.waiting:
            return ScheduleDecision()
        return ScheduleDecision(
            num_tokens={"w": 60, "y": 1},
            admit=("w",),
            preempt=dict.fromkeys(wanted, PreemptMode.RECOMPUTE),
        )

    adapter = make_adapter(Scripted(decide), world=world)
    running_reqs = [
        make_req("x", 30, first=0, slo="chat", max_new=4),
        make_req("y", 30, first=100, slo="batch", max_new=4),
        make_req("z", 30, first=200, slo="chat", max_new=4),
    ]
    queue: list[Any] = []
    arrive(adapter, queue, *running_reqs, make_req("w", 60, first=300, slo="chat"))
    del queue[:3]  # x, y, z run
    batch = world.prefill(running_reqs)
    assert world.allocator.available_size() == 38
    adapter.calc_priority(
        SchedulePolicy.calc_priority, sglang_fcfs_with_priority(world), queue, batch
    )
    (w,) = queue
    adder = PrefillAdder(
        1,
        world.cache,
        world.allocator,
        batch,
        0.7,
        16384,
        None,
        priority_scheduling_preemption_threshold=0,
    )
    w.init_next_round_input(world.cache)
    assert (
        adapter.add_one_req(PrefillAdder.add_one_req, adder, w, False, None)
        == AddReqResult.NO_TOKEN
    )
    assert adapter.preempt_to_schedule(adder, w) is True
    assert rids(adder.preempt_list) == ["x", "z"]
    assert rids(batch.reqs) == ["y"]
    assert world.allocator.available_size() == 98  # 38 free + 2 x 30 released
    assert (
        adapter.add_one_req(PrefillAdder.add_one_req, adder, w, False, None)
        == AddReqResult.CONTINUE
    )
    assert adapter.stats.preempted == 2
    # Asked again in the same pass, nothing is left to preempt.
    assert adapter.preempt_to_schedule(adder, w) is False


def test_no_victims_without_a_policy_preemption() -> None:
    world = World(128, "priority", "python")
    adapter = make_adapter("priority", world=world)
    running = [
        make_req("x", 30, first=0, slo="batch", max_new=4),
        make_req("y", 30, first=100, slo="batch", max_new=4),
    ]
    queue: list[Any] = []
    arrive(adapter, queue, *running, make_req("w", 100, first=300, slo="chat"))
    del queue[:2]
    batch = world.prefill(running)
    adapter.calc_priority(
        SchedulePolicy.calc_priority, sglang_fcfs_with_priority(world), queue, batch
    )
    adder = PrefillAdder(1, world.cache, world.allocator, batch, 0.7, 16384, None)
    # SGLang itself would preempt both batch requests for the chat one (priority 0 > -1) ...
    assert adapter.preempt_to_schedule(adder, queue[0]) is False
    assert rids(batch.reqs) == ["x", "y"] and adder.preempt_list == []


@pytest.mark.parametrize(("policy", "retracted"), [("priority", ["y"]), ("fcfs", ["z"])])
def test_decode_retraction_takes_the_policys_victim_through_the_real_retract_decode(
    policy: str, retracted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(96, "priority", "python")
    adapter = make_adapter(policy, world=world)
    reqs = [
        make_req("x", 28, first=0, slo="chat", max_new=4),
        make_req("y", 24, first=100, slo="batch", max_new=4),
        make_req("z", 20, first=200, slo="chat", max_new=4),
    ]
    arrive(adapter, [], *reqs)
    batch = world.prefill(reqs)
    batch.prepare_for_decode()
    world.allocator.alloc(world.allocator.available_size())  # the decode step finds no room
    assert not batch.check_decode_mem()
    # SGLang's own "length" order retracts the longest prompt first: x.
    assert ScheduleBatch._get_decode_retraction_order(batch.reqs) == [2, 1, 0]
    monkeypatch.setattr(
        ScheduleBatch, "_get_decode_retraction_order", staticmethod(adapter.decode_retraction_order)
    )
    out, _, aborted = adapter.retract_decode(ScheduleBatch.retract_decode, batch)
    assert rids(out) == retracted and aborted == []
    assert len(batch.reqs) == 2 and adapter.stats.retraction_points == 1


def test_tiers_become_sglang_priorities_so_the_queue_full_abort_agrees() -> None:
    from sglang.srt.managers.scheduler import Scheduler

    world = World(256, "priority", "python")
    tiers = {"b1": 0, "c1": 2, "b2": 1, "c2": 1}
    adapter = make_adapter(Scripted(lambda s: ScheduleDecision(tiers=tiers)), world=world)
    queue: list[Any] = []
    arrive(adapter, queue, *chat_and_batch())
    adapter.calc_priority(
        SchedulePolicy.calc_priority,
        sglang_fcfs_with_priority(world),
        queue,
        ScheduleBatch(reqs=[]),
    )
    assert {r.rid: r.priority for r in queue} == {"b1": 0, "c1": -2, "b2": -1, "c2": -1}
    sent: list[tuple[str, str]] = []
    scheduler = types.SimpleNamespace(
        max_queued_requests=4,
        waiting_queue=queue,
        enable_priority_scheduling=True,
        schedule_low_priority_values_first=False,
        _release_aborted_request=lambda req: None,
        beam_coordinator=types.SimpleNamespace(retire_group=lambda req: None),
        send_abort_output=lambda abort, req: sent.append(
            (req.rid, abort.finished_reason["message"])
        ),
    )
    newcomer = make_req("n", 8, first=400, priority=0)
    assert Scheduler._abort_on_queued_limit(scheduler, newcomer) is False
    assert sent == [("c1", "The request is aborted by a higher priority request.")]

    low_first = make_adapter(
        Scripted(lambda s: ScheduleDecision(tiers=tiers)),
        world=world,
        limits=EngineLimits(low_priority_values_first=True),
    )
    queue2: list[Any] = []
    arrive(low_first, queue2, *chat_and_batch())
    low_first.calc_priority(
        SchedulePolicy.calc_priority,
        SchedulePolicy("fcfs", world.cache, False, True, True),
        queue2,
        ScheduleBatch(reqs=[]),
    )
    assert {r.rid: r.priority for r in queue2} == tiers


def test_rejections_are_aborted_and_reported() -> None:
    world = World(256, "priority", "python")
    policy = Scripted(lambda s: ScheduleDecision(reject={"b2": "queue_full"} if s.waiting else {}))
    adapter = make_adapter(policy, world=world)
    queue: list[Any] = []
    arrive(adapter, queue, *chat_and_batch())
    adapter.calc_priority(
        SchedulePolicy.calc_priority,
        sglang_fcfs_with_priority(world),
        queue,
        ScheduleBatch(reqs=[]),
    )
    assert rids(queue) == ["b1", "c1", "c2"]
    assert adapter.engine.sent == [("b2", "rejected by superinfer policy: queue_full", 503)]
    assert ("aborted", "b2: queue_full") in policy.events and adapter.stats.rejected == 1


def test_an_invalid_decision_keeps_sglangs_order_and_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = World(256, "priority", "python")
    adapter = make_adapter(Scripted(lambda s: ScheduleDecision(admit=("ghost",))), world=world)
    queue: list[Any] = []
    arrive(adapter, queue, *chat_and_batch())
    with caplog.at_level(logging.ERROR, logger="superinfer.sglang"):
        adapter.calc_priority(
            SchedulePolicy.calc_priority,
            sglang_fcfs_with_priority(world),
            queue,
            ScheduleBatch(reqs=[]),
        )
    assert rids(queue) == ["c1", "c2", "b1", "b2"]  # SGLang's own pass
    assert adapter.decision is None and adapter.stats.invalid_decisions == 1
    assert "admit names 'ghost'" in caplog.text


def test_a_bad_slo_field_is_a_400_naming_the_field() -> None:
    adapter = make_adapter("fcfs")
    queue: list[Any] = []
    arrive(
        adapter, queue, make_req("a", slo="gold"), make_req("b", slo={"class": "chat", "ttft": 5})
    )
    assert queue == []
    assert adapter.engine.sent == [
        ("a", "custom_params.slo: unknown class 'gold' (classes: batch, chat)", 400),
        ("b", "custom_params.slo: unknown field 'ttft'", 400),
    ]


def test_steps_advance_the_logical_clock_and_report_finishes() -> None:
    world = World(256, "priority", "python")
    policy = Scripted(lambda s: ScheduleDecision())
    adapter = make_adapter(policy, world=world)
    reqs = [make_req("a", 10, first=0, slo="chat"), make_req("b", 6, first=50, slo="batch")]
    arrive(adapter, [], *reqs)
    batch = world.prefill(reqs)
    reqs[1].finished_reason = FINISH_LENGTH(length=1)
    scheduler = types.SimpleNamespace(token_to_kv_pool_allocator=world.allocator, waiting_queue=[])
    adapter.on_batch_result(None, scheduler, batch, None)
    # Two arrival iterations, then this prefill of 16 tokens: 3 steps of 20 ms + 16 x 0.1 ms.
    assert adapter.clock.now_s == pytest.approx(3 * 0.02 + 16 * 1e-4)
    (stats,) = policy.steps
    assert stats.duration_s == pytest.approx(0.02 + 16 * 1e-4)
    assert (stats.step_index, stats.num_prefill_tokens, stats.num_decode_tokens) == (3, 16, 0)
    assert (stats.used_hbm_blocks, stats.total_hbm_blocks, stats.finished_ids) == (16, 256, ("b",))
    assert policy.events[-1] == ("finished", "b")
    assert adapter.records["a"].first_token_s == adapter.clock.now_s and "b" not in adapter.records


def test_a_wall_clock_times_steps_by_their_measured_run_time() -> None:
    from superinfer.adapters.sglang.view import WallClock

    world = World(256, "priority", "python")
    policy = Scripted(lambda s: ScheduleDecision())
    adapter = make_adapter(policy, world=world)
    now = [100.0]
    adapter.clock = WallClock(lambda: now[0])
    reqs = [make_req("a", 10, first=0, slo="chat"), make_req("b", 6, first=50, slo="batch")]
    now[0] = 100.5
    arrive(adapter, [], *reqs)  # arrival at 0.5 s (its arrival hook's advance(0) counts a batch)
    assert adapter.records["a"].arrival_s == 0.5
    batch = world.prefill(reqs)
    now[0] = 101.25
    adapter.telemetry.step.add(0.625)  # what the run_batch hook measured for this batch
    scheduler = types.SimpleNamespace(token_to_kv_pool_allocator=world.allocator, waiting_queue=[])
    adapter.on_batch_result(None, scheduler, batch, None)
    (stats,) = policy.steps
    assert (stats.now_s, stats.duration_s, stats.num_prefill_tokens) == (1.25, 0.625, 16)
    assert adapter.records["a"].first_token_s == 1.25


def test_precision_is_planned_once_per_request_and_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Planner(Scripted):
        @hookimpl
        def superinfer_kv_precision(self, request: RequestView, state: StepState) -> KVPrecision:
            return KVPrecision.INT4 if request.slo.name == "batch" else KVPrecision.FP16

    world = World(256, "priority", "python")
    adapter = make_adapter(
        Planner(lambda s: ScheduleDecision(admit=tuple(r.request_id for r in s.waiting))),
        world=world,
    )
    queue: list[Any] = []
    arrive(adapter, queue, *chat_and_batch())
    with caplog.at_level(logging.INFO, logger="superinfer.sglang"):
        for _ in range(2):
            adapter.calc_priority(
                SchedulePolicy.calc_priority,
                sglang_fcfs_with_priority(world),
                queue,
                ScheduleBatch(reqs=[]),
            )
    assert adapter.stats.precision_plans == {"int4": 2, "fp16": 2}
    assert "rid=b1 class=batch plan=int4 (not applied: engine kv dtype auto)" in caplog.text
