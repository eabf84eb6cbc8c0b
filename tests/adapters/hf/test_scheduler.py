"""Contract of :class:`PolicyScheduler` against the real transformers continuous-batching classes.

A real ``PagedAttentionCache`` (tiny Llama config: 2 layers, pages of 4 tokens, 8 blocks; no
weights) and real ``RequestState`` objects; the engine's step is emulated exactly as
``ContinuousBatchProcessor.prepare_batch_tensors`` / ``update_batch`` change a request (the
position advances by the query length, then a token is sampled when the step completes the
pending tokens). Decisions come from a recording plugin, so every view and every engine change
is checked exactly.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.adapters.hf.conftest import required

if not required():  # under `make test` (conftest.required) a missing transformers fails
    pytest.importorskip("transformers", reason="transformers missing: run `make install-hf`")

import torch
from transformers import LlamaConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.generation.continuous_batching.distributed import DistributedHelper
from transformers.generation.continuous_batching.requests import (
    FutureRequestState,
    RequestState,
    RequestStatus,
)
from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING

from superinfer.adapters.hf.apply import Piece
from superinfer.adapters.hf.plugin import EngineBinding, PolicyScheduler, install
from superinfer.adapters.hf.view import TrackedRequest
from superinfer.adapters.hookspecs import hookimpl
from superinfer.adapters.manager import build_plugin_manager
from superinfer.policy_core.types import (
    SLO,
    KVLocation,
    PreemptMode,
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)
from superinfer.policy_core.validation import PolicyError

CHAT = SLO("chat", ttft_ms=1000.0, tpot_ms=100.0)
BATCH = SLO("batch", deadline_s=600.0, priority=1)


class Recorder:
    """A plugin that answers with scripted decisions and records every hook call."""

    def __init__(self, *decisions: ScheduleDecision) -> None:
        self.decisions = list(decisions)
        self.states: list[StepState] = []
        self.events: list[tuple[Any, ...]] = []
        self.stats: list[StepStats] = []

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        self.states.append(state)
        return self.decisions.pop(0)

    @hookimpl
    def superinfer_request_arrived(self, request: RequestView, now_s: float) -> None:
        self.events.append(("arrived", request.request_id))

    @hookimpl
    def superinfer_request_finished(self, request: RequestView, now_s: float) -> None:
        self.events.append(("finished", request.request_id, request.generated_tokens))

    @hookimpl
    def superinfer_request_aborted(self, request: RequestView, now_s: float, reason: str) -> None:
        self.events.append(("aborted", request.request_id, reason))

    @hookimpl
    def superinfer_step_finished(self, stats: StepStats) -> None:
        self.stats.append(stats)


def make_scheduler(recorder: Recorder) -> tuple[PolicyScheduler, EngineBinding]:
    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=100,
        max_position_embeddings=256,
    )
    cb = ContinuousBatchingConfig(
        page_size=4,
        num_blocks=8,
        max_batch_tokens=16,
        max_requests_per_batch=4,
        allow_block_sharing=False,
        use_async_batching=False,
        max_blocks_per_request=0,
        max_memory_percent=0.9,
    )
    cache = PagedAttentionCache(
        config, cb, torch.device("cpu"), DistributedHelper(None, None), dtype=torch.float32
    )
    scheduler = PolicyScheduler(cache, None, 4)
    ticks = iter(range(1000))
    binding = EngineBinding(
        hook=build_plugin_manager(recorder).hook,
        clock=lambda: float(next(ticks)),
        tracked={},
        max_model_len_tokens=256,
    )
    scheduler.bind(binding)
    return scheduler, binding


def arrive(
    scheduler: PolicyScheduler,
    binding: EngineBinding,
    rid: str,
    prompt: int,
    output: int,
    slo: SLO = CHAT,
) -> None:
    binding.tracked[rid] = TrackedRequest(rid, 0.0, prompt, output, slo)
    state = RequestState(rid, list(range(1, prompt + 1)), max_new_tokens=output, eos_token_id=-1)
    scheduler.add_waiting_request(state)


def run_step(scheduler: PolicyScheduler, batch: list[FutureRequestState]) -> None:
    """What the engine does to the batch between two scheduling calls."""
    for future in batch:
        state = future.state
        state.position_offset += future.query_length
        if future.has_new_token and state.update_and_check_completion(7, None):
            scheduler.finish_request(state.request_id)


def test_install_registers_the_scheduler_under_its_name() -> None:
    install()
    install()  # idempotent
    assert SCHEDULER_MAPPING["superinfer"] is PolicyScheduler


def test_views_and_batches_follow_the_policy_through_prefill_and_decode() -> None:
    rec = Recorder(
        ScheduleDecision(num_tokens={"r1": 6}, admit=("r1",)),
        ScheduleDecision(num_tokens={"r1": 4}),
        ScheduleDecision(num_tokens={"r1": 1}),
    )
    scheduler, binding = make_scheduler(rec)
    arrive(scheduler, binding, "r1", prompt=10, output=5)
    assert rec.events == [("arrived", "r1")]

    batch, fast, q, kv = scheduler.schedule_batch(16, 32)
    first = rec.states[0]
    assert first.waiting == (RequestView("r1", 0.0, 10, 5, CHAT),)
    assert (
        first.free_hbm_blocks,
        first.total_hbm_blocks,
        first.block_size_tokens,
        first.token_budget,
        first.max_num_seqs,
        first.kv_block_bytes,
    ) == (8, 8, 4, 16, 4, 2048)
    assert [(f.state.request_id, f.query_length, f.has_new_token) for f in batch] == [
        ("r1", 6, False)
    ]
    assert (fast, q, kv) == (False, 6, 0)
    assert batch[0].state.status == RequestStatus.PREFILLING

    run_step(scheduler, batch)
    batch, _, q, kv = scheduler.schedule_batch(16, 32)
    view = rec.states[1].running[0]
    assert (view.computed_tokens, view.pending_tokens, view.kv_blocks) == (6, 4, 2)
    assert view.kv_location is KVLocation.HBM
    assert [(f.query_length, f.has_new_token) for f in batch] == [(4, True)]
    assert (q, kv) == (4, 6)

    run_step(scheduler, batch)
    batch, _, q, kv = scheduler.schedule_batch(16, 32)
    view = rec.states[2].running[0]
    assert (view.generated_tokens, view.computed_tokens, view.pending_tokens) == (1, 10, 1)
    assert (view.kv_blocks, view.first_token_s) == (3, rec.stats[1].now_s)
    assert rec.states[2].free_hbm_blocks == 5
    assert [(f.query_length, f.has_new_token) for f in batch] == [(1, True)]

    assert [s.pieces for s in binding.steps] == [
        (Piece("r1", 0, 6, False, False),),
        (Piece("r1", 6, 4, True, False),),
    ]
    assert [(s.num_prefill_tokens, s.num_decode_tokens, s.num_running) for s in rec.stats] == [
        (6, 0, 1),
        (4, 0, 1),
    ]
    assert binding.peak_blocks == 3 and binding.peak_class_blocks == {"chat": 3}


def test_recompute_preemption_requeues_the_request_at_the_head_with_its_output() -> None:
    rec = Recorder(
        ScheduleDecision(num_tokens={"r1": 10}, admit=("r1",)),
        ScheduleDecision(
            num_tokens={"r2": 3}, admit=("r2",), preempt={"r1": PreemptMode.RECOMPUTE}
        ),
        ScheduleDecision(num_tokens={"r1": 11, "r2": 1}, admit=("r1",)),
    )
    scheduler, binding = make_scheduler(rec)
    arrive(scheduler, binding, "r1", prompt=10, output=5)
    batch, *_ = scheduler.schedule_batch(16, 32)
    run_step(scheduler, batch)  # r1: prompt done, first token sampled
    arrive(scheduler, binding, "r2", prompt=3, output=2, slo=BATCH)

    batch, *_ = scheduler.schedule_batch(16, 32)
    assert [f.state.request_id for f in batch] == ["r2"]
    assert list(scheduler.waiting_requests_order) == ["r1"]
    assert binding.tracked["r1"].num_preemptions == 1
    run_step(scheduler, batch)

    batch, *_ = scheduler.schedule_batch(16, 32)
    view = rec.states[2].waiting[0]
    assert (view.generated_tokens, view.computed_tokens, view.pending_tokens) == (1, 0, 11)
    assert (view.kv_blocks, view.num_preemptions) == (0, 1)
    assert rec.states[2].free_hbm_blocks == 7  # only r2's block is held
    assert [(f.state.request_id, f.query_length, f.has_new_token) for f in batch] == [
        ("r1", 11, True),
        ("r2", 1, True),
    ]
    run_step(scheduler, batch)  # r2 reaches its 2 tokens and finishes
    r1 = scheduler.active_requests["r1"]
    assert r1.to_generation_output().generated_tokens == [7, 7]
    assert ("finished", "r2", 2) in rec.events
    assert "r2" not in scheduler.active_requests


def test_rejections_at_arrival_and_by_the_policy_end_the_request_with_a_reason() -> None:
    rec = Recorder(ScheduleDecision(reject={"r3": "load_shedding"}))
    scheduler, binding = make_scheduler(rec)
    arrive(scheduler, binding, "r2", prompt=30, output=5)  # 35 tokens > 8 blocks x 4
    arrive(scheduler, binding, "r4", prompt=200, output=100)  # > max_model_len 256
    arrive(scheduler, binding, "r3", prompt=4, output=2)
    batch, _, q, kv = scheduler.schedule_batch(16, 32)
    assert (batch, q, kv) == ([], 0, 0)
    assert {rid: e[:2] for rid, e in binding.ended.items()} == {
        "r2": ("rejected", "exceeds_kv_capacity"),
        "r4": ("rejected", "exceeds_max_model_len"),
        "r3": ("rejected", "load_shedding"),
    }
    assert [e for e in rec.events if e[0] == "aborted"] == [
        ("aborted", "r2", "exceeds_kv_capacity"),
        ("aborted", "r4", "exceeds_max_model_len"),
        ("aborted", "r3", "load_shedding"),
    ]
    assert not scheduler.waiting_requests and not scheduler.waiting_requests_order


def test_an_inapplicable_decision_raises_and_is_kept_for_the_session() -> None:
    rec = Recorder(ScheduleDecision(num_tokens={"r1": 11}, admit=("r1",)))
    scheduler, binding = make_scheduler(rec)
    arrive(scheduler, binding, "r1", prompt=10, output=5)
    with pytest.raises(PolicyError, match="11 tokens exceed its 10 pending"):
        scheduler.schedule_batch(16, 32)
    assert isinstance(binding.error, PolicyError)
    assert list(scheduler.waiting_requests) == ["r1"]  # nothing was applied


def test_bind_refuses_a_cache_that_shares_prefix_blocks() -> None:
    scheduler, binding = make_scheduler(Recorder())
    scheduler.cache.use_prefix_sharing = True
    with pytest.raises(ValueError, match="allow_block_sharing=False"):
        scheduler.bind(binding)
