"""LlmRequest and iteration stats to views (exact)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from superinfer.adapters.trtllm.engine import RequestStates, UnsupportedEngineError
from superinfer.adapters.trtllm.view import front_end_view, iteration_step_stats, llm_request_view
from superinfer.policy_core.types import KVLocation, RequestView, StepStats
from tests.adapters.trtllm.helpers import CHAT

pytestmark = pytest.mark.usefixtures("trtllm12")


def _view(req: Any, reserve: bool) -> RequestView:
    from tensorrt_llm._torch.pyexecutor.llm_request import LlmRequestState

    return llm_request_view(
        req,
        request_id="7",
        states=RequestStates.from_enum(LlmRequestState),
        slo=CHAT,
        arrival_s=1.5,
        tokens_per_block=8,
        reserve_to_completion=reserve,
    )


def _request() -> Any:
    from tensorrt_llm._torch.pyexecutor.llm_request import LlmRequest

    return LlmRequest(7, 6, list(range(20)), client_id=3)


def test_a_new_request_is_waiting_with_no_kv(trtllm12: ModuleType) -> None:
    view = _view(_request(), reserve=True)
    assert (view.prompt_tokens, view.max_output_tokens, view.arrival_s) == (20, 6, 1.5)
    assert (view.computed_tokens, view.generated_tokens, view.kv_blocks) == (0, 0, 0)
    assert view.kv_location is KVLocation.UNALLOCATED and view.pending_tokens == 20


@pytest.mark.parametrize(("reserve", "blocks"), [(True, 4), (False, 3)])
def test_a_request_mid_prefill_holds_its_prompt_or_its_reservation(
    reserve: bool, blocks: int
) -> None:
    req = _request()
    req.context_current_position = 8
    view = _view(req, reserve)
    # reservation: ceil((20 + 6) / 8) = 4 blocks; allocated: the prompt's ceil(20 / 8) = 3
    assert (view.computed_tokens, view.pending_tokens, view.kv_blocks) == (8, 12, blocks)
    assert view.kv_location is KVLocation.HBM


@pytest.mark.parametrize(("reserve", "blocks"), [(True, 4), (False, 3)])
def test_a_decoding_request_has_all_but_its_last_token_computed(reserve: bool, blocks: int) -> None:
    from tensorrt_llm._torch.pyexecutor.llm_request import LlmRequestState

    req = _request()
    req.context_current_position = 20
    req.state = LlmRequestState.GENERATION_IN_PROGRESS
    for t in (1, 2, 3):
        req.add_new_token(t)
    view = _view(req, reserve)
    assert (view.computed_tokens, view.generated_tokens, view.pending_tokens) == (22, 3, 1)
    assert view.kv_blocks == blocks  # allocated: ceil(22 / 8) = 3


def test_a_paused_request_waits_to_recompute_prompt_and_output() -> None:
    from tensorrt_llm._torch.pyexecutor.llm_request import LlmRequestState

    req = _request()
    req.context_current_position = 20
    req.state = LlmRequestState.GENERATION_IN_PROGRESS
    for t in (1, 2, 3):
        req.add_new_token(t)
    req.pause(max_input_len=1000)
    view = _view(req, reserve=True)
    assert (req.prompt_len, req.max_new_tokens) == (23, 3)
    assert (view.prompt_tokens, view.generated_tokens, view.computed_tokens) == (20, 3, 0)
    assert (view.pending_tokens, view.kv_blocks, view.max_output_tokens) == (23, 0, 6)


def test_front_end_views_follow_the_stream() -> None:
    common: dict[str, Any] = {
        "request_id": "a",
        "arrival_s": 0.0,
        "prompt_tokens": 20,
        "max_output_tokens": 6,
        "slo": CHAT,
        "tokens_per_block": 8,
        "reserve_to_completion": True,
    }
    held = front_end_view(in_flight=False, generated_tokens=0, prefix_hit_tokens=16, **common)
    assert (held.kv_blocks, held.pending_tokens, held.prefix_hit_tokens) == (0, 20, 16)
    prefilling = front_end_view(in_flight=True, generated_tokens=0, **common)
    assert (prefilling.computed_tokens, prefilling.kv_blocks) == (0, 4)
    decoding = front_end_view(in_flight=True, generated_tokens=2, **common)
    assert (decoding.computed_tokens, decoding.pending_tokens) == (21, 1)
    common["reserve_to_completion"] = False
    assert front_end_view(in_flight=True, generated_tokens=9, **common).kv_blocks == 4  # 28 / 8


STATS = {
    "iter": 12,
    "iterLatencyMS": 25.0,
    "numQueuedRequests": 2,
    "inflightBatchingStats": {"numScheduledRequests": 5, "numCtxTokens": 300, "numGenRequests": 4},
    "kvCacheStats": {"usedNumBlocks": 40, "maxNumBlocks": 100},
}


def test_iteration_stats_become_step_stats() -> None:
    assert iteration_step_stats(STATS, now_s=9.0, num_held=3) == StepStats(
        now_s=9.0,
        step_index=12,
        duration_s=0.025,
        num_steps=1,
        num_prefill_tokens=300,
        num_decode_tokens=4,
        num_running=5,
        num_waiting=5,
        used_hbm_blocks=40,
        total_hbm_blocks=100,
    )


def test_missing_iteration_stats_keys_are_named() -> None:
    broken = {k: v for k, v in STATS.items() if k != "kvCacheStats"}
    with pytest.raises(UnsupportedEngineError, match="lack 'kvCacheStats.usedNumBlocks'"):
        iteration_step_stats(broken, now_s=0.0, num_held=0)
