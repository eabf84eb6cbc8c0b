"""``--policy-opt`` resolution and how the runner builds each policy."""

from __future__ import annotations

import pytest

from superinfer.harness.errors import UserError
from superinfer.harness.policies import build_policy, merge_policy_opts, resolve_policy_opts
from superinfer.harness.workload.workload import Workload
from superinfer.policy_core.policies.oracle import OraclePolicy
from superinfer.sim.request import RequestSpec
from tests.factories import CHAT


def test_plain_keys_go_to_every_policy_that_has_them() -> None:
    got = resolve_policy_opts(
        ["fcfs", "superinfer", "mlfq"], ["max_repeat_steps=4", "quantum_base_tokens=512"]
    )
    assert got == {
        "fcfs": {"max_repeat_steps": "4"},
        "superinfer": {"max_repeat_steps": "4", "quantum_base_tokens": "512"},
        "mlfq": {"quantum_base_tokens": "512"},
    }


def test_prefixed_keys_go_to_one_policy_and_later_ones_win() -> None:
    got = resolve_policy_opts(
        ["fcfs", "superinfer"], ["max_repeat_steps=4", "superinfer.max_repeat_steps=9"]
    )
    assert got == {"fcfs": {"max_repeat_steps": "4"}, "superinfer": {"max_repeat_steps": "9"}}


@pytest.mark.parametrize(
    "opt, message",
    [
        ("aging_s", "expected key=value or policy.key=value"),
        ("nosuch=1", "no selected policy has option 'nosuch'"),
        ("edf.aging_s=1", "policy 'edf' is not among the selected (fcfs, superinfer)"),
        ("fcfs.aging_s=1", "policy 'fcfs' has no option 'aging_s' (options: max_repeat_steps)"),
    ],
)
def test_mistakes_name_the_option(opt: str, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_policy_opts(["fcfs", "superinfer"], [opt])


def test_the_oracle_is_built_with_the_workloads_true_lengths() -> None:
    specs = (
        RequestSpec("a", 0.0, 10, 7, 100, CHAT),
        RequestSpec("b", 1.0, 10, 3, 100, CHAT),
    )
    workload = Workload("t", specs, (), 1.0, None)
    oracle = build_policy("oracle", {"aging_s": "30"}, workload)
    assert isinstance(oracle, OraclePolicy)
    assert dict(oracle.output_tokens) == {"a": 7, "b": 3} and oracle.aging_s == 30.0
    assert build_policy("fcfs", {}, workload) == "fcfs"  # by name: the manager builds it


def test_merge_policy_opts_lays_the_strings_over_each_policys_options() -> None:
    options = {"superinfer": {"aging_s": "5", "recheck_s": "2"}, "fcfs": {}, "edf": {"x": "1"}}
    got = merge_policy_opts(options, ["superinfer", "fcfs"], ["superinfer.aging_s=9"])
    assert got == {"superinfer": {"aging_s": "9", "recheck_s": "2"}, "fcfs": {}}
    assert options["superinfer"]["aging_s"] == "5"  # not changed in place
