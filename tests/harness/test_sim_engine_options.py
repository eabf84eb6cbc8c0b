"""The ``sim:<profile>`` engine options (``harness.engines.sim.sim_options``): counts, and the
``mixed_batches`` switch (SGLang's ``--enable-mixed-chunk`` on sim:sglang) reaching the
simulator's profile."""

from __future__ import annotations

from typing import Any

import pytest

from superinfer.harness.conform.workloads import make_workload, request
from superinfer.harness.engines import sim
from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.errors import UserError
from superinfer.policy_core.types import SLO


def test_sim_options_parse_counts_and_the_mixed_batches_switch() -> None:
    got = sim.sim_options({"max_num_seqs": "8", "mixed_batches": "0", "num_gpu_blocks": "64"})
    assert got == {"max_num_seqs": 8, "mixed_batches": 0, "num_gpu_blocks": 64}
    with pytest.raises(UserError, match="^--engine-option mixed_batches must be 0 or 1, got 2$"):
        sim.sim_options({"mixed_batches": "2"})
    with pytest.raises(UserError, match="^--engine-option max_num_seqs must be >= 1, got 0$"):
        sim.sim_options({"max_num_seqs": "0"})


@pytest.mark.parametrize(("option", "mixed"), [(None, False), ("1", True), ("0", False)])
def test_mixed_batches_sets_the_profile_the_simulator_runs(
    monkeypatch: pytest.MonkeyPatch, option: str | None, mixed: bool
) -> None:
    seen: list[Any] = []
    real = sim.Simulator

    def recording(config: Any, hook: Any, **kw: Any) -> Any:
        seen.append(config.profile)
        return real(config, hook, **kw)

    monkeypatch.setattr(sim, "Simulator", recording)
    opts = {"max_num_seqs": "4"} | ({"mixed_batches": option} if option is not None else {})
    config = BenchConfig(engines=("sim:sglang",), replicas=1, engine_options=opts)
    chat = SLO("chat", ttft_ms=1000.0, tpot_ms=100.0, priority=0)
    wl = make_workload("mixed", [request("a", 0.0, 64, 4, chat), request("b", 0.01, 64, 4, chat)])
    cell = sim.run_sim_cell(config, "sim:sglang", "fcfs", wl)
    (profile,) = seen
    assert (profile.mixed_batches, profile.max_num_seqs) == (mixed, 4)  # sglang 0.5.23: False
    assert list(cell.requests.status) == ["finished", "finished"]
