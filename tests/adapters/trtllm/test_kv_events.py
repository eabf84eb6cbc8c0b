"""The prefix table rebuilt from KV cache events (schema of notes §2.3)."""

from __future__ import annotations

from typing import Any

import pytest

from superinfer.adapters.trtllm.engine import UnsupportedEngineError
from superinfer.adapters.trtllm.kv_events import PrefixCacheTable
from superinfer.policy_core.types import KVLocation, PrefixNodeView


def _stored(parent: int | None, *blocks: tuple[int, list[int], int]) -> dict[str, Any]:
    return {
        "event_id": 0,
        "window_size": 4096,
        "data": {
            "type": "stored",
            "parent_hash": parent,
            "blocks": [
                {
                    "type": "stored_block",
                    "block_hash": h,
                    "tokens": [
                        {"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens
                    ],
                    "cache_level": 0,
                    "priority": priority,
                }
                for h, tokens, priority in blocks
            ],
        },
    }


def _event(data: dict[str, Any]) -> dict[str, Any]:
    return {"event_id": 0, "window_size": 4096, "data": data}


def _table() -> PrefixCacheTable:
    table = PrefixCacheTable(tokens_per_block=2)
    table.apply(
        [
            _event({"type": "created", "num_blocks_per_cache_level": [10, 4]}),
            _stored(None, (11, [1, 2], 35), (12, [3, 4], 90)),
            _stored(11, (13, [5, 6], 35)),
        ],
        now_s=1.0,
    )
    return table


def test_stored_chains_index_prompts_by_tokens() -> None:
    table = _table()
    assert table.blocks_per_level == (10, 4)
    assert table.match([1, 2, 3, 4, 9]) == ["11", "12"]
    assert table.match([1, 2, 5, 6, 7, 8]) == ["11", "13"]
    assert table.match([1, 3]) == [] and table.match([1]) == []
    assert table.view("12") == PrefixNodeView("12", "11", 2, 1, KVLocation.HBM, 0, 1.0, False)
    assert table.priority("12") == 90


def test_updates_move_blocks_and_change_priorities_removals_unindex() -> None:
    table = _table()
    table.apply(
        [
            _event(
                {
                    "type": "updated",
                    "block_hash": 12,
                    "priority": None,
                    "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0},
                }
            ),
            _event(
                {
                    "type": "updated",
                    "block_hash": 13,
                    "cache_level": None,
                    "priority": {"type": "event_diff", "new_value": 35, "old_value": 90},
                }
            ),
            _event({"type": "updated", "block_hash": 777, "cache_level": None, "priority": None}),
        ],
        now_s=2.0,
    )
    assert table.view("12").location is KVLocation.CPU
    assert table.count(KVLocation.CPU) == 1
    table.apply([_event({"type": "removed", "block_hashes": [12, 13]})], now_s=3.0)
    assert "12" not in table and len(table) == 1
    assert table.match([1, 2, 3, 4]) == ["11"]


def test_hits_and_use_are_recorded_by_the_front_end() -> None:
    table = _table()
    path = table.match([1, 2, 3, 4])
    table.touch(path, now_s=5.0)
    table.acquire(path)
    view = table.view("11")
    assert (view.hit_count, view.last_access_s, view.in_use) == (1, 5.0, True)
    table.release(path)
    assert not table.view("11").in_use


def test_unknown_events_are_refused_by_name() -> None:
    with pytest.raises(UnsupportedEngineError, match="unknown KV cache event type 'moved'"):
        PrefixCacheTable(2).apply([_event({"type": "moved"})], now_s=0.0)
    with pytest.raises(UnsupportedEngineError, match="'removed' lacks 'block_hashes'"):
        PrefixCacheTable(2).apply([_event({"type": "removed"})], now_s=0.0)
