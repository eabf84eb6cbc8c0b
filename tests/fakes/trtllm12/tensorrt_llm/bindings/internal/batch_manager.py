"""Double of the C++ ``KVCacheManager`` binding: a toy block-reuse cache.

What it models (engine notes §2.2-2.3): blocks of ``tokens_per_block`` tokens; full blocks are
stored in a radix tree keyed by their tokens and reused by later requests with the same prefix;
eviction is a prioritized LRU over unreferenced *leaf* blocks (priority 0-100, lowest first, LRU
inside a priority); a host (secondary) tier receives evicted blocks whose priority is at least the
offload threshold (30 on 1.2.1, PR #13768) and drops the others; retention priorities revert to 35
after their duration; every change is reported as the event dicts of ``KVCacheEventSerializer``.

Not modelled: partial-block reuse, beam search, cross-attention caches, variable windows.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tensorrt_llm.bindings import LlmRequestState

__all__ = ["DEFAULT_PRIORITY", "OFFLOAD_MIN_PRIORITY", "KVCacheManager", "KvCacheStats"]

DEFAULT_PRIORITY = 35
OFFLOAD_MIN_PRIORITY = 30  # the C++ default that 1.2.1's PyTorch backend applies (notes §2.2)
PRIMARY, SECONDARY = 0, 1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _block_hash(parent_hash: int | None, tokens: tuple[int, ...]) -> int:
    digest = hashlib.blake2b(repr((parent_hash, tokens)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class _Block:
    __slots__ = (
        "block_id",
        "block_hash",
        "parent",
        "children",
        "tokens",
        "ref_count",
        "priority",
        "priority_until_s",
        "last_used_s",
        "level",
        "stored",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.block_hash: int | None = None
        self.parent: _Block | None = None
        self.children: dict[tuple[int, ...], _Block] = {}
        self.tokens: tuple[int, ...] = ()
        self.ref_count = 0
        self.priority = DEFAULT_PRIORITY
        self.priority_until_s: float | None = None
        self.last_used_s = 0.0
        self.level = PRIMARY
        self.stored = False


@dataclass
class _Seq:
    blocks: list[_Block]
    num_tokens: int  # tokens whose KV has a slot


@dataclass
class KvCacheStats:
    """C++ ``KvCacheStats`` (field names: engine notes §2.1, marked [verify] there)."""

    max_num_blocks: int
    free_num_blocks: int
    used_num_blocks: int
    tokens_per_block: int
    alloc_total_blocks: int
    alloc_new_blocks: int
    reused_blocks: int
    missed_blocks: int
    cache_hit_rate: float


class KVCacheManager:
    """The C++ KV cache manager as the capacity scheduler and the Python wrapper see it.

    Args:
        max_num_blocks: blocks in the primary (GPU) pool.
        tokens_per_block: tokens per block.
        num_secondary_blocks: blocks in the host pool (0: no host tier).
        enable_block_reuse: store full blocks for reuse.
        event_buffer_max_size: events kept between reads (0: no events).
        window_size: attention window reported in events.
        clock: seconds, for LRU order and retention durations.
    """

    def __init__(
        self,
        *,
        max_num_blocks: int,
        tokens_per_block: int,
        num_secondary_blocks: int = 0,
        enable_block_reuse: bool = True,
        event_buffer_max_size: int = 0,
        window_size: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_num_blocks = max_num_blocks
        self.tokens_per_block = tokens_per_block
        self.num_secondary_blocks = num_secondary_blocks
        self.enable_block_reuse = enable_block_reuse
        self.event_buffer_max_size = event_buffer_max_size
        self.window_size = window_size
        self.clock = clock
        self._root = _Block(-1)
        self._primary: set[_Block] = set()
        self._secondary: set[_Block] = set()
        self._num_in_use = 0
        self._seqs: dict[int, _Seq] = {}
        self._next_block_id = 0
        self._next_event_id = 0
        self._iteration_events: list[dict[str, Any]] = []
        self._events: list[dict[str, Any]] = []
        self._sched_free = 0
        self._alloc_total = self._alloc_new = self._reused = self._missed = 0
        self._emit(
            {
                "type": "created",
                "num_blocks_per_cache_level": [max_num_blocks, num_secondary_blocks],
            }
        )
        self._events, self._iteration_events = self._iteration_events, []  # readable at once

    # -- events ---------------------------------------------------------------------------------

    def _emit(self, data: dict[str, Any]) -> None:
        if self.event_buffer_max_size <= 0:
            return
        self._iteration_events.append(
            {"event_id": self._next_event_id, "data": data, "window_size": self.window_size}
        )
        self._next_event_id += 1

    def flush_iteration_events(self) -> None:
        self._refresh_priorities()
        self._events.extend(self._iteration_events)
        self._iteration_events = []
        del self._events[: max(0, len(self._events) - self.event_buffer_max_size)]

    def get_latest_events(self, timeout_ms: float | None = 0) -> list[dict[str, Any]]:
        events, self._events = self._events, []
        return events

    # -- reference counting and pools -----------------------------------------------------------

    def _ref(self, b: _Block) -> None:
        if b.ref_count == 0 and b.level == PRIMARY:
            self._num_in_use += 1
        b.ref_count += 1

    def _unref(self, b: _Block) -> None:
        b.ref_count -= 1
        b.last_used_s = self.clock()
        if b.ref_count == 0:
            self._num_in_use -= 1
            if not b.stored:
                self._primary.discard(b)

    def _refresh_priorities(self) -> None:
        now = self.clock()
        for b in list(self._primary | self._secondary):
            if b.priority_until_s is not None and now >= b.priority_until_s:
                old, b.priority, b.priority_until_s = b.priority, DEFAULT_PRIORITY, None
                if old != DEFAULT_PRIORITY:
                    self._emit(
                        {
                            "type": "updated",
                            "block_hash": b.block_hash,
                            "cache_level": None,
                            "priority": {
                                "type": "event_diff",
                                "new_value": DEFAULT_PRIORITY,
                                "old_value": old,
                            },
                        }
                    )

    @staticmethod
    def _victim(candidates: list[_Block]) -> _Block:
        return min(candidates, key=lambda b: (b.priority, b.last_used_s, b.block_id))

    def _remove_subtree(self, b: _Block) -> None:
        removed: list[int] = []
        stack = [b]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            (self._primary if node.level == PRIMARY else self._secondary).discard(node)
            assert node.ref_count == 0, "evicting a referenced block"
            removed.append(node.block_hash)  # type: ignore[arg-type]
        assert b.parent is not None
        del b.parent.children[b.tokens]
        self._emit({"type": "removed", "block_hashes": removed})

    def _set_level(self, b: _Block, level: int) -> None:
        (self._primary if b.level == PRIMARY else self._secondary).discard(b)
        (self._primary if level == PRIMARY else self._secondary).add(b)
        self._emit(
            {
                "type": "updated",
                "block_hash": b.block_hash,
                "cache_level": {"type": "event_diff", "new_value": level, "old_value": b.level},
                "priority": None,
            }
        )
        b.level = level

    def _evict_primary(self) -> None:
        self._refresh_priorities()
        candidates = [
            b
            for b in self._primary
            if b.ref_count == 0
            and b.stored
            and not any(c.level == PRIMARY for c in b.children.values())
        ]
        if not candidates:
            raise RuntimeError("KV cache: no free block and nothing evictable")
        victim = self._victim(candidates)
        if self.num_secondary_blocks > 0 and victim.priority >= OFFLOAD_MIN_PRIORITY:
            if len(self._secondary) >= self.num_secondary_blocks:
                leaves = [b for b in self._secondary if not b.children]
                self._remove_subtree(self._victim(leaves))
            self._set_level(victim, SECONDARY)
        else:
            self._remove_subtree(victim)

    def _primary_slot(self) -> None:
        if len(self._primary) >= self.max_num_blocks:
            self._evict_primary()

    def _new_block(self) -> _Block:
        self._primary_slot()
        b = _Block(self._next_block_id)
        self._next_block_id += 1
        self._primary.add(b)
        self._ref(b)
        return b

    # -- the C++ API ----------------------------------------------------------------------------

    def get_num_free_blocks(self) -> int:
        return self.max_num_blocks - self._num_in_use

    def add_sequence(
        self, request_id: int, input_len: int, beam_width: int, llm_request: Any
    ) -> None:
        tpb = self.tokens_per_block
        tokens = llm_request.get_tokens(0)[:input_len]
        matched: list[_Block] = []
        if self.enable_block_reuse:
            node = self._root
            for i in range((input_len - 1) // tpb):  # at least one prompt token is computed
                child = node.children.get(tuple(tokens[i * tpb : (i + 1) * tpb]))
                if child is None:
                    break
                matched.append(child)
                node = child
        now = self.clock()
        for b in matched:
            if b.level == PRIMARY:
                self._ref(b)
        for b in matched:
            if b.level == SECONDARY:  # onboard: leave the host pool first, then take a GPU slot
                self._secondary.discard(b)
                self._primary_slot()
                self._secondary.add(b)
                self._set_level(b, PRIMARY)
                self._ref(b)
            b.last_used_s = now
        new = [self._new_block() for _ in range(_ceil_div(input_len, tpb) - len(matched))]
        self._seqs[request_id] = _Seq(matched + new, input_len)
        self._reused += len(matched)
        self._missed += len(new)
        self._alloc_new += len(new)
        self._alloc_total += len(matched) + len(new)
        if matched:
            llm_request._fake_set_prepopulated_prompt_len(len(matched) * tpb)

    def add_token(self, request_id: int) -> None:
        seq = self._seqs[request_id]
        seq.num_tokens += 1
        if seq.num_tokens > len(seq.blocks) * self.tokens_per_block:
            seq.blocks.append(self._new_block())
            self._alloc_new += 1
            self._alloc_total += 1

    def _store(self, seq: _Seq, llm_request: Any, num_full_blocks: int) -> None:
        if not self.enable_block_reuse:
            return
        tpb = self.tokens_per_block
        tokens = llm_request.get_tokens(0)
        cfg = llm_request.kv_cache_retention_config
        now = self.clock()
        parent, stored = self._root, []
        for i, b in enumerate(seq.blocks[:num_full_blocks]):
            if b.stored:
                parent = b
                continue
            key = tuple(tokens[i * tpb : (i + 1) * tpb])
            if key in parent.children:  # stored meanwhile by another request: ours stays private
                break
            b.tokens, b.parent, b.stored = key, parent, True
            b.block_hash = _block_hash(parent.block_hash, key)
            parent.children[key] = b
            priority, duration = DEFAULT_PRIORITY, None
            if cfg is not None:
                if i * tpb < llm_request.orig_prompt_len:
                    priority, duration = cfg._fake_priority_of_token(i * tpb)
                else:
                    priority, duration = cfg.decode_retention_priority, cfg.decode_duration_ms
            b.priority = priority
            b.priority_until_s = now + duration.total_seconds() if duration else None
            b.last_used_s = now
            stored.append(b)
            parent = b
        if stored:
            self._emit(
                {
                    "type": "stored",
                    "parent_hash": stored[0].parent.block_hash,  # type: ignore[union-attr]
                    "blocks": [
                        {
                            "type": "stored_block",
                            "block_hash": b.block_hash,
                            "tokens": [
                                {"type": "unique_token", "token_id": t, "token_extra_id": 0}
                                for t in b.tokens
                            ],
                            "cache_level": b.level,
                            "priority": b.priority,
                        }
                        for b in stored
                    ],
                }
            )

    def store_context_blocks(self, llm_request: Any) -> None:
        seq = self._seqs[llm_request.py_request_id]
        self._store(seq, llm_request, llm_request.prompt_len // self.tokens_per_block)

    def remove_sequence(
        self, request_id: int, llm_request: Any = None, pin_on_release: bool = False
    ) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return
        if llm_request is not None:
            self._store(seq, llm_request, seq.num_tokens // self.tokens_per_block)
        for b in seq.blocks:
            self._unref(b)

    def get_cache_block_ids(self, request_id: int) -> list[int]:
        return [b.block_id for b in self._seqs[request_id].blocks]

    def get_kv_cache_stats(self) -> KvCacheStats:
        free = self.get_num_free_blocks()
        looked_up = self._reused + self._missed
        return KvCacheStats(
            max_num_blocks=self.max_num_blocks,
            free_num_blocks=free,
            used_num_blocks=self.max_num_blocks - free,
            tokens_per_block=self.tokens_per_block,
            alloc_total_blocks=self._alloc_total,
            alloc_new_blocks=self._alloc_new,
            reused_blocks=self._reused,
            missed_blocks=self._missed,
            cache_hit_rate=self._reused / looked_up if looked_up else 0.0,
        )

    # -- what the capacity scheduler asks -------------------------------------------------------

    def get_remaining_blocks_to_completion(self, llm_request: Any) -> int:
        total = _ceil_div(
            llm_request.prompt_len + llm_request.max_new_tokens, self.tokens_per_block
        )
        seq = self._seqs.get(llm_request.py_request_id)
        return max(0, total - (len(seq.blocks) if seq else 0))

    def get_needed_blocks_one_step(self, llm_request: Any, two_steps_look_ahead: bool) -> int:
        if llm_request.state == LlmRequestState.CONTEXT_INIT:
            if llm_request.is_first_context_chunk:
                return _ceil_div(llm_request.prompt_len, self.tokens_per_block)
            return 0
        seq = self._seqs.get(llm_request.py_request_id)
        if seq is None:
            return 0
        ahead = 2 if two_steps_look_ahead else 1
        return max(0, _ceil_div(seq.num_tokens + ahead, self.tokens_per_block) - len(seq.blocks))

    def start_scheduling(self) -> None:
        self._sched_free = self.get_num_free_blocks()

    def scheduling_remove_sequence(self, request_id: int) -> None:
        seq = self._seqs.get(request_id)
        if seq is not None:
            self._sched_free += sum(1 for b in seq.blocks if b.ref_count == 1)

    def get_scheduling_num_free_blocks(self) -> int:
        return self._sched_free

    # -- double-only ----------------------------------------------------------------------------

    def _fake_check_invariants(self) -> None:
        """Raise ``AssertionError`` unless pools, reference counts and the tree agree."""
        assert len(self._primary) <= self.max_num_blocks, (len(self._primary), self.max_num_blocks)
        assert len(self._secondary) <= self.num_secondary_blocks
        refs: dict[int, int] = {}
        for seq in self._seqs.values():
            for b in seq.blocks:
                refs[id(b)] = refs.get(id(b), 0) + 1
                assert b.level == PRIMARY and b in self._primary
        for b in self._primary | self._secondary:
            assert b.ref_count == refs.get(id(b), 0), "reference count drift"
            if b.parent is not None and b.parent is not self._root:
                assert b.parent.level <= b.level, "a GPU block under a host block"
        assert self._num_in_use == sum(1 for b in self._primary if b.ref_count > 0)

    def _fake_cached_blocks(self) -> list[tuple[int, int, int]]:
        """Stored blocks as ``(block_hash, level, priority)``, sorted."""
        return sorted(
            (b.block_hash, b.level, b.priority) for b in self._primary | self._secondary if b.stored
        )  # type: ignore[misc]
