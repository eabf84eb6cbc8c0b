"""SGLang's radix tree -> :class:`PrefixNodeView` objects, and the content keys that name a prefix
across SGLang's node ids: path hashes of the tokens from the root (a node's ``content_key``), at
every :data:`CHUNK_TOKENS` boundary (its ``chunk_keys``, and a new request's
``RequestView.prompt_chunk_keys``, so a policy can match what a request reads against what a
node holds). Read-only: nothing here changes the tree or a ``Req``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from superinfer.policy_core.types import KVLocation, PrefixNodeView

__all__ = [
    "CHUNK_TOKENS",
    "chunk_hashes",
    "path_hash",
    "prefix_node_views",
    "prompt_chunk_keys",
]


def _tree_nodes(root: Any) -> Iterable[Any]:
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


#: Path hashes: polynomial modulo the prime 2^61 - 1 (two n-token paths collide w.p. < n / 2^61).
_PATH_MOD = (1 << 61) - 1
_PATH_BASE = 1_000_003
#: Tokens per chunk of :attr:`PrefixNodeView.chunk_keys` (at least the page size; GPU pages: 16-64)
CHUNK_TOKENS = 16


def path_hash(prefix_hash: int, tokens: Iterable[int]) -> int:
    """The polynomial hash of a token path, continued from ``prefix_hash`` (the path before it).

    ``path_hash(path_hash(h, a), b) == path_hash(h, a + b)``: a radix node's hash depends on the
    tokens from the root to its end only, not on where the tree splits them into nodes, so a
    prefix that SGLang evicts and later inserts again (as a new node, with a new id) gets the
    same :attr:`PrefixNodeView.content_key`.

    Args:
        prefix_hash: the hash of the tokens before ``tokens`` (0: none).
        tokens: token ids (ints >= 0).

    Returns:
        An int in [0, 2^61 - 1).
    """
    h = prefix_hash
    for t in tokens:
        h = (h * _PATH_BASE + int(t) + 1) % _PATH_MOD
    return h


def chunk_hashes(prefix_hash: int, start: int, tokens: Sequence[int], chunk: int) -> list[int]:
    """The path hashes at every multiple of ``chunk`` tokens from the root inside ``tokens``
    (which start ``start`` tokens from the root), first first, then the hash at their end (again
    when the end is a multiple): a node's chunk keys and its content key.

    Args:
        prefix_hash: the :func:`path_hash` of the ``start`` tokens before the node.
        start: tokens from the root to the node's first token.
        tokens: the node's token ids (at least one).
        chunk: tokens per chunk (>= 1).

    Returns:
        One int per chunk boundary in ``(start, start + len(tokens)]``, then the end's.
    """
    out, h, pos = [], prefix_hash, start
    for t in tokens:
        h = (h * _PATH_BASE + int(t) + 1) % _PATH_MOD
        pos += 1
        if pos % chunk == 0:
            out.append(h)
    out.append(h)
    return out


def _node_tokens(node: Any) -> Sequence[int]:
    """A radix node's own token ids (``node.key``: a ``RadixKey`` in SGLang 0.5.23, whose
    ``token_ids`` may be longer than the key, or a plain token list in older trees)."""
    key = node.key
    ids: Sequence[int] = getattr(key, "token_ids", key)
    return ids[: len(key)]


def _namespace_hash(key: Any) -> int:
    """The hash a path starts from: SGLang namespaces a tree by ``extra_key`` (LoRA) and
    ``cache_salt`` (``mem_cache/radix_cache.py::RadixKey``; an empty salt is none): two
    namespaces, two contents. ``key``: a node's ``RadixKey`` or a ``Req``, which carry both."""
    salt = getattr(key, "cache_salt", None) or None
    return path_hash(0, f"{getattr(key, 'extra_key', None)}\x00{salt}".encode())


