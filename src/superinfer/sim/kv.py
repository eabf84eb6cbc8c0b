"""KV memory of one replica: the HBM<->CPU link and the prefix cache over hashed token blocks.

The prefix cache is a tree of nodes, one per hashed prompt block (Mooncake ``hash_ids`` cover 512
tokens each and are prefix-chained, so a node's parent is the block before it). A node holds KV
blocks either in HBM or in CPU memory. Requests lock the nodes they use; only unlocked, unpinned
nodes without HBM children can leave HBM (SGLang and TensorRT-LLM evict leaves only). Leaving HBM
means *offload* to CPU when the engine has a CPU tier with room and the node's retention priority
is at least the engine's offload threshold, else *drop* (with any CPU descendants, which become
unreachable).

Eviction order is the engine's own (LRU, or TensorRT-LLM's prioritized LRU: lowest retention
priority first, LRU within a priority) unless a placement plugin answers
``superinfer_kv_placement`` for the candidates.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from superinfer.policy_core.types import KVLocation, PrefixNodeView

__all__ = ["DEFAULT_RETENTION_PRIORITY", "Link", "Node", "PrefixCache"]

#: TensorRT-LLM's default KV retention priority (``KvCacheRetentionConfig``, 1.2: 0-100, 35).
DEFAULT_RETENTION_PRIORITY = 35


class Link:
    """The HBM<->CPU copy engine of one replica: each direction moves one transfer at a time.

    Args:
        bytes_per_s: bandwidth per direction of the whole replica (every GPU's host link moves
            its own tensor-parallel shard, so this is the per-GPU bandwidth times TP).
    """

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        self.busy_until_s = {"d2h": 0.0, "h2d": 0.0}
        self.bytes_moved = {"d2h": 0, "h2d": 0}

    def transfer(self, direction: str, num_bytes: float, now_s: float) -> float:
        """Queue a copy of ``num_bytes`` in ``direction`` (``"d2h"`` or ``"h2d"``); its end, s.

        Raises:
            ValueError: the replica has no link (bandwidth 0).
        """
        if self.bytes_per_s <= 0:
            raise ValueError("no HBM<->CPU link on this replica")
        start = max(now_s, self.busy_until_s[direction])
        end = start + num_bytes / self.bytes_per_s
        self.busy_until_s[direction] = end
        self.bytes_moved[direction] += int(num_bytes)
        return end


class Node:
    """One cached prefix block."""

    __slots__ = (
        "key", "parent", "depth", "tokens", "blocks", "location", "ref", "last_access_s",
        "hit_count", "priority", "pinned", "hbm_children", "children", "sharers", "heap_key",
        "classes",
    )  # fmt: skip

    def __init__(self, key: int, parent: Node | None, tokens: int, blocks: int) -> None:
        self.key = key
        self.parent = parent
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.tokens = tokens
        self.blocks = blocks
        self.location = KVLocation.HBM
        self.ref = 0  # requests using it now
        self.last_access_s = 0.0
        self.hit_count = 0
        self.priority = DEFAULT_RETENTION_PRIORITY
        self.pinned = False
        self.hbm_children = 0
        self.children: set[Node] = set()
        self.sharers = 0  # distinct requests that have used it
        self.heap_key: tuple[int, float] | None = None
        self.classes: set[str] = set()  # SLO classes of the requests that inserted or matched it

    def view(self, num_waiting_refs: int = 0) -> PrefixNodeView:
        """The policy-facing view of this node (``num_waiting_refs``: queued requests whose
        prompt runs through it, which the engine counts). Its id is its block hash (a node is
        one hashed block of the trace, one chunk), the key of the arriving requests'
        ``prompt_chunk_keys``."""
        key = str(self.key)
        return PrefixNodeView(
            node_id=key,
            parent_id=None if self.parent is None else str(self.parent.key),
            num_tokens=self.tokens,
            num_blocks=self.blocks,
            location=self.location,
            hit_count=self.hit_count,
            last_access_s=self.last_access_s,
            in_use=self.ref > 0,
            depth=self.depth,
            slo_classes=tuple(sorted(self.classes)),
            num_waiting_refs=num_waiting_refs,
        )


@dataclass(slots=True)
class Match:
    """The cached prefix of a prompt: nodes in order, and how many of them are only in CPU."""

    nodes: list[Node]
    tokens: int
    cpu_nodes: int


class PrefixCache:
    """Prefix cache of one replica, over hashed prompt blocks.

    Block counts it keeps exact (``check`` verifies them): ``hbm_blocks`` and ``cpu_blocks`` held
    by nodes in each tier, and ``evictable_hbm_blocks``, the HBM blocks of nodes no request uses
    and nobody pinned, which the engine may reclaim on demand.

    Args:
        block_size_tokens: the engine's KV page size; a node caches its block's tokens rounded
            down to whole pages (SGLang's 1-token pages cache every token).
        use_priority: evict by (retention priority, last access) instead of last access only.
        offload_min_priority: nodes below this retention priority are dropped, never offloaded
            (TensorRT-LLM 1.2 drops below 30: see shared/engines/trtllm-1.2.md §2.2).
    """

    def __init__(self, block_size_tokens: int, *, use_priority: bool = False,
                 offload_min_priority: int = 0) -> None:  # fmt: skip
        self.block_size_tokens = block_size_tokens
        self.use_priority = use_priority
        self.offload_min_priority = offload_min_priority
        self.nodes: dict[int, Node] = {}
        self.hbm_blocks = 0
        self.cpu_blocks = 0
        self.evictable_hbm_blocks = 0
        self._hbm_heap: list[tuple[int, float, int, Node]] = []
        self._cpu_heap: list[tuple[float, int, Node]] = []
        self._seq = itertools.count()
        self.version = 0  # bumps when what a prefix match returns (or where it lives) may change
        self.stats = {"offloaded_blocks": 0, "dropped_blocks": 0, "onboarded_blocks": 0}

    # -- lookups --------------------------------------------------------------------------------

    def match(self, hashes: Sequence[int], prompt_tokens: int) -> Match:
        """The longest cached prefix of a prompt with these block hashes (HBM or CPU nodes).

        At most ``prompt_tokens - 1`` tokens are served from cache: the last prompt token is
        always recomputed to produce the first output token (vLLM v1 does the same).
        """
        nodes: list[Node] = []
        tokens = cpu = 0
        for key in hashes:
            node = self.nodes.get(key)
            if node is None or node.tokens == 0 or tokens + node.tokens > prompt_tokens - 1:
                break
            nodes.append(node)
            tokens += node.tokens
            cpu += node.location is KVLocation.CPU
        return Match(nodes, tokens, cpu)

    def node_tokens(self, prompt_tokens: int, index: int, hash_block_tokens: int) -> int:
        """Tokens of hashed block ``index`` of a prompt that the cache can hold (whole pages)."""
        start = index * hash_block_tokens
        tokens = max(0, min(hash_block_tokens, prompt_tokens - start))
        return tokens - tokens % self.block_size_tokens

    # -- bookkeeping helpers ----------------------------------------------------------------------

    def _counts_as_evictable(self, node: Node) -> bool:
        return node.location is KVLocation.HBM and node.ref == 0 and not node.pinned

    def _hbm_key(self, node: Node) -> tuple[int, float]:
        return (node.priority if self.use_priority else 0, node.last_access_s)

    def _is_hbm_leaf_victim(self, node: Node) -> bool:
        return self._counts_as_evictable(node) and node.hbm_children == 0 and node.key in self.nodes

    def _push_hbm(self, node: Node) -> None:
        if self._is_hbm_leaf_victim(node):
            node.heap_key = self._hbm_key(node)
            heapq.heappush(self._hbm_heap, (*node.heap_key, next(self._seq), node))

    def _push_cpu(self, node: Node) -> None:
        if node.location is KVLocation.CPU and not node.children and node.key in self.nodes:
            heapq.heappush(self._cpu_heap, (node.last_access_s, next(self._seq), node))

    # -- changes --------------------------------------------------------------------------------

    def lock(self, nodes: Sequence[Node], now_s: float, *, hit: bool, slo: str = "") -> None:
        """A request (of SLO class ``slo``) starts using ``nodes`` (all in HBM)."""
        for node in nodes:
            if slo:
                node.classes.add(slo)
            if self._counts_as_evictable(node):
                self.evictable_hbm_blocks -= node.blocks
            node.ref += 1
            node.last_access_s = now_s
            node.sharers += 1
            node.hit_count += hit

    def unlock(self, nodes: Sequence[Node], now_s: float) -> None:
        """A request stops using ``nodes``."""
        for node in reversed(nodes):  # leaves first, so each parent sees its child's state
            node.ref -= 1
            node.last_access_s = now_s
            if self._counts_as_evictable(node):
                self.evictable_hbm_blocks += node.blocks
                self._push_hbm(node)

    def set_pinned(self, node: Node, pinned: bool) -> None:
        """Pin (never leaves HBM) or unpin a node."""
        if node.pinned == pinned:
            return
        before = self._counts_as_evictable(node)
        node.pinned = pinned
        self.evictable_hbm_blocks += (self._counts_as_evictable(node) - before) * node.blocks
        self._push_hbm(node)

    def insert(self, key: int, parent: Node | None, tokens: int, now_s: float, *,
               slo: str = "") -> Node:  # fmt: skip
        """Create a locked HBM node for a block a request (of SLO class ``slo``) has computed."""
        node = Node(key, parent, tokens, tokens // self.block_size_tokens)
        if slo:
            node.classes.add(slo)
        node.ref = 1
        node.sharers = 1
        node.last_access_s = now_s
        self.nodes[key] = node
        self.hbm_blocks += node.blocks
        if parent is not None:
            parent.children.add(node)
            parent.hbm_children += 1
        self.version += 1
        return node

    def onboard(self, node: Node) -> None:
        """Move a CPU node back to HBM (a hit on the CPU tier); the caller pays the transfer."""
        node.location = KVLocation.HBM
        self.cpu_blocks -= node.blocks
        self.hbm_blocks += node.blocks
        self.stats["onboarded_blocks"] += node.blocks
        if node.parent is not None:
            node.parent.hbm_children += 1
        if self._counts_as_evictable(node):
            self.evictable_hbm_blocks += node.blocks
            self._push_hbm(node)
        self.version += 1

    def pop_victim(self) -> Node | None:
        """Next HBM leaf to leave HBM in the engine's own order, or ``None``."""
        while self._hbm_heap:
            prio, atime, _, node = heapq.heappop(self._hbm_heap)
            if self._is_hbm_leaf_victim(node) and node.heap_key == (prio, atime):
                node.heap_key = None
                return node
        return None

    def leave_hbm(self, node: Node, *, offload: bool) -> None:
        """Take an unlocked HBM leaf out of HBM: to CPU if ``offload``, else drop it."""
        self.hbm_blocks -= node.blocks
        if self._counts_as_evictable(node):
            self.evictable_hbm_blocks -= node.blocks
        parent = node.parent
        if parent is not None:
            parent.hbm_children -= 1
        if offload:
            node.location = KVLocation.CPU
            self.cpu_blocks += node.blocks
            self.stats["offloaded_blocks"] += node.blocks
            self._push_cpu(node)
        else:
            self._remove(node)
        if parent is not None:
            self._push_hbm(parent)
        self.version += 1

    def _remove(self, node: Node) -> None:
        """Forget ``node`` and its CPU descendants (unreachable without it)."""
        for child in list(node.children):
            self.cpu_blocks -= child.blocks
            self._remove(child)
        self.stats["dropped_blocks"] += node.blocks
        del self.nodes[node.key]
        if node.parent is not None:
            node.parent.children.discard(node)
            self._push_cpu(node.parent)

    def pop_cpu_victim(self) -> Node | None:
        """Least recently used CPU node without children (to make room in CPU), or ``None``."""
        while self._cpu_heap:
            atime, _, node = heapq.heappop(self._cpu_heap)
            if (node.key in self.nodes and node.location is KVLocation.CPU
                    and not node.children and node.last_access_s == atime):  # fmt: skip
                return node
        return None

    def drop_cpu(self, node: Node) -> None:
        """Drop a CPU node without children."""
        self.cpu_blocks -= node.blocks
        self._remove(node)
        self.version += 1

    def check(self) -> None:
        """Raise ``AssertionError`` unless the block counts match the nodes."""
        hbm = sum(n.blocks for n in self.nodes.values() if n.location is KVLocation.HBM)
        cpu = sum(n.blocks for n in self.nodes.values() if n.location is KVLocation.CPU)
        free = sum(n.blocks for n in self.nodes.values() if self._counts_as_evictable(n))
        got = (self.hbm_blocks, self.cpu_blocks, self.evictable_hbm_blocks)
        assert (hbm, cpu, free) == got, ((hbm, cpu, free), got)
        for node in self.nodes.values():
            assert node.ref >= 0, node.key
            assert node.ref == 0 or node.location is KVLocation.HBM, node.key
            kids = sum(c.location is KVLocation.HBM for c in node.children)
            assert kids == node.hbm_children, node.key
            assert node.location is KVLocation.HBM or kids == 0, node.key
