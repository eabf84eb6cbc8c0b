"""Token-budget batch formation shared by the priority-ordered policies.

A policy that only has to say *in what order* requests deserve service hands that order to
:func:`fill_step`, which forms the step the way vLLM v1's scheduler does
(``vllm/v1/core/sched/scheduler.py``, v0.11): running requests first, each getting its pending
tokens (1 for a decode, a chunk of the prompt for a prefill) within the token budget; when a
request needs a KV block and none is free, the lowest-ranked running request is preempted
(recompute); waiting requests are admitted in order only in a step without preemptions, and
admission stops at the first request that does not fit (no skipping, so no starvation by
reordering).
"""

from __future__ import annotations

from collections.abc import Sequence

from superinfer.policy_core.types import PreemptMode, RequestView, ScheduleDecision, StepState

__all__ = ["blocks_for_tokens", "fill_step"]


def blocks_for_tokens(num_tokens: int, block_size_tokens: int) -> int:
    """KV blocks needed to hold ``num_tokens`` tokens in pages of ``block_size_tokens``."""
    return -(-num_tokens // block_size_tokens)


def _new_blocks(view: RequestView, num_tokens: int, block_size_tokens: int) -> int:
    """Blocks ``view`` must add to hold KV for ``num_tokens`` more tokens."""
    held = view.kv_blocks
    return max(0, blocks_for_tokens(view.computed_tokens + num_tokens, block_size_tokens) - held)


def fill_step(
    state: StepState,
    running: Sequence[RequestView],
    waiting: Sequence[RequestView],
    *,
    max_repeat_steps: int = 1,
) -> ScheduleDecision:
    """Form one step from requests ranked best-first.

    Args:
        state: the replica state the ranking came from.
        running: ``state.running`` ranked best-first; preemption victims come from its tail.
        waiting: admission candidates ranked best-first (a subset of ``state.waiting``).
        max_repeat_steps: passed to the decision, but only when the step is decode-only and
            admits nothing (otherwise 1); a policy whose ranking cannot change between events
            (arrival, finish, KV shortage) may allow the engine to repeat it.

    Returns:
        A decision within ``state.token_budget``, ``state.max_num_seqs`` and the free HBM blocks.
    """
    bs = state.block_size_tokens
    budget = state.token_budget
    free = state.free_hbm_blocks
    num_tokens: dict[str, int] = {}
    preempt: dict[str, PreemptMode] = {}
    queue = list(running)  # candidates still unscheduled; victims are popped from its tail
    while queue and budget > 0 and len(num_tokens) < state.max_num_seqs:
        req = queue.pop(0)
        n = min(req.pending_tokens, budget)
        need = _new_blocks(req, n, bs)
        while need > free and queue:
            victim = queue.pop()
            preempt[victim.request_id] = PreemptMode.RECOMPUTE
            free += victim.kv_blocks
        if need > free:
            preempt[req.request_id] = PreemptMode.RECOMPUTE
            free += req.kv_blocks
            break
        free -= need
        budget -= n
        num_tokens[req.request_id] = n

    admit: list[str] = []
    if not preempt:
        for req in waiting:
            if budget <= 0 or len(num_tokens) >= state.max_num_seqs:
                break
            n = min(req.pending_tokens, budget)
            need = _new_blocks(req, n, bs)
            if need > free:
                break
            free -= need
            budget -= n
            num_tokens[req.request_id] = n
            admit.append(req.request_id)

    decode_only = not admit and not preempt and all(n == 1 for n in num_tokens.values())
    return ScheduleDecision(
        num_tokens=num_tokens,
        admit=tuple(admit),
        preempt=preempt,
        max_repeat_steps=max_repeat_steps if decode_only and num_tokens else 1,
    )
