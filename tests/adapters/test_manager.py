"""The plugin manager: policies found by name through entry points, hooks checked at startup."""

from __future__ import annotations

import pluggy
import pytest

from superinfer.adapters.hookspecs import hookimpl
from superinfer.adapters.manager import (
    PolicyPlugin,
    UnknownPolicyError,
    available_policies,
    build_plugin_manager,
)
from superinfer.policy_core.policies.fcfs import FCFSPolicy
from superinfer.policy_core.types import ScheduleDecision, StepState
from tests.factories import make_state, make_view


def test_builtins_are_registered_as_entry_points() -> None:
    registry = available_policies()
    assert {"fcfs", "priority"} <= set(registry)
    assert registry["fcfs"].value == "superinfer.policy_core.policies.fcfs:FCFSPolicy"


def test_builds_a_policy_by_name_with_typed_options() -> None:
    pm = build_plugin_manager("fcfs", {"max_repeat_steps": "3"})
    (plugin,) = [p for p in pm.get_plugins() if isinstance(p, PolicyPlugin)]
    assert plugin.policy == FCFSPolicy(max_repeat_steps=3)
    state = make_state(waiting=[make_view("a", prompt=8)])
    assert pm.hook.superinfer_schedule(state=state).admit == ("a",)


def test_unknown_policy_names_the_registered_ones() -> None:
    with pytest.raises(UnknownPolicyError, match=r"unknown policy 'fifo'; registered: .*fcfs"):
        build_plugin_manager("fifo")


def test_bad_options_are_one_line_errors() -> None:
    with pytest.raises(UnknownPolicyError, match="has no option 'quantum'"):
        build_plugin_manager("fcfs", {"quantum": "3"})
    with pytest.raises(UnknownPolicyError, match="max_repeat_steps='many' is not of type int"):
        build_plugin_manager("fcfs", {"max_repeat_steps": "many"})
    with pytest.raises(UnknownPolicyError, match="must be >= 1"):
        build_plugin_manager("fcfs", {"max_repeat_steps": "0"})


def test_a_ready_plugin_is_registered_as_is() -> None:
    class EmptySteps:
        name = "empty"

        @hookimpl
        def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
            return ScheduleDecision()

    pm = build_plugin_manager(EmptySteps())
    assert pm.hook.superinfer_schedule(state=make_state()) == ScheduleDecision()


def test_a_misspelt_hook_fails_at_startup() -> None:
    class Misspelt:
        name = "misspelt"

        @hookimpl
        def superinfer_schedul(self, state: StepState) -> ScheduleDecision:  # sic
            return ScheduleDecision()

    with pytest.raises(pluggy.PluginValidationError, match="superinfer_schedul"):
        build_plugin_manager(Misspelt())
