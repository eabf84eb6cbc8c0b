"""``superinfer``'s hyperparameters are checked for their type on construction, with a one-line
error naming the field: a string or a bool where a number is asked for would otherwise pass (or
crash) the range checks, and a string where a bool is asked for would read as true."""

from __future__ import annotations

from dataclasses import fields
from typing import get_type_hints

import numpy as np
import pytest

from superinfer.policy_core.policies.superinfer import SuperInferPolicy
from superinfer.policy_core.policies.superinfer.config import _RANGES, SuperInferConfig


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("num_tiers", "3", "superinfer: num_tiers must be int, got '3'"),
        ("num_tiers", 3.0, "superinfer: num_tiers must be int, got 3.0"),
        ("num_tiers", True, "superinfer: num_tiers must be int, got True"),
        ("tpot_safety", "0.9", "superinfer: tpot_safety must be float, got '0.9'"),
        ("tpot_safety", False, "superinfer: tpot_safety must be float, got False"),
        (
            "serial_whole_prefills",
            "false",
            "superinfer: serial_whole_prefills must be bool, got 'false'",
        ),
        ("ttft_boost", 0, "superinfer: ttft_boost must be bool, got 0"),
        ("best_effort_tier", 1, "superinfer: best_effort_tier must be str, got 1"),
    ],
)
def test_a_value_of_the_wrong_type_is_a_one_line_error(
    option: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        SuperInferPolicy(**{option: value})


def test_an_int_is_a_float_and_values_of_their_type_pass() -> None:
    policy = SuperInferPolicy(tpot_safety=1, aging_s=30, serial_whole_prefills=False)
    assert (policy.tpot_safety, policy.aging_s, policy.serial_whole_prefills) == (1, 30, False)
    # numpy's numbers are numbers (a value read from a table)
    policy = SuperInferPolicy(num_tiers=np.int64(3), tpot_safety=np.float64(0.8))
    assert (policy.num_tiers, policy.tpot_safety) == (3, 0.8)


def test_every_numeric_option_has_a_range_and_a_value_outside_it_is_a_one_line_error() -> None:
    hints = get_type_hints(SuperInferConfig)
    numeric = {f.name for f in fields(SuperInferConfig) if hints[f.name] in (int, float)}
    assert numeric - set(_RANGES) == {"deadline_class_tier"}  # checked against num_tiers
    assert set(_RANGES) <= numeric
    outside = {">= 1": 0, "(0, 1]": 0.0, "[0, 1]": 1.5, "[0, 1)": 1.0, "> 0": 0, ">= 0": -1}
    shown = {">= 1": ">= 1", "> 0": "> 0", ">= 0": ">= 0"}
    for option, bounds in _RANGES.items():
        value = outside[bounds]
        if hints[option] is float:
            value = float(value)
        where = shown.get(bounds, f"in {bounds}")
        message = f"superinfer: {option} must be {where}, got {value}"
        with pytest.raises(ValueError) as err:
            SuperInferPolicy(**{option: value})
        assert str(err.value) == message
    with pytest.raises(ValueError, match=r"^superinfer: tpot_safety must be in \(0, 1\], got nan$"):
        SuperInferPolicy(tpot_safety=float("nan"))
