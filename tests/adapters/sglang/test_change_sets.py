"""The SGLang adapter's StepState change sets equal the difference of consecutive full snapshots
(issue 21): random arrivals, departures, running batches and decode progress through the real
``SchedulePolicy.calc_priority`` hook (SGLang's own prefix matching changes queued views);
retraction points show partial, unstamped states that must not disturb the series."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.adapters.sglang.gate import require_sglang

require_sglang()

from sglang.srt.managers.schedule_batch import ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402

from superinfer.policy_core.types import ScheduleDecision  # noqa: E402
from tests.adapters.sglang.test_scheduling import Scripted  # noqa: E402
from tests.adapters.sglang.worlds import World, arrive, make_adapter, make_req  # noqa: E402
from tests.change_sets import assert_change_sets_exact  # noqa: E402


@pytest.mark.parametrize("seed", range(4))
def test_sglang_change_sets_equal_the_snapshot_difference(seed: int) -> None:
    rng = random.Random(seed)
    world = World(512, "priority", "python")
    policy = Scripted(lambda s: ScheduleDecision())
    adapter = make_adapter(policy, world=world)
    queue: list[Any] = []
    running = ScheduleBatch(reqs=[])
    count = 0
    for _ in range(25):
        for _ in range(rng.choice([0, 1, 2])):
            count += 1
            first = rng.choice([0, 1000 * count])  # 0: shares a prefix with earlier requests
            arrive(adapter, queue, make_req(f"r{count}", rng.randint(2, 12), first=first,
                                            slo=rng.choice(["chat", "batch"])))  # fmt: skip
        roll = rng.random()
        if roll < 0.2 and queue and not running.reqs:  # the head of the queue starts running
            start, queue[:] = queue[:2], queue[2:]
            running = world.prefill(start)
        elif roll < 0.3 and queue:
            queue.pop(rng.randrange(len(queue)))  # aborted while waiting
        elif roll < 0.4:
            running = ScheduleBatch(reqs=[])  # the batch finished
        for req in running.reqs:
            if rng.random() < 0.5:
                req.output_ids.append(1)  # decoded a token: its view changes
        if rng.random() < 0.2 and running.reqs:
            adapter.state([], running.reqs)  # a retraction point's partial state: unstamped
        adapter.calc_priority(SchedulePolicy.calc_priority,
                              SchedulePolicy("fcfs", world.cache, False, True, False),
                              queue, running)  # fmt: skip
    assert assert_change_sets_exact(policy.states) == len(policy.states) == 25
