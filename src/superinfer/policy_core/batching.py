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
    "FinishAwareAdder",
    "fill_step",
    "finish_aware",
    "finish_aware_fits",
    "sglang_output_reserve",
    "step_blocks",
    "view_blocks",
]

_FP16 = KVPrecision.FP16

#: SGLang clips a request's output cap to this many tokens when it budgets KV for admission
#: (``CLIP_MAX_NEW_TOKENS``, ``sglang/srt/managers/schedule_policy.py``, 0.5.x).
SGLANG_CLIP_MAX_NEW_TOKENS = 4096


def sglang_output_reserve(max_output_tokens: int, generated_tokens: int) -> int:
    """The output tokens SGLang's ``PrefillAdder`` budgets for a request (before its
    ``new_token_ratio``): its remaining output cap, clipped to :data:`SGLANG_CLIP_MAX_NEW_TOKENS`,
    never below 0 (``schedule_policy.py`` ``_get_running_request_total_token_offset`` and
    ``add_one_req``, 0.5.23). One rule for the policy's admission charge (:func:`step_blocks`),
    the SGLang adapter's view of the running batch (``adapters.sglang.view.reserved_blocks``) and
    the simulator's (``sim.replica.Replica.reserved_blocks``)."""
    left = max_output_tokens - generated_tokens
    return max(min(left, SGLANG_CLIP_MAX_NEW_TOKENS), 0)


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
        left = sglang_output_reserve(view.max_output_tokens, view.generated_tokens)
        # StepState.reserve_whole_prompt: the later prefill chunks too (SGLang's add_one_req)
        rest = view.pending_tokens - num_tokens if state.reserve_whole_prompt else 0
        need += blocks_for_tokens(left + max(rest, 0), bs)
    return need


def finish_aware(state: StepState) -> bool:
    """Whether admissions on ``state`` follow SGLang 0.3.1's ``ignore_eos`` rule
    (``StepState.finish_aware_admission``, which applies under ``RESERVE_RATIO`` only)."""
    return state.finish_aware_admission and state.admission is AdmissionRule.RESERVE_RATIO


def finish_aware_fits(
    candidate: RequestView, others: Iterable[RequestView], total_tokens: int
) -> bool:
    """SGLang 0.3.1's admission check for a request sent with ``ignore_eos`` while the radix
    cache is disabled (``PrefillAdder.add_one_req_ignore_eos``,
    ``python/sglang/srt/managers/policy_scheduler.py`` at sgl-project/sglang a9c5f0a; the
    PyPI wheels have it from 0.3.1 on, 0.3.0's has none; ``bench_serving`` sends
    ``ignore_eos`` unless ``--disable-ignore-eos``).

    Every request (the running ones, those admitted before it in this step, then the
    candidate) is a state ``(tokens_left, tokens_occupied)`` = ``(max_output_tokens -
    generated_tokens, prompt_tokens + generated_tokens)`` (those with nothing left are
    dropped), stably sorted by ``tokens_left`` (the candidate after equal ones, as SGLang sorts
    them for a step's first candidate; it inserts later ones before equal ones: a tie order
    not copied). With ``freed`` the occupied tokens of the states before ``i``, the candidate
    fits unless, for some ``i``, ``total_tokens + freed - next_left * (n - i) <= 0``, where
    ``next_left`` is state ``i + 1``'s ``tokens_left`` (state ``i``'s own for the last) and
    ``n - i`` the requests still decoding: the engine's arithmetic as written, against the
    tokens free when the step's admission began (``total_tokens``, not lessened by the prompts
    admitted since; later SGLang releases subtract them and the candidate's prompt).

    Args:
        candidate: the waiting request to admit.
        others: running requests and those admitted earlier in the same step.
        total_tokens: KV tokens free when the step's admission began (free pool plus evictable
            cache), tokens.

    Returns:
        Whether SGLang 0.3 admits ``candidate``.
    """
    states = [(v.max_output_tokens - v.generated_tokens, v.prompt_tokens + v.generated_tokens)
              for v in (*others, candidate)]  # fmt: skip
    states = sorted((s for s in states if s[0] > 0), key=lambda s: s[0])  # stable
    freed = 0
    n = len(states)
    for i, (tokens_left, occupied) in enumerate(states):
        steps = states[i + 1][0] if i + 1 < n else tokens_left
        if total_tokens + freed - steps * (n - i) <= 0:
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
    if not preempt and finish_aware(state):
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


