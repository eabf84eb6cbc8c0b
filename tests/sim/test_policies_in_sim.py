"""Every registered policy drives the simulator on a real trace slice under KV pressure:
every decision is applicable, the books balance after every step, every request ends."""

from __future__ import annotations

import pytest

from superinfer.adapters.manager import available_policies
from superinfer.harness.policies import build_policy
from superinfer.harness.workload.workload import build_workload
from superinfer.policy_core.policies.superinfer import SuperInferPolicy
from superinfer.sim.request import RequestStatus
from tests.sim.helpers import simulate


@pytest.mark.parametrize("name", sorted(available_policies()))
def test_policy_runs_the_trace_with_invariants(name: str) -> None:
    workload = build_workload("azure", duration_s=40.0)
    policy = build_policy(name, {}, workload)
    result, observer = simulate(list(workload.requests), policy, num_gpu_blocks_override=2500)
    statuses = {r.status for r in result.requests}
    assert statuses <= {RequestStatus.FINISHED, RequestStatus.REJECTED}
    for r in result.requests:
        if r.status is RequestStatus.REJECTED:
            assert r.reason  # shed or refused with a reason, never silently
        else:
            assert r.generated_tokens == r.spec.output_tokens
    assert observer.steps == result.num_steps


def test_superinfer_learns_from_the_engine() -> None:
    workload = build_workload("azure", duration_s=60.0)
    policy = SuperInferPolicy()
    simulate(list(workload.requests), policy)
    # the step-time fit moved off its priors (8B on one A100 prefills far faster than 1.5e-4
    # s per token) and the length estimator has finished chat requests to learn from
    assert policy.step_time.num_observations > 100
    assert policy.step_time.prefill_token_s < 1e-4
    assert policy.estimator.num_samples("chat") >= 32
