"""The TensorRT-LLM 1.2 double itself: request states, the reference capacity schedulers, and the
toy block-reuse cache (prioritized LRU, leaf-only eviction, host tier, retention, events)."""

from __future__ import annotations

from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.usefixtures("trtllm12")


def _request(rid: int, prompt: list[int], max_new: int = 4, retention: Any = None) -> Any:
    from tensorrt_llm._torch.pyexecutor.llm_request import LlmRequest

    return LlmRequest(rid, max_new, prompt, client_id=rid, kv_cache_retention_config=retention)


def _retention(priority: int, end: int, duration_s: float | None = None) -> Any:
    from tensorrt_llm.llmapi import KvCacheRetentionConfig

    duration = None if duration_s is None else timedelta(seconds=duration_s)
    rng = KvCacheRetentionConfig.TokenRangeRetentionConfig(0, end, priority, duration)
    return KvCacheRetentionConfig([rng], 35)


def _kv(clock: Any, blocks: int = 3, host: int = 1, tpb: int = 2) -> Any:
    from tensorrt_llm.bindings.internal.batch_manager import KVCacheManager

    return KVCacheManager(
        max_num_blocks=blocks,
        tokens_per_block=tpb,
        num_secondary_blocks=host,
        event_buffer_max_size=1000,
        clock=clock,
    )


def _cache(kv: Any, rid: int, prompt: list[int], retention: Any = None) -> Any:
    """Run a request's context, store its blocks and release it (they stay cached)."""
    req = _request(rid, prompt, retention=retention)
    kv.add_sequence(rid, len(prompt), 1, req)
    kv.store_context_blocks(req)
    kv.remove_sequence(rid, req)
    return req


def _events(kv: Any) -> list[dict[str, Any]]:
    kv.flush_iteration_events()
    return [e["data"] for e in kv.get_latest_events()]


def test_request_states_carry_the_12_values(trtllm12: ModuleType) -> None:
    from tensorrt_llm._torch.pyexecutor.llm_request import LlmRequestState as S

    assert (S.CONTEXT_INIT, S.GENERATION_IN_PROGRESS, S.GENERATION_TO_COMPLETE) == (10, 13, 14)
    assert (S.GENERATION_COMPLETE, S.DISAGG_GENERATION_INIT, S.DISAGG_TRANS_ERROR) == (20, 8, -1)


def test_guaranteed_no_evict_reserves_to_completion_and_blocks_head_of_line() -> None:
    from tensorrt_llm._fake import FakeClock
    from tensorrt_llm._torch.pyexecutor.llm_request import LlmRequestState
    from tensorrt_llm._torch.pyexecutor.scheduler import GuaranteedNoEvictScheduler

    kv = _kv(FakeClock(), blocks=10, host=0, tpb=4)
    running = _request(1, list(range(8)), max_new=8)  # 4 blocks to completion, 2 allocated
    kv.add_sequence(1, 8, 1, running)
    running.context_current_position = 8
    running.state = LlmRequestState.GENERATION_IN_PROGRESS
    running.add_new_token(99)
    small = _request(2, list(range(100, 104)), max_new=4)  # 2 blocks
    big = _request(3, list(range(200, 216)), max_new=8)  # 6 blocks
    huge = _request(4, list(range(300, 332)), max_new=8)  # 10 blocks
    scheduler = GuaranteedNoEvictScheduler(8, kv)

    def fitting(order: list[Any]) -> list[int]:
        fit, disagg, paused = scheduler.schedule_request(order)
        assert disagg == [] and paused == []
        return [r.request_id for r in fit]

    # 10 free blocks - 2 still reserved for the running request = 6 for new ones
    assert fitting([running, small, big]) == [1, 2]  # 2 <= 6, then 6 > 4 stops
    assert fitting([running, big, small]) == [1, 3]  # 6 <= 6, then 2 > 0 stops
    assert fitting([running, huge, small]) == [1], "the first misfit blocks the rest"


