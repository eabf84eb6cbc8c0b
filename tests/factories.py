"""Factories of tiny hand-made worlds for exact-decision tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from superinfer.policy_core.types import SLO, KVLocation, RequestView, StepState

CHAT = SLO("chat", ttft_ms=1000.0, tpot_ms=100.0, priority=0)
BATCH = SLO("batch", deadline_s=600.0, priority=1)


def make_view(
    rid: str,
    *,
    arrival_s: float = 0.0,
    prompt: int = 32,
    computed: int = 0,
    generated: int = 0,
    blocks: int | None = None,
    slo: SLO = CHAT,
    max_output: int = 128,
    block_size: int = 16,
    first_token_s: float | None = None,
    location: KVLocation | None = None,
    prefix_hit: int = 0,
    replica: int = 0,
) -> RequestView:
    """A request view; ``blocks`` defaults to what ``computed`` tokens occupy, ``location`` to
    HBM when it holds blocks (pass ``KVLocation.CPU`` for a swapped request)."""
    if blocks is None:
        blocks = -(-computed // block_size)
    if location is None:
        location = KVLocation.HBM if blocks else KVLocation.UNALLOCATED
    return RequestView(
        request_id=rid,
        arrival_s=arrival_s,
        prompt_tokens=prompt,
        max_output_tokens=max_output,
        slo=slo,
        computed_tokens=computed,
        prefix_hit_tokens=prefix_hit,
        generated_tokens=generated,
        first_token_s=first_token_s,
        kv_location=location,
        kv_blocks=blocks,
        replica=replica,
    )


def make_state(
    *,
    waiting: Sequence[RequestView] = (),
    running: Sequence[RequestView] = (),
    swapped: Sequence[RequestView] = (),
    free_blocks: int = 100,
    total_blocks: int = 100,
    free_cpu_blocks: int = 0,
    total_cpu_blocks: int = 0,
    token_budget: int = 2048,
    max_num_seqs: int = 256,
    block_size: int = 16,
    now_s: float = 10.0,
    kv_block_bytes: int = 0,
    link_bytes_per_s: float = 0.0,
    replica: int = 0,
    mixed_batches: bool = True,
) -> StepState:
    """A replica state with the given queues (no CPU tier unless ``total_cpu_blocks`` > 0)."""
    return StepState(
        now_s=now_s,
        step_index=0,
        waiting=tuple(waiting),
        running=tuple(running),
        swapped=tuple(swapped),
        free_hbm_blocks=free_blocks,
        total_hbm_blocks=total_blocks,
        free_cpu_blocks=free_cpu_blocks,
        total_cpu_blocks=total_cpu_blocks,
        block_size_tokens=block_size,
        token_budget=token_budget,
        max_num_seqs=max_num_seqs,
        kv_block_bytes=kv_block_bytes,
        link_bytes_per_s=link_bytes_per_s,
        replica=replica,
        mixed_batches=mixed_batches,
    )


def random_forest(
    rng: np.random.Generator, nodes: int, *, many_roots: bool
) -> tuple[list[int], list[int]]:
    """A random prefix forest of ``nodes`` blocks numbered parent-first: ``(parent, depth)``.

    Node 0 is a root; node ``i`` gets a parent drawn uniformly from ``0 .. i-1``, or from
    ``-1 .. i-1`` when ``many_roots`` (``-1``: a new root). ``depth`` counts edges from the root.
    """
    low = -1 if many_roots else 0
    parent = [-1] + [int(rng.integers(low, i)) for i in range(1, nodes)]
    depth = [0] * nodes
    for v in range(1, nodes):
        depth[v] = depth[parent[v]] + 1 if parent[v] >= 0 else 0
    return parent, depth


def root_path(parent: Sequence[int], leaf: int) -> list[int]:
    """The blocks from ``leaf``'s root down to ``leaf`` (a request's prefix path)."""
    path = []
    while leaf >= 0:
        path.append(leaf)
        leaf = parent[leaf]
    return path[::-1]
