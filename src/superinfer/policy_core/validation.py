"""Checks every engine applies to a policy's decision before acting on it."""

from __future__ import annotations

from collections.abc import Container, Sequence

from superinfer.policy_core.batching import (
    FinishAwareAdder,
    finish_aware,
    step_blocks,
    view_blocks,
)
from superinfer.policy_core.types import (
    KVLocation,
    Placement,
    PlacementDecision,
    PreemptMode,
    PrefixNodeView,
    ScheduleDecision,
    StepState,
)

__all__ = ["PolicyError", "check_decision", "check_placement"]


class PolicyError(RuntimeError):
    """A policy returned a decision the engine cannot apply (a bug in the policy)."""


def check_decision(
    state: StepState, decision: ScheduleDecision, *, swap_supported: bool = False
) -> None:
    """Raise unless ``decision`` is applicable to ``state``.

    Checks that every id is in the queue its action needs, no id has two actions, the running set
    after the step respects ``max_num_seqs``, the tokens respect ``token_budget``, each entry of
    ``num_tokens`` is > 0 and within its request's pending tokens, and the KV blocks needed fit
    in the free HBM blocks after the preemptions free theirs.

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
        view_blocks(running[rid], running[rid].computed_tokens, state)
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
    aware = finish_aware(state)
    admit_need = 0
    for rid, n in decision.num_tokens.items():
        req = live.get(rid)
        if req is None:
            raise PolicyError(f"num_tokens names {rid!r}, which is not running after the decision")
        if n <= 0:
            raise PolicyError(f"num_tokens[{rid!r}] must be > 0, got {n}")
        if n > req.pending_tokens:
            raise PolicyError(f"{rid!r}: {n} tokens exceed its {req.pending_tokens} pending")
        if rid in decision.admit:
            if not aware:  # FinishAwareAdder charges SGLang 0.3.1's admissions below
                admit_need += step_blocks(req, n, state, admit=True)
        else:
            need += step_blocks(req, n, state, admit=False)
    if need > free:
        raise PolicyError(f"the step needs {need} KV blocks, {free} are free")
    # The headroom reserved for running requests' growth is theirs to use: it only bounds
    # admissions (SGLang's PrefillAdder), so a step that admits nothing may eat into it.
    if aware and decision.admit:
        adder = FinishAwareAdder(state, [live[r] for r in running if r in live], free - need)
        for rid in decision.admit:
            if not adder.add(live[rid], decision.num_tokens.get(rid, 0)):
                raise PolicyError(
                    f"admitting {rid!r}: SGLang 0.3.1's ignore_eos admission refuses it "
                    "(finish-aware check, reserve-ratio budget or no free blocks for its chunk)"
                )
    elif decision.admit and admit_need > free - need - state.reserved_hbm_blocks:
        raise PolicyError(
            f"admissions need {admit_need} KV blocks, {free - need} are free and "
            f"{state.reserved_hbm_blocks} are reserved for running requests"
        )


def check_placement(
    nodes: Sequence[PrefixNodeView], decision: PlacementDecision, *, has_cpu_tier: bool
) -> None:
    """Raise unless the placement ``decision`` is applicable to the cached ``nodes``.

    Rules: every id is a listed node; a node in use is never dropped or offloaded; ``OFFLOAD``
    and ``PIN`` name HBM nodes, ``prefetch`` names CPU nodes (both need a CPU tier) that are not
    also dropped, each after its parent unless that parent is in HBM; and the cache stays
    prefix-closed: no node is dropped while a child stays cached, none leaves HBM while a child
    stays there (a split the engine already had is not the decision's fault).

    Args:
        nodes: the nodes the decision was made on.
        decision: the policy's decision.
        has_cpu_tier: whether the engine has a CPU KV tier.

    Raises:
        PolicyError: naming the first violation.
    """
    by_id = {nd.node_id: nd for nd in nodes}
    for nid, action in decision.actions.items():
        node = by_id.get(nid)
        if node is None:
            raise PolicyError(f"placement names {nid!r}, which is not a cached node")
        if action in (Placement.DROP, Placement.OFFLOAD) and node.in_use:
            raise PolicyError(f"{action.value} of {nid!r}, which a running request uses")
        if action in (Placement.OFFLOAD, Placement.PIN) and node.location is not KVLocation.HBM:
            raise PolicyError(f"{action.value} of {nid!r}, which is not in HBM")
        if action is Placement.OFFLOAD and not has_cpu_tier:
            raise PolicyError(f"offload of {nid!r}, but this engine has no CPU KV tier")
    if decision.prefetch and not has_cpu_tier:
        raise PolicyError("prefetch needs a CPU KV tier, which this engine lacks")
    loaded: set[str] = set()
    for nid in decision.prefetch:
        node = by_id.get(nid)
        if node is None or node.location is not KVLocation.CPU:
            raise PolicyError(f"prefetch names {nid!r}, which is not a node in CPU memory")
        if nid in loaded or decision.actions.get(nid) is Placement.DROP:
            raise PolicyError(f"prefetch names {nid!r} twice or also drops it")
        parent = by_id.get(node.parent_id) if node.parent_id is not None else None
        if (
            parent is not None
            and parent.location is not KVLocation.HBM
            and parent.node_id not in loaded
        ):
            raise PolicyError(f"prefetch of {nid!r} before its parent {parent.node_id!r}")
        loaded.add(nid)

    def after(node: PrefixNodeView) -> KVLocation | None:
        action = decision.actions.get(node.node_id)
        if action is Placement.DROP:
            return None
        if action is Placement.OFFLOAD:
            return KVLocation.CPU
        return KVLocation.HBM if node.node_id in loaded else node.location

    for node in nodes:
        if node.parent_id is None or node.parent_id not in by_id:
            continue
        up = by_id[node.parent_id]
        mine, theirs = after(node), after(up)
        if mine is not None and theirs is None:
            raise PolicyError(f"drops {node.parent_id!r} but keeps its child {node.node_id!r}")
        was_split = node.location is KVLocation.HBM and up.location is KVLocation.CPU
        if mine is KVLocation.HBM and theirs is KVLocation.CPU and not was_split:
            raise PolicyError(
                f"moves {node.parent_id!r} to CPU but keeps its child {node.node_id!r} in HBM"
            )
