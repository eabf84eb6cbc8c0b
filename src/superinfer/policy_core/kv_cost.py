"""Swap-versus-recompute cost model for giving a running request's KV back (DESIGN §5).

Swapping copies the request's KV blocks to CPU memory now and back before it runs again, over
the HBM<->CPU link (PCIe Gen4/Gen5 or NVLink-C2C), one direction each way. Recomputing frees
the blocks and later re-runs the prefill of every token that had KV. vLLM v0 chose between them
per sequence group by a fixed rule (swap for beam search, recompute otherwise,
``vllm/core/scheduler.py _preempt``); here the choice is by estimated time.
"""

from __future__ import annotations

from superinfer.policy_core.types import PreemptMode, RequestView, StepState

__all__ = ["has_cpu_tier", "preempt_mode", "recompute_cost_s", "swap_cost_s"]


def has_cpu_tier(state: StepState) -> bool:
    """True when the replica can swap: CPU KV blocks and a link to copy them over."""
    return state.total_cpu_blocks > 0 and state.link_bytes_per_s > 0 and state.kv_block_bytes > 0


def swap_cost_s(view: RequestView, state: StepState) -> float:
    """Link time to move ``view``'s KV out and back in: ``2 * blocks * block_bytes / link``, s.

    Raises:
        ValueError: the state has no CPU tier (see :func:`has_cpu_tier`).
    """
    if not has_cpu_tier(state):
        raise ValueError("swap_cost_s needs a CPU KV tier (total_cpu_blocks, link, block bytes)")
    return 2.0 * view.kv_blocks * state.kv_block_bytes / state.link_bytes_per_s


def recompute_cost_s(view: RequestView, prefill_token_s: float) -> float:
    """Prefill time to rebuild ``view``'s KV: ``(computed - cached tokens) * s per token``, s.

    Tokens the prefix cache served (``cached_tokens``) are assumed to hit again.
    """
    return max(view.computed_tokens - view.cached_tokens, 0) * prefill_token_s


def preempt_mode(
    view: RequestView, state: StepState, prefill_token_s: float, free_cpu_blocks: int
) -> PreemptMode:
    """How ``view`` should give its KV back: the cheaper of swap and recompute.

    Swap is chosen only when the replica has a CPU tier, ``free_cpu_blocks`` can hold the
    request's blocks, and the round trip over the link costs less than recomputing (a tie goes
    to recompute, which holds no CPU memory).

    Args:
        view: the running request to preempt.
        state: the replica state (CPU tier size, link bandwidth, block bytes).
        prefill_token_s: current prefill cost, s per token (e.g. ``StepTimeModel``).
        free_cpu_blocks: CPU blocks still free after this decision's other swaps.
    """
    if not has_cpu_tier(state) or view.kv_blocks == 0 or view.kv_blocks > free_cpu_blocks:
        return PreemptMode.RECOMPUTE
    if swap_cost_s(view, state) < recompute_cost_s(view, prefill_token_s):
        return PreemptMode.SWAP
    return PreemptMode.RECOMPUTE
