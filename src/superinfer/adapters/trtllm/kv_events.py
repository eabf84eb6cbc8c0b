"""The engine's block-reuse cache, rebuilt from its KV cache events, as prefix nodes.

TensorRT-LLM 1.2 reports every change to its reusable blocks through ``LLM.get_kv_cache_events``
(enabled by ``KvCacheConfig(event_buffer_max_size > 0)``; schema of
``tensorrt_llm/_utils.py KVCacheEventSerializer``, engine notes §2.3):

- ``created``: pool sizes per cache level (0 = GPU, 1 = host);
- ``stored``: a chain of full blocks under ``parent_hash``, with their tokens, level and priority;
- ``removed``: blocks evicted for good;
- ``updated``: a block moved between GPU and host, or its priority changed.

The table keeps one :class:`~superinfer.policy_core.types.PrefixNodeView` per stored block and an
index by ``(parent, tokens)`` so the front end can tell how much of a new prompt the cache holds.
Events carry no hits, so the front end records one when it admits a request whose prompt matches
(:meth:`PrefixCacheTable.touch`). Block hashes also cover LoRA ids and cache salts, which the token
index does not: prompts that differ only in those match the same nodes here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from superinfer.adapters.trtllm.engine import UnsupportedEngineError
from superinfer.policy_core.types import KVLocation, PrefixNodeView

__all__ = ["PrefixCacheTable"]

_LEVELS = {0: KVLocation.HBM, 1: KVLocation.CPU}


@dataclass(slots=True)
class _Node:
    node_id: str
    parent_id: str | None
    tokens: tuple[int, ...]
    location: KVLocation
    priority: int
    hit_count: int
    last_access_s: float
    in_use: int = 0


def _get(data: Mapping[str, Any], key: str, kind: str) -> Any:
    if key not in data:
        raise UnsupportedEngineError(f"KV cache event {kind!r} lacks {key!r}")
    return data[key]


class PrefixCacheTable:
    """Stored blocks of one engine, fed by its KV cache events.

    Args:
        tokens_per_block: the engine's KV block size.
    """

    def __init__(self, tokens_per_block: int) -> None:
        self.tokens_per_block = tokens_per_block
        self.blocks_per_level: tuple[int, ...] = ()
        self.num_events = 0
        self._nodes: dict[str, _Node] = {}
        self._index: dict[tuple[str | None, tuple[int, ...]], str] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def apply(self, events: Iterable[Mapping[str, Any]], now_s: float) -> None:
        """Fold events (``get_kv_cache_events`` dicts, oldest first) into the table.

        Raises:
            UnsupportedEngineError: an event of an unknown type or shape, naming it.
        """
        for event in events:
            data = _get(event, "data", "event")
            kind = _get(data, "type", "event")
            handler = getattr(self, f"_on_{kind}", None)
            if handler is None:
                raise UnsupportedEngineError(f"unknown KV cache event type {kind!r}")
            handler(data, now_s)
            self.num_events += 1

    def _on_created(self, data: Mapping[str, Any], now_s: float) -> None:
        self.blocks_per_level = tuple(_get(data, "num_blocks_per_cache_level", "created"))

    def _on_stored(self, data: Mapping[str, Any], now_s: float) -> None:
        parent = _get(data, "parent_hash", "stored")
        parent_id = None if parent is None else str(parent)
        for block in _get(data, "blocks", "stored"):
            node_id = str(_get(block, "block_hash", "stored"))
            tokens = tuple(int(t["token_id"]) for t in _get(block, "tokens", "stored"))
            node = self._nodes.get(node_id)
            if node is None:
                node = _Node(node_id, parent_id, tokens, KVLocation.HBM, 0, 0, now_s)
                self._nodes[node_id] = node
                self._index[(parent_id, tokens)] = node_id
            node.location = _LEVELS.get(int(block.get("cache_level", 0)), KVLocation.HBM)
            node.priority = int(block.get("priority", 0))
            node.last_access_s = now_s
            parent_id = node_id

    def _on_removed(self, data: Mapping[str, Any], now_s: float) -> None:
        for block_hash in _get(data, "block_hashes", "removed"):
            node = self._nodes.pop(str(block_hash), None)
            if node is not None:
                self._index.pop((node.parent_id, node.tokens), None)

    def _on_updated(self, data: Mapping[str, Any], now_s: float) -> None:
        node = self._nodes.get(str(_get(data, "block_hash", "updated")))
        if node is None:
            return  # stored before we started reading events
        level = data.get("cache_level")
        if level is not None:
            node.location = _LEVELS.get(int(level["new_value"]), KVLocation.HBM)
        priority = data.get("priority")
        if priority is not None:
            node.priority = int(priority["new_value"])

    # -- what the front end asks ----------------------------------------------------------------

    def match(self, prompt_token_ids: Sequence[int]) -> list[str]:
        """Ids of the stored blocks that hold a prefix of ``prompt_token_ids``, root first."""
        tpb = self.tokens_per_block
        path: list[str] = []
        parent: str | None = None
        for start in range(0, len(prompt_token_ids) - tpb + 1, tpb):
            node_id = self._index.get((parent, tuple(prompt_token_ids[start : start + tpb])))
            if node_id is None:
                break
            path.append(node_id)
            parent = node_id
        return path

    def touch(self, node_ids: Iterable[str], now_s: float) -> None:
        """Record a hit on each node (a request whose prompt matched them was admitted)."""
        for node_id in node_ids:
            node = self._nodes.get(node_id)
            if node is not None:
                node.hit_count += 1
                node.last_access_s = now_s

    def acquire(self, node_ids: Iterable[str]) -> None:
        """Mark nodes as used by a request in flight."""
        for node_id in node_ids:
            node = self._nodes.get(node_id)
            if node is not None:
                node.in_use += 1

    def release(self, node_ids: Iterable[str]) -> None:
        """Undo :meth:`acquire` when the request ends."""
        for node_id in node_ids:
            node = self._nodes.get(node_id)
            if node is not None and node.in_use > 0:
                node.in_use -= 1

    def view(self, node_id: str) -> PrefixNodeView:
        """One node as a policy sees it.

        Raises:
            KeyError: no such node.
        """
        n = self._nodes[node_id]
        return PrefixNodeView(
            node_id=n.node_id,
            parent_id=n.parent_id,
            num_tokens=len(n.tokens),
            num_blocks=1,
            location=n.location,
            hit_count=n.hit_count,
            last_access_s=n.last_access_s,
            in_use=n.in_use > 0,
        )

    def count(self, location: KVLocation) -> int:
        """Stored blocks at ``location``."""
        return sum(1 for n in self._nodes.values() if n.location is location)

    def priority(self, node_id: str) -> int:
        """The retention priority the engine last reported for a node."""
        return self._nodes[node_id].priority

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes
