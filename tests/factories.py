"""Factories of tiny hand-made worlds for exact-decision tests."""

from __future__ import annotations

from collections.abc import Sequence

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