def prefix_node_views(
    root: Any,
    *,
    now_s: float,
    page_size: int,
    pinned: Iterable[int],
    last_seen: dict[int, tuple[float, float, int, int, tuple[str, ...]]],
    full: Any,
) -> tuple[PrefixNodeView, ...]:
    """Views of the cached nodes of a Python-core ``UnifiedRadixCache`` tree.

    SGLang stamps ``last_access_time`` from a logical tick counter
    (``unified_cache/components/base.py::get_and_increase_time_counter``), not in seconds; a node
    whose tick changed since the previous call is reported as accessed ``now_s``, so recency is in
    adapter seconds at the resolution of these calls. Each view's ``content_key`` is the
    :func:`path_hash` of the node's tokens from the root (hex), and its ``chunk_keys`` the path
    hashes at every :data:`CHUNK_TOKENS` (or page) boundary in it, the keys of the whole chunks
    that end in it (:func:`chunk_hashes`), computed once per node and length (a split shortens a
    node; its path's end, hence its hash, stays).

    Args:
        root: ``tree_core.root_node``.
        now_s: adapter time, s.
        page_size: tokens per KV block.
        pinned: ids of the nodes the adapter pins (their locks do not make a node "in use").
        last_seen: node id -> (tick, last access s, token length, tokens from the root to its
            end, its chunk hashes then its end's in hex); updated in place, pruned to live nodes.
        full: ``ComponentType.FULL``.

    Returns:
        One view per node holding KV in HBM or on the host, by node id.
    """
    nodes = {n.id: n for n in _tree_nodes(root)}
    chunk = max(CHUNK_TOKENS, page_size)
    paths: dict[int, tuple[int, tuple[str, ...]]] = {}  # node id -> (end position, chunk keys)
    for node_id, node in nodes.items():  # parents before children (_tree_nodes' order)
        prev = last_seen.get(node_id)
        if prev is not None and prev[2] == len(node.key):
            paths[node_id] = prev[3], prev[4]
            continue
        parent = node.parent
        above = paths.get(parent.id) if parent is not None and parent.parent is not None else None
        start = 0 if above is None else above[0]
        h = _namespace_hash(node.key) if above is None else int(above[1][-1], 16)
        tokens = _node_tokens(node)
        ints = chunk_hashes(h, start, tokens, chunk)
        paths[node_id] = start + len(tokens), tuple(f"{x:x}" for x in ints)
    own_refs: dict[int, int] = {}
    for node_id in pinned:
        node = nodes.get(node_id)
        while node is not None and node.parent is not None:
            own_refs[node.id] = own_refs.get(node.id, 0) + 1
            node = node.parent
    views = []
    for node_id, node in sorted(nodes.items()):
        data = node.component_data[full]
        if data.value is not None:
            location = KVLocation.HBM
        elif data.host_value is not None:
            location = KVLocation.CPU
        else:
            continue
        tick = float(node.last_access_time)
        prev = last_seen.get(node_id)
        access_s = prev[1] if prev is not None and prev[0] == tick else now_s
        end, hashes = paths[node_id]
        last_seen[node_id] = (tick, access_s, len(node.key), end, hashes)
        parent = node.parent
        views.append(
            PrefixNodeView(
                node_id=str(node_id),
                parent_id=None if parent is None or parent.parent is None else str(parent.id),
                num_tokens=len(node.key),
                num_blocks=-(-len(node.key) // page_size),
                location=location,
                hit_count=node.hit_count,
                last_access_s=access_s,
                in_use=data.lock_ref > own_refs.get(node_id, 0),
                content_key=hashes[-1],
                chunk_keys=hashes[:-1],
            )
        )
    for stale in last_seen.keys() - nodes.keys():
        del last_seen[stale]
    return tuple(views)


def prompt_chunk_keys(req: Any, page_size: int) -> tuple[str, ...]:
    """The chunk keys of a new SGLang ``Req``'s prompt: the :func:`path_hash` (hex) at every
    ``max(CHUNK_TOKENS, page_size)`` tokens of ``req.origin_input_ids``, in the namespace its
    radix key gets (``req.extra_key``, ``req.cache_salt``: ``mem_cache/common.py``), so that
    they are the :attr:`PrefixNodeView.chunk_keys` of the nodes that hold the prompt once it is
    cached. A partial chunk at the end has none. O(prompt tokens) in Python: about 0.2 µs a
    token (``results/sglang-kv-placement/prompts/arrival_cost.csv``).

    Args:
        req: the ``Req`` (``origin_input_ids``, ``extra_key``, ``cache_salt``).
        page_size: tokens per KV block.

    Returns:
        One hex key per whole chunk of the prompt, first first.
    """
    ids = req.origin_input_ids
    if not ids:
        return ()
    chunk = max(CHUNK_TOKENS, page_size)
    hashes = chunk_hashes(_namespace_hash(req), 0, ids, chunk)[:-1]
    return tuple(f"{h:x}" for h in hashes)