def test_max_utilization_pauses_the_last_started_request_and_retries() -> None:
    from tensorrt_llm._fake import FakeClock
    from tensorrt_llm._torch.pyexecutor.llm_request import LlmRequestState
    from tensorrt_llm.bindings.internal.algorithms import CapacityScheduler
    from tensorrt_llm.llmapi import CapacitySchedulerPolicy

    kv = _kv(FakeClock(), blocks=7, host=0, tpb=4)
    reqs = []
    for rid in (1, 2, 3):  # 8 prompt tokens in 2 blocks; the first decode step needs a 3rd
        req = _request(rid, list(range(rid * 10, rid * 10 + 8)), max_new=8)
        kv.add_sequence(rid, 8, 1, req)
        req.context_current_position = 8
        req.state = LlmRequestState.GENERATION_IN_PROGRESS
        req.add_new_token(7)
        reqs.append(req)
    assert kv.get_num_free_blocks() == 1
    scheduler = CapacityScheduler(8, CapacitySchedulerPolicy.MAX_UTILIZATION, True)
    fitting, _, paused = scheduler(reqs, kv)
    # 1 fits in the free block; 2 does not, so 3 (last started) is paused, its 2 blocks are
    # credited, and 2 fits on the retry
    assert [r.request_id for r in fitting] == [1, 2]
    assert [r.request_id for r in paused] == [3]
    assert kv.get_num_free_blocks() == 1, "a dry run of the capacity scheduler frees nothing"


def test_prioritized_lru_drops_below_the_threshold_and_offloads_above() -> None:
    from tensorrt_llm._fake import FakeClock

    clock = FakeClock()
    kv = _kv(clock, blocks=3, host=1, tpb=2)
    hashes = {}
    for rid, (prompt, priority) in enumerate([([1, 2], 80), ([3, 4], 10), ([5, 6], 50)], start=1):
        _cache(kv, rid, prompt, _retention(priority, 2))
        clock.advance(1.0)
        (stored,) = [e for e in _events(kv) if e["type"] == "stored"]
        hashes[prompt[0]] = stored["blocks"][0]["block_hash"]
        assert stored["blocks"][0]["priority"] == priority
    assert kv.get_num_free_blocks() == 3, "cached blocks count as free"
    _cache(kv, 4, [7, 8])  # needs a block: priority 10 is lowest and below 30 -> dropped
    assert _events(kv)[0] == {"type": "removed", "block_hashes": [hashes[3]]}
    clock.advance(1.0)
    _cache(kv, 5, [9, 10])  # next lowest is 35 ([7, 8], default) -> offloaded to the host
    first = _events(kv)[0]
    assert first["type"] == "updated" and first["priority"] is None
    assert first["cache_level"] == {"type": "event_diff", "new_value": 1, "old_value": 0}
    assert sorted(p for _, level, p in kv._fake_cached_blocks() if level == 0) == [35, 50, 80]
    kv._fake_check_invariants()


def test_only_leaves_are_evicted_and_a_dropped_block_takes_its_host_subtree() -> None:
    from tensorrt_llm._fake import FakeClock

    clock = FakeClock()
    kv = _kv(clock, blocks=3, host=2, tpb=2)
    from tensorrt_llm.llmapi import KvCacheRetentionConfig

    chain = KvCacheRetentionConfig(
        [
            KvCacheRetentionConfig.TokenRangeRetentionConfig(0, 2, 10),  # parent x: 10
            KvCacheRetentionConfig.TokenRangeRetentionConfig(2, 4, 60),  # child y: 60
        ]
    )
    _cache(kv, 1, [1, 2, 3, 4], chain)
    clock.advance(1.0)
    _cache(kv, 2, [5, 6], _retention(40, 2))  # z: 40
    stored = [e for e in _events(kv) if e["type"] == "stored"]
    x, y = (b["block_hash"] for b in stored[0]["blocks"])
    z = stored[1]["blocks"][0]["block_hash"]
    _cache(kv, 3, [7, 8, 9, 10])  # two new blocks: x (10) is not a leaf, so z (40) then y (60)
    moved = [
        (e["block_hash"], e["cache_level"]["new_value"])
        for e in _events(kv)
        if e["type"] == "updated"
    ]
    assert moved == [(z, 1), (y, 1)]
    _cache(kv, 4, [11, 12])  # x is a GPU leaf now (child on the host): priority 10 -> dropped
    removed = [e for e in _events(kv) if e["type"] == "removed"]
    assert removed == [{"type": "removed", "block_hashes": [x, y]}]
    kv._fake_check_invariants()


