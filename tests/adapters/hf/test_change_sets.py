"""The hf adapter's StepState change sets equal the difference of consecutive full snapshots
(issue 21), over random arrivals and steps of the real transformers scheduler classes, with
fcfs deciding (the 8-block cache makes it preempt)."""

from __future__ import annotations

import random

import pytest

from tests.adapters.hf.conftest import required

if not required():
    pytest.importorskip("transformers", reason="transformers missing: run `make install-hf`")

from superinfer.adapters.hookspecs import hookimpl
from superinfer.policy_core.policies.fcfs import FCFSPolicy
from superinfer.policy_core.types import ScheduleDecision, StepState
from tests.adapters.hf.test_scheduler import BATCH, CHAT, Recorder, arrive, make_scheduler, run_step
from tests.change_sets import assert_change_sets_exact


class FCFSRecorder(Recorder):
    """Records every state; fcfs answers."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = FCFSPolicy()

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        self.states.append(state)
        return self.policy.schedule(state)


@pytest.mark.parametrize("seed", range(6))
def test_hf_change_sets_equal_the_snapshot_difference(seed: int) -> None:
    rng = random.Random(seed)
    rec = FCFSRecorder()
    scheduler, binding = make_scheduler(rec)
    count = 0
    for _ in range(60):
        for _ in range(rng.choice([0, 0, 1, 2])):
            count += 1
            arrive(scheduler, binding, f"r{count}", rng.randint(1, 12), rng.randint(1, 6),
                   rng.choice([CHAT, BATCH]))  # fmt: skip
        batch, *_ = scheduler.schedule_batch(16, 32)
        run_step(scheduler, batch or [])
    stamped = assert_change_sets_exact(rec.states)
    assert stamped == len(rec.states) > 20
    assert any(s.changes and s.changes.running.changed for s in rec.states)
