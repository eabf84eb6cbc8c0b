"""KV block costs, and token-budget batch formation shared by the priority-ordered policies.

:func:`step_blocks` is the one definition of how many HBM blocks running some tokens of a
request costs; policies, :func:`fill_step` and the engines' decision check all use it.

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

from collections import deque
from collections.abc import Iterable, Sequence

from superinfer.policy_core.types import (
    AdmissionRule,
    KVLocation,
    KVPrecision,
    PreemptMode,
    RequestView,
    ScheduleDecision,
    StepState,
)

__all__ = [
    "SGLANG_CLIP_MAX_NEW_TOKENS",
    "blocks_for_tokens",
    "fill_step",
    "step_blocks",
    "view_blocks",
]

_FP16 = KVPrecision.FP16

#: SGLang clips a request's output cap to this many tokens when it budgets KV for admission
#: (``CLIP_MAX_NEW_TOKENS``, ``sglang/srt/managers/schedule_policy.py``, 0.5.x).
SGLANG_CLIP_MAX_NEW_TOKENS = 4096


def blocks_for_tokens(num_tokens: int, block_size_tokens: int) -> int:
    """KV blocks needed to hold ``num_tokens`` tokens in pages of ``block_size_tokens``."""
    return -(-num_tokens // block_size_tokens)


def view_blocks(view: RequestView, num_tokens: int, state: StepState) -> int:
    """Pages ``num_tokens`` tokens of ``view``'s KV fill on the engine of ``state``: FP16 pages,
    or, where the engine packs quantized KV (``state.kv_packing``), the pages of its exact bytes
    at ``view.kv_precision`` (``policy_core.kv_bytes.KVPacking.blocks``)."""
    packing = state.kv_packing
    if packing is None or view.kv_precision is _FP16:
        return -(-num_tokens // state.block_size_tokens)
    return packing.blocks(num_tokens, view.kv_precision)


def step_blocks(view: RequestView, num_tokens: int, state: StepState, *, admit: bool) -> int:
    """HBM blocks that running ``num_tokens`` more tokens of ``view`` takes from the free pool.

    Blocks the request already holds in HBM are not counted again; a swapped request's blocks
    are in CPU memory, so resuming it needs them all back. Admission adds what the engine's
    ``state.admission`` rule charges: TensorRT-LLM's ``GUARANTEED_NO_EVICT`` reserves the whole
    prompt plus output cap; SGLang's adder also charges the remaining output cap (clipped to
    :data:`SGLANG_CLIP_MAX_NEW_TOKENS`) as headroom that is not allocated. Tokens fill pages at
    the request's precision where the engine packs quantized KV (:func:`view_blocks`).

    Args:
        view: the request.
        num_tokens: tokens it runs this step (>= 1).
        state: the replica state (block size, admission rule).
        admit: whether the request is being admitted (moved from waiting) in this step.
    """
    bs = state.block_size_tokens
    held = view.kv_blocks if view.kv_location is not KVLocation.CPU else 0
    if not admit:  # the hot path: a running request's next tokens
        if view.kv_precision is _FP16 or state.kv_packing is None:
            need = -(-(view.computed_tokens + num_tokens) // bs) - held
            return need if need > 0 else 0  # max(0, need), without the builtin's call cost
        return max(0, view_blocks(view, view.computed_tokens + num_tokens, state) - held)
    if state.admission is AdmissionRule.RESERVE_MAX:
        total = view.prompt_tokens + view.max_output_tokens
        return max(0, view_blocks(view, total, state) - held)
    need = max(0, view_blocks(view, view.computed_tokens + num_tokens, state) - held)
    if state.admission is AdmissionRule.RESERVE_RATIO:
        left = min(view.max_output_tokens - view.generated_tokens, SGLANG_CLIP_MAX_NEW_TOKENS)
        # StepState.reserve_whole_prompt: the later prefill chunks too (SGLang's add_one_req)
        rest = view.pending_tokens - num_tokens if state.reserve_whole_prompt else 0
        need += blocks_for_tokens(max(left, 0) + max(rest, 0), bs)
    return need


def fill_step(
    state: StepState,
    running: Sequence[RequestView],
    waiting: Iterable[RequestView],
    *,
    max_repeat_steps: int = 1,
) -> ScheduleDecision:
    """Form one step from requests ranked best-first.

    Args:
        state: the replica state the ranking came from.
        running: ``state.running`` ranked best-first; preemption victims come from its tail.
        waiting: admission candidates ranked best-first (a subset of ``state.waiting``); read
            in order only as far as admission goes (an iterator over a kept order will do).
        max_repeat_steps: passed to the decision, but only when the step is decode-only and
            admits nothing (otherwise 1); a policy whose ranking cannot change between events
            (arrival, finish, KV shortage) may allow the engine to repeat it.

    Returns:
        A decision within ``state.token_budget``, ``state.max_num_seqs`` and the free HBM blocks
        (admissions also leave ``state.reserved_hbm_blocks`` untouched).
    """
    budget = state.token_budget
    free = state.free_hbm_blocks
    num_tokens: dict[str, int] = {}
    preempt: dict[str, PreemptMode] = {}
    queue = deque(running)  # candidates still unscheduled; victims are popped from its tail
    while queue and budget > 0 and len(num_tokens) < state.max_num_seqs:
        req = queue.popleft()
        n = min(req.pending_tokens, budget)
        need = step_blocks(req, n, state, admit=False)
        while need > free and queue:
            victim = queue.pop()
            preempt[victim.request_id] = PreemptMode.RECOMPUTE
            free += victim.own_kv_blocks
        if need > free:
            preempt[req.request_id] = PreemptMode.RECOMPUTE
            free += req.own_kv_blocks
            break
        free -= need
        budget -= n
        num_tokens[req.request_id] = n

    admit: list[str] = []
    blocked = False
    if not preempt:
        free -= state.reserved_hbm_blocks
        for req in waiting:
            if budget <= 0 or len(num_tokens) >= state.max_num_seqs:
                break
            n = min(req.pending_tokens, budget)
            need = step_blocks(req, n, state, admit=True)
            if need > free:
                blocked = True
                break
            free -= need
            budget -= n
            num_tokens[req.request_id] = n
            admit.append(req.request_id)

    decode_only = not admit and not preempt and all(n == 1 for n in num_tokens.values())
    # Under RESERVE_RATIO the headroom held for running requests shrinks with every decoded
    # token, so a blocked admission can become possible without an event: do not repeat.
    if blocked and state.admission is AdmissionRule.RESERVE_RATIO:
        decode_only = False
    return ScheduleDecision(
        num_tokens=num_tokens,
        admit=tuple(admit),
        preempt=preempt,
        max_repeat_steps=max_repeat_steps if decode_only and num_tokens else 1,
    )