def test_reuse_onboards_host_blocks_and_skips_cached_tokens() -> None:
    from tensorrt_llm._fake import FakeClock

    clock = FakeClock()
    kv = _kv(clock, blocks=2, host=2, tpb=2)
    _cache(kv, 1, [1, 2])
    clock.advance(1.0)
    _cache(kv, 2, [3, 4])
    clock.advance(1.0)
    _cache(kv, 3, [5, 6])  # evicts [1, 2] (LRU at 35) to the host
    _events(kv)
    req = _request(4, [1, 2, 9])
    req.context_chunk_size = 3
    kv.add_sequence(4, 3, 1, req)
    assert (req.context_current_position, req.context_chunk_size) == (2, 1)
    onboard = [e for e in _events(kv) if e["type"] == "updated"]
    # [3, 4] leaves for the host, [1, 2] comes back, [5, 6] leaves to make room for [9]
    assert [e["cache_level"]["new_value"] for e in onboard] == [1, 0, 1]
    assert kv.get_kv_cache_stats().reused_blocks == 1
    kv._fake_check_invariants()


def test_retention_priority_reverts_to_35_after_its_duration() -> None:
    from tensorrt_llm._fake import FakeClock

    clock = FakeClock()
    kv = _kv(clock, blocks=3, host=0, tpb=2)
    _cache(kv, 1, [1, 2], _retention(90, 2, duration_s=5.0))
    (stored,) = [e for e in _events(kv) if e["type"] == "stored"]
    block = stored["blocks"][0]["block_hash"]
    clock.advance(4.9)
    assert _events(kv) == []
    clock.advance(0.2)
    assert _events(kv) == [
        {
            "type": "updated",
            "block_hash": block,
            "cache_level": None,
            "priority": {"type": "event_diff", "new_value": 35, "old_value": 90},
        }
    ]


def test_stored_events_follow_the_serializer_schema() -> None:
    from tensorrt_llm._fake import FakeClock

    kv = _kv(FakeClock(), blocks=4, host=0, tpb=2)
    _cache(kv, 1, [5, 6, 7, 8, 9])
    created, stored = _events(kv)
    assert created == {"type": "created", "num_blocks_per_cache_level": [4, 0]}
    first, second = stored["blocks"]
    assert stored["parent_hash"] is None
    assert first["tokens"] == [
        {"type": "unique_token", "token_id": 5, "token_extra_id": 0},
        {"type": "unique_token", "token_id": 6, "token_extra_id": 0},
    ]
    assert (first["type"], first["cache_level"], first["priority"]) == ("stored_block", 0, 35)
    assert [t["token_id"] for t in second["tokens"]] == [7, 8]


def test_retention_config_validates_like_the_cpp_class() -> None:
    from tensorrt_llm.llmapi import KvCacheRetentionConfig as Config

    rng = Config.TokenRangeRetentionConfig
    with pytest.raises(ValueError, match="overlap"):
        Config([rng(0, 4, 50), rng(2, 6, 50)])
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        rng(0, 4, 101)
    with pytest.raises(TypeError, match="timedelta"):
        rng(0, 4, 50, 1000)  # type: ignore[arg-type]
