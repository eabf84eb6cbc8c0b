"""The plugin's stats file and the ``sglang`` bench runner's wiring (no server started here)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from superinfer.adapters.sglang.stats import LatencyStats, StatsFile, Telemetry, read_stats
from superinfer.harness.engines import sglang as sglang_runner
from superinfer.harness.engines.base import BenchConfig, CellResult
from superinfer.harness.errors import UserError


@dataclass
class Counters:
    decisions: int = 3
    preempted: int = 1


def test_latency_stats_sum_count_and_percentiles_in_microseconds() -> None:
    stats = LatencyStats()
    assert stats.as_dict() == {"sum": 0.0, "count": 0, "p50": None, "p99": None}
    for ms in range(1, 101):
        stats.add(ms / 1000)
    assert stats.as_dict() == {"sum": 5050000.0, "count": 100, "p50": 51000.0, "p99": 100000.0}


def test_stats_file_is_rewritten_atomically_and_rate_limited(tmp_path: Path) -> None:
    path = tmp_path / "s" / "stats.json"
    assert read_stats(path) is None
    telemetry = Telemetry(str(path), {"policy": "superinfer"})
    telemetry.policy.add(0.0001)
    assert telemetry.publish(Counters(), kv={"in_use": 0})
    first = read_stats(path)
    assert first is not None
    first.pop("written_unix_s")
    assert first == {
        "policy": "superinfer", "decisions": 3, "preempted": 1, "kv": {"in_use": 0}, "steps": 0,
        "policy_us": {"sum": 100.0, "count": 1, "p50": 100.0, "p99": 100.0},
        "step_us": {"sum": 0.0, "count": 0, "p50": None, "p99": None},
        "placement_us": {"sum": 0.0, "count": 0, "p50": None, "p99": None},
    }  # fmt: skip
    assert not telemetry.publish(Counters(decisions=4))  # within the interval
    assert telemetry.publish(Counters(decisions=5), force=True)
    assert json.loads(path.read_text())["decisions"] == 5
    assert sorted(p.name for p in path.parent.iterdir()) == ["stats.json"]  # no temporaries left
    assert not Telemetry(None, {}).publish(Counters(), force=True)
    (tmp_path / "file").write_text("")
    assert not StatsFile(tmp_path / "file" / "x.json", {}).maybe_write(Counters(), {}, force=True)


def test_the_policy_counters_are_read_only_for_a_snapshot(tmp_path: Path) -> None:
    path, calls = tmp_path / "stats.json", []

    def counters() -> dict[str, int]:
        calls.append(len(calls))
        return {"ttft_boosts": len(calls), "rejected": 0}

    telemetry = Telemetry(str(path), {}, policy_stats=counters)
    assert telemetry.publish(Counters())
    assert not telemetry.publish(Counters())  # within the interval: the policy is not asked
    assert telemetry.publish(Counters(), force=True)
    assert calls == [0, 1]
    assert read_stats(path)["policy_stats"] == {"ttft_boosts": 2, "rejected": 0}  # type: ignore[index]


class FakeServer:
    instances: list[FakeServer] = []

    def __init__(self, policy: str, args: list[str], **kwargs: Any) -> None:
        self.policy, self.args, self.kwargs = policy, args, kwargs
        self.url = "http://127.0.0.1:1"
        self.log_path = Path(kwargs["log_path"])
        self.startup_s, self.recipe_line, self.plugin = 41.04, "superinfer: cpu", True
        self.argv = ["python", "-m", "sglang.launch_server", *args]
        self.events: list[str] = []
        FakeServer.instances.append(self)

    def start(self) -> FakeServer:
        self.events.append("start")
        return self

    def stop(self) -> int:
        self.events.append("stop")
        return 0

    def stats(self) -> dict[str, int]:
        return {"decisions": 7}


def test_the_runner_starts_replays_through_http_and_stops(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import superinfer.adapters.sglang.server as server_mod
    import superinfer.harness.engines.http as http_mod

    seen: dict[str, Any] = {}

    def fake_http(config: BenchConfig, engine: str, policy: str, workload: Any) -> CellResult:
        seen.update(url=config.url, backend=config.backend, options=dict(config.engine_options))
        FakeServer.instances[-1].events.append("replay")
        return CellResult(requests=None, kv_peak_bytes={}, timeline=None, info={"wall_s": 1.0})  # type: ignore[arg-type]

    monkeypatch.setattr(server_mod, "SGLangServer", FakeServer)
    monkeypatch.setattr(http_mod, "run_http_cell", fake_http)
    config = BenchConfig(
        kv_policy="reuse",
        engine_options={
            "sglang_args": "--max-total-tokens 2048",
            "sglang_log_dir": str(tmp_path),
            "prompt": "ids",
        },
    )
    result = sglang_runner.run_sglang_cell(config, "sglang", "superinfer", workload=None)  # type: ignore[arg-type]
    server = FakeServer.instances[-1]
    assert server.events == ["start", "replay", "stop"]
    assert (server.policy, server.args, server.kwargs["kv_policy"]) == (
        "superinfer", ["--max-total-tokens", "2048"], "reuse",
    )  # fmt: skip
    assert seen == {"url": "http://127.0.0.1:1", "backend": "sglang", "options": {"prompt": "ids"}}
    assert result.info["sglang"] == {
        "log": str(tmp_path / "sglang-superinfer.log"), "startup_s": 41.0,
        "argv": ["--max-total-tokens", "2048"], "cpu_recipe": "superinfer: cpu", "plugin": True,
        "plugin_stats": {"decisions": 7},
    }  # fmt: skip
    sglang_runner.run_sglang_cell(config, "sglang", "native", workload=None)  # type: ignore[arg-type]
    assert FakeServer.instances[-1].kwargs["kv_policy"] is None  # native: no plugin
    bad = BenchConfig(engine_options={"sglang_start_timeout_s": "soon"})
    with pytest.raises(UserError, match="sglang_start_timeout_s='soon' is not a number"):
        sglang_runner.run_sglang_cell(bad, "sglang", "native", workload=None)  # type: ignore[arg-type]
