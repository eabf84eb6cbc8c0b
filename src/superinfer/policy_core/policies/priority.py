"""``priority``: strict SLO-class priority, then arrival (vLLM ``--scheduling-policy priority``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from superinfer.policy_core.batching import fill_step
from superinfer.policy_core.changes import ranked
from superinfer.policy_core.policies.fcfs import DEFAULT_MAX_REPEAT_STEPS
from superinfer.policy_core.protocols import BasePolicy
from superinfer.policy_core.types import Queue, RequestView, ScheduleDecision, StepState

__all__ = ["PriorityPolicy"]


def _priority_key(view: RequestView) -> tuple[int, float, str]:
    return (view.slo.priority, view.arrival_s, view.request_id)


@dataclass
class PriorityPolicy(BasePolicy):
    """Rank by ``SLO.priority`` (lower is more urgent), then by arrival.

    As in vLLM v1's priority policy (``vllm/v1/core/sched/scheduler.py``, v0.11): the ranking
    orders both queues, and when a running request needs a KV block the victim is the running
    request ranked last (largest ``(priority, arrival)``). A waiting request never preempts a
    running one; it is admitted when it fits.

    Attributes:
        max_repeat_steps: most decode-only steps the engine may repeat without asking again.
    """

    max_repeat_steps: int = field(
        default=DEFAULT_MAX_REPEAT_STEPS,
        metadata={"help": "most decode-only steps the engine may repeat without asking again"},
    )
    name: str = "priority"

    def __post_init__(self) -> None:
        if self.max_repeat_steps < 1:
            raise ValueError(
                f"priority: max_repeat_steps must be >= 1, got {self.max_repeat_steps}"
            )

    def schedule(self, state: StepState) -> ScheduleDecision:
        # Both queues in key order, kept across calls from the state's change set.
        running = ranked(self, state, Queue.RUNNING, _priority_key).ordered(state)
        waiting = ranked(self, state, Queue.WAITING, _priority_key).views(state)
        return fill_step(state, running, waiting, max_repeat_steps=self.max_repeat_steps)
