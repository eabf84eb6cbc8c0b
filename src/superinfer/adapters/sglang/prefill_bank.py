"""A policy's prefill allotments, carried out by an engine that runs a whole prompt once admitted.

A policy decides per step how many prompt tokens a request may run (``ScheduleDecision.num_tokens``;
``superinfer`` shrinks it to protect running requests' TPOT). SGLang 0.5.23 cannot run a prompt in
those amounts: an admitted request runs ``min(prompt, --chunked-prefill-size)`` tokens now, and its
further chunks run first thing in the following passes (``Scheduler._get_new_batch_prefill_raw``:
``adder.add_chunked_req`` before any waiting request), without asking the policy. Admitting a
request the policy gave 32 tokens would run 512 and then the rest: the decode stall the policy meant
to avoid.

So the adapter banks what the policy allots a waiting request on each pass and lets SGLang admit it
only once the bank covers the prefill SGLang will run (its prompt less its prefix-cache hit, capped
at the pass's prefill budget ``--max-prefill-tokens``). Over a run the prompt is then prefilled at
the pace the policy planned: a request allotted ``n`` tokens per pass waits ``ceil(need / n)``
passes, then runs at once. A request the policy allots its whole prefill (every policy when nothing
constrains it, e.g. ``fcfs``) is admitted on the first pass, as without the bank.
"""

from __future__ import annotations

from typing import Any

from superinfer.policy_core.types import ScheduleDecision, StepState

__all__ = ["PrefillBank", "prefill_need"]


def prefill_need(pending_tokens: int, prefix_hit_tokens: int, max_prefill_tokens: int) -> int:
    """Prompt tokens SGLang runs for a waiting request before its first token.

    Args:
        pending_tokens: the view's pending tokens (prompt plus generated, nothing computed).
        prefix_hit_tokens: the radix cache's last prefix match for it.
        max_prefill_tokens: the pass's prefill budget; a longer need counts as this much, so a
            policy can always admit a request by allotting the whole budget.

    Returns:
        At least 1.
    """
    return max(1, min(pending_tokens - prefix_hit_tokens, max_prefill_tokens))


class PrefillBank:
    """Banked prefill allotments of waiting requests, and which admissions are ready.

    Attributes:
        tokens: request id -> tokens allotted over the passes it has waited since it was first
            admitted by the policy (only requests still waiting are kept).
        ready: the admissions SGLang may start in the pass in progress.
    """

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.ready: frozenset[str] = frozenset()

    def update(
        self,
        decision: ScheduleDecision,
        state: StepState,
        max_prefill_tokens: int,
        queue: list[Any] | None = None,
    ) -> None:
        """Bank ``decision``'s allotments for ``state``'s waiting requests; set :attr:`ready`.

        Args:
            decision: the policy's decision at this prefill pass.
            state: the state it was made for.
            max_prefill_tokens: SGLang's ``--max-prefill-tokens``.
            queue: SGLang's waiting queue (``Req``s, in the policy's order), re-sorted in place so
                the ready admissions come first, in that order: SGLang's loop stops at the first
                request it may not add, so a deferred one must not stand before a ready one.
        """
        waiting = {v.request_id: v for v in state.waiting}
        bank = {rid: n for rid, n in self.tokens.items() if rid in waiting}
        ready = set()
        for rid in decision.admit:
            v = waiting.get(rid)
            if v is None:
                continue
            have = bank.get(rid, 0) + decision.num_tokens.get(rid, 0)
            bank[rid] = have
            if have >= prefill_need(v.pending_tokens, v.prefix_hit_tokens, max_prefill_tokens):
                ready.add(rid)
        self.tokens = bank
        self.ready = frozenset(ready)
        if queue is not None:
            queue.sort(key=lambda req: req.rid not in self.ready)  # stable
