"""``fcfs``: first come, first served, as vLLM schedules by default."""

from __future__ import annotations

from dataclasses import dataclass, field

from superinfer.policy_core.batching import fill_step
from superinfer.policy_core.changes import ranked
from superinfer.policy_core.protocols import BasePolicy
from superinfer.policy_core.types import Queue, RequestView, ScheduleDecision, StepState

__all__ = ["FCFSPolicy"]

#: Decode-only FCFS steps only change at an arrival, a finish or a KV shortage, at which the
#: engine stops repeating, so any bound is exact; this one only limits how long an engine goes
#: without asking.
DEFAULT_MAX_REPEAT_STEPS = 1024


def _arrival_key(view: RequestView) -> tuple[float, str]:
    return (view.arrival_s, view.request_id)


@dataclass
class FCFSPolicy(BasePolicy):
    """Serve in arrival order (vLLM ``--scheduling-policy fcfs``, ``vllm/v1/core/sched``).

    Running requests keep their admission order, so the most recently admitted one is preempted
    first (vLLM v1 pops the tail of ``running``); waiting requests are admitted oldest first, and
    admission stops at the first one that does not fit.

    Attributes:
        max_repeat_steps: most decode-only steps the engine may repeat without asking again.
    """

    max_repeat_steps: int = field(
        default=DEFAULT_MAX_REPEAT_STEPS,
        metadata={"help": "most decode-only steps the engine may repeat without asking again"},
    )
    name: str = "fcfs"

    def __post_init__(self) -> None:
        if self.max_repeat_steps < 1:
            raise ValueError(f"fcfs: max_repeat_steps must be >= 1, got {self.max_repeat_steps}")

    def schedule(self, state: StepState) -> ScheduleDecision:
        # The waiting queue in arrival order, kept across calls from the state's change set.
        waiting = ranked(self, state, Queue.WAITING, _arrival_key).views(state)
        return fill_step(state, state.running, waiting, max_repeat_steps=self.max_repeat_steps)
