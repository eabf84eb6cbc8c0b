"""``edf``: earliest TTFT deadline first."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from superinfer.policy_core.batching import fill_step
from superinfer.policy_core.changes import ranked
from superinfer.policy_core.policies.fcfs import DEFAULT_MAX_REPEAT_STEPS
from superinfer.policy_core.protocols import BasePolicy
from superinfer.policy_core.types import Queue, RequestView, ScheduleDecision, StepState

__all__ = ["EDFPolicy", "ttft_deadline_s"]


def ttft_deadline_s(view: RequestView) -> float:
    """The instant ``view``'s first token is due: ``arrival + ttft`` for a class with a TTFT
    target, else ``arrival + deadline`` for a class with only a deadline, else infinity."""
    slo = view.slo
    if slo.ttft_ms is not None:
        return view.arrival_s + slo.ttft_ms / 1e3
    if slo.deadline_s is not None:
        return view.arrival_s + slo.deadline_s
    return math.inf


def _edf_key(view: RequestView) -> tuple[float, float, str]:
    return (ttft_deadline_s(view), view.arrival_s, view.request_id)


@dataclass
class EDFPolicy(BasePolicy):
    """Rank every request by its first-token deadline, earliest first, then by arrival.

    The classic real-time rule (Liu and Layland, JACM 1973) applied to TTFT: it knows each
    class's targets but not output lengths, and it never preempts for a deadline (a waiting
    request is admitted when it fits; victims of a KV shortage are the latest deadlines).
    Batch formation is :func:`fill_step` (vLLM v1 style).
    """

    max_repeat_steps: int = field(
        default=DEFAULT_MAX_REPEAT_STEPS,
        metadata={"help": "most decode-only steps the engine may repeat without asking again"},
    )
    name: str = "edf"

    def __post_init__(self) -> None:
        if self.max_repeat_steps < 1:
            raise ValueError(f"edf: max_repeat_steps must be >= 1, got {self.max_repeat_steps}")

    def schedule(self, state: StepState) -> ScheduleDecision:
        # Both queues in key order, kept across calls from the state's change set.
        running = ranked(self, state, Queue.RUNNING, _edf_key).ordered(state)
        waiting = ranked(self, state, Queue.WAITING, _edf_key).views(state)
        return fill_step(state, running, waiting, max_repeat_steps=self.max_repeat_steps)