class FinishAwareAdder:
    """SGLang 0.3.1's ``PrefillAdder`` for ``ignore_eos`` requests with the radix cache
    disabled (``StepState.finish_aware_admission``; ``python/sglang/srt/managers/
    policy_scheduler.py`` at sgl-project/sglang a9c5f0a, not in 0.3.0, and a ``tp_worker.py``
    prefill loop of that series, read in the code index at an unrecorded commit, that calls this
    adder's ``remove_running_tokens(running_batch)`` and checks ``no_remaining_tokens()`` before
    each request).

    Before each request the loop stops once the reserve-ratio budget is spent
    (``no_remaining_tokens``: ``rem_total_tokens`` <= 0, which starts as the free tokens less
    ``reserved_hbm_blocks``); the request must then pass :func:`finish_aware_fits` against the
    tokens free when admission began, and (our guard: the simulator allocates what runs) find
    its chunk in the blocks still free. Once admitted it takes its chunk from those, and the
    chunk plus its output cap (``min(max_new_tokens, CLIP)``,
    :data:`SGLANG_CLIP_MAX_NEW_TOKENS`) from the budget, the cap only when the chunk ends its
    prompt (``_prefill_one_req``). The free blocks are those left after the running requests'
    own tokens of this step, which SGLang 0.3 (prefill batches alone) would not subtract: one
    token per running request.

    Args:
        state: the replica state (block size, reserved blocks).
        running: the running requests (not preempted this step).
        free: free KV blocks after the running requests' tokens of this step.
    """

    def __init__(self, state: StepState, running: Sequence[RequestView], free: int) -> None:
        self.state = state
        self.free = free
        self.initial_tokens = free * state.block_size_tokens
        self.total = free - state.reserved_hbm_blocks
        self.views = list(running)

    def add(self, req: RequestView, num_tokens: int) -> bool:
        """Admit ``req`` running ``num_tokens`` of its prompt this step, if SGLang 0.3 would;
        ``False`` (nothing charged) if it would not."""
        if self.total <= 0 or not finish_aware_fits(req, self.views, self.initial_tokens):
            return False
        chunk = step_blocks(req, num_tokens, self.state, admit=False)
        if chunk > self.free:
            return False
        cap = min(req.max_output_tokens, SGLANG_CLIP_MAX_NEW_TOKENS)
        out = cap if num_tokens >= req.pending_tokens else 0
        self.free -= chunk
        self.total -= chunk + blocks_for_tokens(out, self.state.block_size_tokens)
        self.views.append(req)
        return True


def _admit_finish_aware(
    state: StepState,
    running: Sequence[RequestView],
    waiting: Iterable[RequestView],
    free: int,
    budget: int,
    num_tokens: dict[str, int],
    admit: list[str],
) -> bool:
    """:func:`fill_step`'s admissions under ``StepState.finish_aware_admission``
    (:class:`FinishAwareAdder`), within the token budget and ``max_num_seqs``. Fills
    ``num_tokens`` and ``admit``; returns whether a request was turned away for want of KV."""
    adder = FinishAwareAdder(state, running, free)
    for req in waiting:
        if budget <= 0 or len(num_tokens) >= state.max_num_seqs:
            break
        n = min(req.pending_tokens, budget)
        if not adder.add(req, n):
            return True
        budget -= n
        num_tokens[req.request_id] = n
        admit.append(req.request_id)
    return False
