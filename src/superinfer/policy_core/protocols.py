"""The interface a scheduling policy implements, and a base class with no-op lifecycle methods."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from superinfer.policy_core.types import RequestView, ScheduleDecision, StepState, StepStats

__all__ = ["BasePolicy", "SchedulerPolicy"]


@runtime_checkable
class SchedulerPolicy(Protocol):
    """A pure scheduling policy: one decision method plus lifecycle notifications.

    Policies never read the clock, do no I/O and never mutate their inputs; time arrives as
    ``StepState.now_s``. The same object runs in the simulator and inside real engines, where the
    adapters call it through the ``superinfer_*`` hooks.
    """

    name: str

    def schedule(self, state: StepState) -> ScheduleDecision:
        """Decide the next step of one replica.

        Args:
            state: the replica's queues, free KV blocks and step limits.

        Returns:
            The decision; see ``ScheduleDecision`` for what the engine checks.
        """
        ...

    def on_request_arrived(self, request: RequestView, now_s: float) -> None:
        """A request entered the engine (``now_s`` in s)."""
        ...

    def on_request_finished(self, request: RequestView, now_s: float) -> None:
        """A request produced its last token; ``request`` is its final view."""
        ...

    def on_step_finished(self, stats: StepStats) -> None:
        """A step (or a run of repeated steps) ended."""
        ...


class BasePolicy:
    """Convenience base: no-op lifecycle methods; subclasses implement ``schedule``."""

    name: str = "base"

    def schedule(self, state: StepState) -> ScheduleDecision:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_request_arrived(self, request: RequestView, now_s: float) -> None:
        return None

    def on_request_finished(self, request: RequestView, now_s: float) -> None:
        return None

    def on_request_aborted(self, request: RequestView, now_s: float, reason: str) -> None:
        """A request ended without finishing (rejected or failed); optional, not in the protocol,
        forwarded by the plugin manager when a policy has it."""
        return None

    def on_step_finished(self, stats: StepStats) -> None:
        return None
