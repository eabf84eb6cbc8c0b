"""The ``superinfer`` policy as a package of layered modules: sizes, import direction between
the layers, the public names entry points and the oracle rely on, and the option list."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

import superinfer.policy_core.policies.superinfer as package
from superinfer.adapters.manager import policy_options
from superinfer.policy_core.policies.oracle import OraclePolicy
from superinfer.policy_core.policies.superinfer import SuperInferPolicy

PKG = Path(package.__file__).parent
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
PREFIX = "superinfer.policy_core.policies.superinfer."
#: Bottom to top: a module may import only the modules before it.
LAYERS = (
    "due_queue",
    "records",
    "config",
    "estimates",
    "queues",
    "preemption",
    "admission",
    "promotion",
    "running",
    "budget",
    "rotation",
    "policy",
)


def test_every_module_is_a_layer_and_none_is_over_400_lines() -> None:
    modules = {p.stem for p in PKG.glob("*.py")} - {"__init__"}
    assert modules == set(LAYERS)
    for path in PKG.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path.name


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    tree = ast.parse((PKG / f"{layer}.py").read_text())
    imported = {
        node.module.removeprefix(PREFIX)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX)
    }
    below = set(LAYERS[: LAYERS.index(layer)])
    assert imported <= below, imported - below


def test_schedule_stays_short() -> None:
    tree = ast.parse((PKG / "policy.py").read_text())
    (schedule,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "schedule"
    ]
    assert schedule.end_lineno is not None and schedule.end_lineno - schedule.lineno < 50


def test_the_policy_entry_points_stay_importable() -> None:
    targets = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"]["superinfer.policies"]
    assert targets["superinfer"] == "superinfer.policy_core.policies.superinfer:SuperInferPolicy"
    for target in targets.values():
        module, attr = target.split(":")
        assert isinstance(getattr(importlib.import_module(module), attr), type), target
    assert package.__all__ == ["SuperInferPolicy"]
    assert package.SuperInferPolicy is SuperInferPolicy


def test_the_options_and_their_order_are_unchanged() -> None:
    expected = [
        "num_tiers",
        "quantum_base_tokens",
        "quantum_growth",
        "tier_weight_ratio",
        "deadline_class_tier",
        "rotation_unit_tokens",
        "tpot_safety",
        "min_prefill_tokens",
        "ttft_boost",
        "ttft_reserve_quantile",
        "ttft_plan_fraction",
        "first_token_guard",
        "credit_quantile",
        "promotion",
        "promotion_margin_s",
        "estimate_lookahead",
        "best_effort_demotion",
        "best_effort_tier",
        "reject_hopeless",
        "aging",
        "aging_s",
        "aging_deadline_fraction",
        "fcfs_guard",
        "max_waiting_per_tier",
        "rotation",
        "rotation_slice_tokens",
        "rotation_watermark",
        "swap_budget_fraction",
        "kv_watermark",
        "max_preemptions_per_step",
        "recheck_s",
        "max_repeat_steps",
        "estimator_window",
        "estimator_min_samples",
        "prior_step_s",
        "prior_prefill_token_s",
        "prior_decode_seq_s",
        "step_time_forgetting",
        "ttft_boost_whole",
        "min_prefill_budget_share",
        "ttft_kv_reserve_requests",
        "tpot_plan_share",
        "ttft_seat_reserve",
        "serial_whole_prefills",
        "ttft_reserve_idle_s",
        "credit_step_memory",
        "yield_decodes",
        "ttft_reserve_mixed",
        "ttft_reserve_beside_chats",
        "ttft_reserve_shed_s",
        "ttft_boost_unmixed",
        "decode_interval_memory",
        "unmixed_credit_quantile",
        "prefill_floor_yields",
    ]
    assert list(policy_options(SuperInferPolicy)) == expected
    assert list(policy_options(OraclePolicy)) == [*expected, "output_tokens"]
    assert dataclasses.is_dataclass(SuperInferPolicy) and SuperInferPolicy().name == "superinfer"


def test_the_oracle_is_the_policy_with_true_lengths() -> None:
    oracle = OraclePolicy(output_tokens={"r": 10})
    assert isinstance(oracle, SuperInferPolicy) and oracle.name == "oracle"
    assert (oracle.aging, oracle.reject_hopeless) == (False, True)
    assert package._opt(3, "help").metadata == {"help": "help"}  # the oracle's field helper
