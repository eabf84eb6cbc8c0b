"""``lpm``: longest prefix match first, SGLang's cache-aware default."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from superinfer.policy_core.batching import fill_step
from superinfer.policy_core.changes import ranked
from superinfer.policy_core.policies.fcfs import DEFAULT_MAX_REPEAT_STEPS
from superinfer.policy_core.protocols import BasePolicy
from superinfer.policy_core.types import Queue, RequestView, ScheduleDecision, StepState

__all__ = ["LPMPolicy"]


def _arrival_key(view: RequestView) -> tuple[float, str]:
    return (view.arrival_s, view.request_id)


def _lpm_key(view: RequestView) -> tuple[int, float, str]:
    return (-view.prefix_hit_tokens, view.arrival_s, view.request_id)


@dataclass
class LPMPolicy(BasePolicy):
    """Admit the waiting requests whose prompts have the longest cached prefix first.

    As SGLang's ``--schedule-policy lpm`` (``python/sglang/srt/managers/schedule_policy.py``,
    ``SchedulePolicy._sort_by_longest_prefix``): waiting requests are sorted by the prefix the
    radix cache holds for them (``RequestView.prefix_hit_tokens``), longest first; above
    ``max_sort_queue`` waiting requests it falls back to FCFS to save the matching cost
    (``_determine_active_policy``, 128 in SGLang; SGLang then keeps the queue's previous order,
    here arrival order). Running requests keep their admission order. Without a prefix cache
    every hit is 0 and ``lpm`` is ``fcfs``.
    """

    max_sort_queue: int = field(
        default=128, metadata={"help": "above this many waiting requests, serve in arrival order"}
    )
    max_repeat_steps: int = field(
        default=DEFAULT_MAX_REPEAT_STEPS,
        metadata={"help": "most decode-only steps the engine may repeat without asking again"},
    )
    name: str = "lpm"

    def __post_init__(self) -> None:
        if self.max_sort_queue < 0:
            raise ValueError(f"lpm: max_sort_queue must be >= 0, got {self.max_sort_queue}")
        if self.max_repeat_steps < 1:
            raise ValueError(f"lpm: max_repeat_steps must be >= 1, got {self.max_repeat_steps}")

    def schedule(self, state: StepState) -> ScheduleDecision:
        # Arrival order is kept across calls from the state's change set; prefix hits change
        # with the cache, so the short queue is sorted by them afresh.
        by_arrival = ranked(self, state, Queue.WAITING, _arrival_key)
        if len(state.waiting) <= self.max_sort_queue:
            waiting: Iterable[RequestView] = sorted(state.waiting, key=_lpm_key)
        else:
            waiting = by_arrival.views(state)
        return fill_step(state, state.running, waiting, max_repeat_steps=self.max_repeat_steps)
