"""The check every engine's ``StepState`` change set must pass (issue 21): per series, each
stamped state's ``changes`` equals the difference of it and the previous stamped state of the
same series (``policy_core.changes.diff_states``), and ``views`` / ``queue_of`` equal the maps
built from its queues."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from superinfer.adapters.hookspecs import hookimpl
from superinfer.policy_core.changes import diff_states
from superinfer.policy_core.types import Queue, ScheduleDecision, StepState


def assert_change_sets_exact(states: Iterable[StepState]) -> int:
    """Check ``states`` (in the order an engine showed them); returns how many were stamped."""
    last: dict[int, StepState] = {}
    stamped = 0
    for state in states:
        ch = state.changes
        if ch is None:
            continue
        stamped += 1
        prev = last.get(ch.series)
        assert ch.base_seq == (0 if prev is None else prev.changes.seq)  # type: ignore[union-attr]
        assert ch.seq == ch.base_seq + 1
        assert (ch.waiting, ch.running, ch.swapped) == diff_states(prev, state), ch
        queues = ((Queue.WAITING, state.waiting), (Queue.RUNNING, state.running),
                  (Queue.SWAPPED, state.swapped))  # fmt: skip
        assert state.views == {v.request_id: v for _, q in queues for v in q}
        assert state.queue_of == {v.request_id: name for name, q in queues for v in q}
        last[ch.series] = state
    return stamped


class StateRecorder:
    """A plugin that records every state it is shown and answers with ``answer(state)``."""

    name = "state_recorder"

    def __init__(self, answer: Callable[[StepState], ScheduleDecision]) -> None:
        self._answer = lambda state: answer(state)  # a bare hookimpl here would confuse pluggy
        self.states: list[StepState] = []

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        self.states.append(state)
        return self._answer(state)
