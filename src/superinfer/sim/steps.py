"""Engine steps: what one scheduling decision runs, and how a run of repeated decode steps
(``ScheduleDecision.max_repeat_steps``, vLLM's multi-step scheduling) is bounded, cut short
and credited to its requests (the timing formula is in ``sim.engine``'s docstring)."""

from __future__ import annotations

from superinfer.policy_core.types import ScheduleDecision
from superinfer.sim.config import StepTimeModel, repeatable
from superinfer.sim.kv_movement import KVMovement
from superinfer.sim.replica import Replica, StepRun
from superinfer.sim.request import SimRequest
from superinfer.sim.step_time import BatchShape

__all__ = ["build_run", "cut_run", "emit", "repeat_steps"]


def build_run(rep: Replica, decision: ScheduleDecision, now_s: float, not_before: float,
              kv: KVMovement, step_time: StepTimeModel) -> StepRun | None:  # fmt: skip
    """The step (or run of repeated decode steps) ``decision`` starts on ``rep``.

    On an engine without mixed batches (``EngineProfile.mixed_batches``) a decision with
    prefill chunks runs only those. Allocates each piece's new KV blocks (``kv.allocate``; a
    piece whose blocks cannot be found sits the step out), and times the step with
    ``step_time``: it starts at ``not_before`` or when its blocks and its requests' KV copies
    are ready, whichever is last.

    Returns:
        The run, or ``None`` if no piece of the decision can run.
    """
    running = rep.running
    pieces = [(running[rid], n) for rid, n in decision.num_tokens.items() if rid in running]
    if not rep.profile.mixed_batches:  # a prefill batch runs alone; its decodes wait
        prefill = [(r, n) for r, n in pieces if r.computed_tokens < r.spec.prompt_tokens]
        if prefill:
            pieces = prefill
    if not pieces:
        return None
    steps = repeat_steps(rep, decision, pieces, now_s) if repeatable(step_time) else 1
    start = not_before
    kept = []
    pairs = full_pairs = decode_kv = growth = 0.0
    tokens = prefill_kv = samples = prefill_tokens = prefill_seqs = 0
    for req, n in pieces:
        c = req.computed_tokens
        need = rep.blocks_for(req, c + (n if n > steps else steps)) - req.kv_blocks
        if need > 0:
            when = kv.allocate(rep, need, now_s)
            if when is None:
                # The policy counted cached blocks that admissions in this same decision
                # have since locked; this request sits the step out (its next step will fit
                # or the policy preempts).
                continue
            if when > start:
                start = when
            rep.add_own(req, need)
        if req.ready_s > start:
            start = req.ready_s
        kept.append((req, n))
        tokens += n
        if n == 1:
            ratio = rep.kv_ratio(req)
            decode_kv += (c + 1) * ratio
            growth += ratio
        else:
            prefill_seqs += 1
            pairs += n * (c + (n + 1) / 2)
            full_pairs += n * (c + n)
            prefill_kv += c + n
            prefill_tokens += n
        samples += req.pending_tokens == n
    if not kept:
        return None
    shape = BatchShape(
        tokens, samples, pairs, prefill_kv, decode_kv, len(kept), prefill_tokens,
        full_pairs, prefill_seqs,
    )  # fmt: skip
    if steps > 1:
        a, b = step_time.decode_coefficients(len(kept))
        run = StepRun(start, kept, steps, start, shape, a, b, growth)
        run.end_s = start + run.elapsed_s(steps)
    else:
        run = StepRun(start, kept, 1, start + step_time.step_time_s(shape), shape)
    return run


def repeat_steps(rep: Replica, decision: ScheduleDecision,
                 pieces: list[tuple[SimRequest, int]], now_s: float) -> int:  # fmt: skip
    """Steps a decode-only decision may run as one event: bounded by the policy's allowance,
    the first finish, and the KV blocks free (or reclaimable) for the sequences' growth."""
    if decision.max_repeat_steps <= 1 or any(n != 1 for _, n in pieces):
        return 1
    if any(req.pending_tokens != 1 or req.ready_s > now_s for req, _ in pieces):
        return 1
    left = [r.spec.output_tokens - r.generated_tokens for r, _ in pieces]
    # A run ends at its first finish, unless the engine runs its steps past it
    # (EngineProfile.repeat_past_finish) and drops the surplus tokens (emit).
    k_max = min(
        decision.max_repeat_steps, max(left) if rep.profile.repeat_past_finish else min(left)
    )
    free = rep.free_blocks + rep.cache.evictable_hbm_blocks

    def fits(k: int) -> bool:
        need = sum(
            max(0, rep.blocks_for(r, r.computed_tokens + k) - r.kv_blocks) for r, _ in pieces
        )
        return need <= free

    if fits(k_max):  # the common case: memory is not the bound
        return k_max
    lo, hi = 1, k_max - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def cut_run(run: StepRun, now_s: float) -> bool:
    """An arrival during a repeated run: end it with the step in flight at ``now_s``.

    Returns:
        Whether ``run`` was shortened (its ``num_steps`` and ``end_s`` re-timed).
    """
    if run.num_steps <= 1 or now_s >= run.end_s:
        return False
    lo, hi = 1, run.num_steps  # smallest j with start + elapsed(j) >= now
    while lo < hi:
        mid = (lo + hi) // 2
        if run.start_s + run.elapsed_s(mid) >= now_s:
            hi = mid
        else:
            lo = mid + 1
    if lo < run.num_steps:
        run.num_steps = lo
        run.end_s = run.start_s + run.elapsed_s(lo)
        return True
    return False


def emit(req: SimRequest, n: int, k: int, first_end_s: float, last_step_s: float,
         end_s: float) -> None:  # fmt: skip
    """Advance ``req`` by a run of ``k`` steps of ``n`` tokens each: its KV, and the output
    tokens of the steps that complete its pending tokens (every step of a repeated run).
    ``first_end_s`` is the end of the run's first step, ``last_step_s`` its last step's
    length (repeated runs only)."""
    emitted = (
        min(k, req.spec.output_tokens - req.generated_tokens)
        if k > 1
        else int(req.pending_tokens == n)
    )
    req.computed_tokens += n * k
    if emitted:
        if req.last_token_s is not None:
            gap = first_end_s - req.last_token_s
            if gap > req.max_itl_s:
                req.max_itl_s = gap
            if req.token_gaps is not None:
                req.token_gaps.append((gap, emitted, end_s - first_end_s))
        if k > 1 and last_step_s > req.max_itl_s:
            req.max_itl_s = last_step_s
        if req.first_token_s is None:
            req.first_token_s = first_end_s
        req.generated_tokens += emitted
        req.last_token_s = end_s
    req._view = None
