"""Checks every engine applies to a policy's decision before acting on it."""

from __future__ import annotations

from collections.abc import Container

from superinfer.policy_core.batching import blocks_for_tokens, step_blocks
from superinfer.policy_core.types import KVLocation, PreemptMode, ScheduleDecision, StepState

__all__ = ["PolicyError", "check_decision"]


class PolicyError(RuntimeError):
    """A policy returned a decision the engine cannot apply (a bug in the policy)."""


def check_decision(
    state: StepState, decision: ScheduleDecision, *, swap_supported: bool = False
) -> None:
    """Raise unless ``decision`` is applicable to ``state``.

    Checks that every id is in the queue its action needs, no id has two actions, the running set
    after the step respects ``max_num_seqs``, the tokens respect ``token_budget`` and each
    request's pending tokens, and the KV blocks needed fit in the free HBM blocks after the
    preemptions free theirs.

    Args:
        state: the state the decision was made on.
        decision: the policy's decision.
        swap_supported: whether the engine has a CPU tier for swap, resume and prefetch.

    Raises:
        PolicyError: naming the first violation.
    """
    running = {r.request_id: r for r in state.running}
    waiting = {r.request_id: r for r in state.waiting}
    swapped = {r.request_id: r for r in state.swapped}
    acted: set[str] = set()

    def claim(rid: str, where: Container[str], action: str) -> None:
        if rid not in where:
            raise PolicyError(f"{action} names {rid!r}, which is not in the right queue")
        if rid in acted:
            raise PolicyError(f"{rid!r} has more than one action in one decision")
        acted.add(rid)

    for rid in decision.reject:
        claim(rid, waiting.keys() | swapped.keys(), "reject")
    for rid, mode in decision.preempt.items():
        claim(rid, running, "preempt")
        if mode is PreemptMode.SWAP and not swap_supported:
            raise PolicyError(f"preempt {rid!r} by swap, but this engine has no CPU KV tier")
    for rid in decision.resume:
        claim(rid, swapped, "resume")
    for rid in decision.admit:
        claim(rid, waiting, "admit")
    if (decision.resume or decision.prefetch) and not swap_supported:
        raise PolicyError("resume/prefetch need a CPU KV tier, which this engine lacks")
    swap_out = sum(
        blocks_for_tokens(running[rid].computed_tokens, state.block_size_tokens)
        for rid, mode in decision.preempt.items()
        if mode is PreemptMode.SWAP
    )
    if swap_out > state.free_cpu_blocks:
        raise PolicyError(
            f"swapping out needs {swap_out} CPU blocks, {state.free_cpu_blocks} are free"
        )

    live = {rid: r for rid, r in running.items() if rid not in decision.preempt}
    live.update({rid: swapped[rid] for rid in decision.resume})
    live.update({rid: waiting[rid] for rid in decision.admit})
    if len(live) > state.max_num_seqs:
        raise PolicyError(f"{len(live)} running requests exceed max_num_seqs={state.max_num_seqs}")
    if decision.total_tokens > state.token_budget:
        raise PolicyError(
            f"{decision.total_tokens} tokens exceed the token budget {state.token_budget}"
        )

    free = state.free_hbm_blocks + sum(running[rid].own_kv_blocks for rid in decision.preempt)
    # Resumed requests not run this step, and prefetches, bring their whole KV back from CPU.
    moved_in = [rid for rid in decision.resume if rid not in decision.num_tokens]
    moved_in += [rid for rid in decision.prefetch if rid not in decision.resume]
    for rid in decision.prefetch:
        if rid not in swapped:
            raise PolicyError(f"prefetch names {rid!r}, which is not swapped")
    need = sum(
        swapped[rid].kv_blocks for rid in moved_in if swapped[rid].kv_location is KVLocation.CPU
    )
    admit_need = 0
    for rid, n in decision.num_tokens.items():
        req = live.get(rid)
        if req is None:
            raise PolicyError(f"num_tokens names {rid!r}, which is not running after the decision")
        if n > req.pending_tokens:
            raise PolicyError(f"{rid!r}: {n} tokens exceed its {req.pending_tokens} pending")
        if rid in decision.admit:
            admit_need += step_blocks(req, n, state, admit=True)
        else:
            need += step_blocks(req, n, state, admit=False)
    if need > free:
        raise PolicyError(f"the step needs {need} KV blocks, {free} are free")
    # The headroom reserved for running requests' growth is theirs to use: it only bounds
    # admissions (SGLang's PrefillAdder), so a step that admits nothing may eat into it.
    if decision.admit and admit_need > free - need - state.reserved_hbm_blocks:
        raise PolicyError(
            f"admissions need {admit_need} KV blocks, {free - need} are free and "
            f"{state.reserved_hbm_blocks} are reserved for running requests"
        )
