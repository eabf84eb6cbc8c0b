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
    "finish_aware_fits",
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


def finish_aware_fits(
    candidate: RequestView, others: Iterable[RequestView], free_tokens: int
) -> bool:
    """SGLang 0.3's admission check for a request sent with ``ignore_eos`` while the radix cache
    is disabled (``PrefillAdder.add_one_req_ignore_eos``,
    ``python/sglang/srt/managers/policy_scheduler.py``, SGLang 0.3; ``bench_serving`` sends
    ``ignore_eos`` unless ``--disable-ignore-eos``).

    Every request (the candidate, the running ones and those admitted before it in this step)
    is a state ``(tokens_left, tokens_occupied)`` = ``(max_output_tokens - generated_tokens,
    prompt_tokens + generated_tokens)`` (those with nothing left are dropped), sorted by
    ``tokens_left`` (a stable sort, the candidate first among equals: SGLang sorts them so
    for a step's first candidate; it inserts later ones by a loop that puts the largest one
    before the last state, a quirk not copied). With ``rem = free_tokens -
    candidate.prompt_tokens`` and ``freed`` the occupied tokens of the states before ``i``, the
    candidate fits unless, for some ``i``, ``rem + freed - next_left * (n - i) <= 0``, where
    ``next_left`` is state ``i + 1``'s ``tokens_left`` (state ``i``'s own for the last) and
    ``n - i`` the requests still decoding: the engine's own arithmetic, kept as written.

    Args:
        candidate: the waiting request to admit.
        others: running requests and those admitted earlier in the same step.
        free_tokens: KV tokens free now (free pool plus evictable cache, less what this step's
            earlier admissions take), tokens.

    Returns:
        Whether SGLang 0.3 admits ``candidate``.
    """
    states = [(v.max_output_tokens - v.generated_tokens, v.prompt_tokens + v.generated_tokens)
              for v in (candidate, *others)]  # fmt: skip
    states = sorted((s for s in states if s[0] > 0), key=lambda s: s[0])  # stable: candidate first
    rem = free_tokens - candidate.prompt_tokens
    freed = 0
    n = len(states)
    for i, (tokens_left, occupied) in enumerate(states):
        steps = states[i + 1][0] if i + 1 < n else tokens_left
        if rem + freed - steps * (n - i) <= 0:
            return False
        freed += occupied
    return True


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
    if not preempt and state.finish_aware_admission:
        blocked = _admit_finish_aware(state, running, waiting, free, budget, num_tokens, admit)
    elif not preempt:
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


def _admit_finish_aware(
    state: StepState,
    running: Sequence[RequestView],
    waiting: Iterable[RequestView],
    free: int,
    budget: int,
    num_tokens: dict[str, int],
    admit: list[str],
) -> bool:
    """:func:`fill_step`'s admissions under ``StepState.finish_aware_admission`` (SGLang 0.3's
    ``add_one_req_ignore_eos`` then ``budget_state``): each request in order must pass
    :func:`finish_aware_fits` against the free tokens (``cur_rem_tokens``); once admitted it
    takes its chunk from them and its chunk plus output cap (when the chunk ends its prompt)
    from the reserve-ratio budget (``rem_total_tokens``: free less ``reserved_hbm_blocks``), and
    admission stops when either is spent. Fills ``num_tokens`` and ``admit``; returns whether a
    request was turned away for want of KV."""
    bs = state.block_size_tokens
    total = free - state.reserved_hbm_blocks
    views = list(running)
    for req in waiting:
        if budget <= 0 or len(num_tokens) >= state.max_num_seqs or total <= 0 or free <= 0:
            break
        if not finish_aware_fits(req, views, free * bs):
            return True
        n = min(req.pending_tokens, budget)
        chunk = step_blocks(req, n, state, admit=False)
        if chunk > free:
            return True
        whole = n >= req.pending_tokens
        out = req.max_output_tokens - req.generated_tokens if whole else 0
        free -= chunk
        total -= chunk + blocks_for_tokens(min(max(out, 0), SGLANG_CLIP_MAX_NEW_TOKENS), bs)
        budget -= n
        num_tokens[req.request_id] = n
        admit.append(req.request_id)
        views.append(req)
    return False
