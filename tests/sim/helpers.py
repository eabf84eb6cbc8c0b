"""Helpers to run small simulations with an invariant-checking observer."""

from __future__ import annotations

from collections.abc import Sequence

from superinfer.adapters.hookspecs import hookimpl
from superinfer.adapters.manager import build_plugin_manager
from superinfer.policy_core.types import SLO, StepStats
from superinfer.sim.config import SimConfig, SimResult
from superinfer.sim.engine import Simulator
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.profiles import SIM_VLLM
from superinfer.sim.request import RequestSpec

CHAT = SLO("chat", ttft_ms=1000.0, tpot_ms=100.0)


class InvariantObserver:
    """Checks the simulator's books after every step and counts the steps it saw."""

    name = "invariants"

    def __init__(self) -> None:
        self.sim: Simulator | None = None
        self.steps = 0

    @hookimpl
    def superinfer_step_finished(self, stats: StepStats) -> None:
        assert self.sim is not None
        self.sim.check_invariants()
        assert stats.used_hbm_blocks <= stats.total_hbm_blocks
        self.steps += stats.num_steps


def spec(rid: str, arrival_s: float, prompt: int, output: int, slo: SLO = CHAT) -> RequestSpec:
    return RequestSpec(rid, arrival_s, prompt, output, max(output, 16), slo)


def config(**kwargs: object) -> SimConfig:
    base: dict[str, object] = {
        "profile": SIM_VLLM,
        "model": get_model("llama-3.1-8b"),
        "gpu": get_gpu("a100-80gb"),
        "tp": 1,
    }
    base.update(kwargs)
    return SimConfig(**base)  # type: ignore[arg-type]


def simulate(
    specs: Sequence[RequestSpec],
    policy: object = "fcfs",
    *,
    options: dict[str, str] | None = None,
    **config_kwargs: object,
) -> tuple[SimResult, InvariantObserver]:
    """Run ``specs`` with invariants checked after every step."""
    pm = build_plugin_manager(policy, options)  # type: ignore[arg-type]
    sim = Simulator(config(**config_kwargs), pm.hook)
    observer = InvariantObserver()
    observer.sim = sim
    pm.register(observer)
    result = sim.run(specs)
    return result, observer
