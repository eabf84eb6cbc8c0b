"""The simulator tells a policy which replica a state and a request belong to."""

from __future__ import annotations

from superinfer.policy_core.policies.fcfs import FCFSPolicy
from superinfer.policy_core.types import RequestView, ScheduleDecision, StepState
from superinfer.sim.profiles import SIM_SGLANG, SIM_VLLM
from tests.sim.helpers import simulate, spec


class Recorder(FCFSPolicy):
    """FCFS that records what it was shown."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived: dict[str, int] = {}
        self.seen: set[tuple[int, str, int]] = set()
        self.mixed: set[bool] = set()

    def on_request_arrived(self, request: RequestView, now_s: float) -> None:
        self.arrived[request.request_id] = request.replica

    def schedule(self, state: StepState) -> ScheduleDecision:
        self.mixed.add(state.mixed_batches)
        for v in (*state.waiting, *state.running):
            self.seen.add((state.replica, v.request_id, v.replica))
        return super().schedule(state)


def test_states_and_views_carry_the_replica() -> None:
    recorder = Recorder()
    specs = [spec(f"r{i}", 0.1 * i, prompt=50, output=3) for i in range(6)]
    simulate(specs, recorder, replicas=3)
    assert recorder.arrived == {f"r{i}": i % 3 for i in range(6)}  # round robin
    assert {(rep, rid) for rep, rid, _ in recorder.seen} >= {(i % 3, f"r{i}") for i in range(6)}
    assert all(rep == view_rep for rep, _, view_rep in recorder.seen)


def test_states_say_whether_a_step_mixes_prefill_and_decodes() -> None:
    # sim:vllm mixes them (chunked prefill); sim:sglang runs a prefill batch alone (SGLang
    # without --enable-mixed-chunk), and tells the policy so
    specs = [spec(f"r{i}", 0.1 * i, prompt=50, output=3) for i in range(3)]
    for profile, mixed in ((SIM_VLLM, True), (SIM_SGLANG, False)):
        recorder = Recorder()
        simulate(specs, recorder, profile=profile)
        assert recorder.mixed == {mixed}
