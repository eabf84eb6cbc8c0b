"""The entry point: inert without ``SUPERINFER_SGLANG=1``; with it, active in a spawned process
exactly as SGLang's scheduler subprocesses load it."""

from __future__ import annotations

import multiprocessing
from collections import defaultdict
from typing import Any

import pytest

from tests.adapters.sglang.gate import require_sglang

require_sglang()

from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # noqa: E402

from superinfer.adapters.sglang import plugin  # noqa: E402
from superinfer.adapters.sglang.plugin import HOOKS, register  # noqa: E402
from tests.adapters.sglang.child import probe  # noqa: E402


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A private HookRegistry table (nothing applied) and the process adapter restored after."""
    hooks: dict[str, Any] = defaultdict(list)
    monkeypatch.setattr(HookRegistry, "_hooks", hooks)
    monkeypatch.setattr(plugin, "_ADAPTER", None)
    return hooks


def test_inert_without_the_switch(
    registry: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUPERINFER_SGLANG", raising=False)
    register()
    assert dict(registry) == {} and plugin.current_adapter() is None


def test_the_switch_registers_every_hook(
    registry: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUPERINFER_SGLANG", "1")
    monkeypatch.setenv("SUPERINFER_POLICY", "priority")
    register()
    adapter = plugin.current_adapter()
    assert adapter is not None and adapter.config.policy == "priority"
    registered = {t: [(k, h.__name__) for k, h, _ in v] for t, v in registry.items()}
    assert registered == {target: [(HookType[kind], method)] for target, kind, method in HOOKS}
    assert len(registered) == 13  # run_batch: the step time for the stats file


def test_a_bad_configuration_stops_the_server_with_one_line(
    registry: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    config = tmp_path / "si.json"
    config.write_text('{"policy": "fcfs",\n "slo_classes": {"chat": {"ttft": 1}}}')
    monkeypatch.setenv("SUPERINFER_SGLANG", "1")
    monkeypatch.setenv("SUPERINFER_CONFIG", str(config))
    with pytest.raises(
        SystemExit, match=rf"^superinfer: {config}: slo_classes.chat has unknown field 'ttft'$"
    ):
        register()
    monkeypatch.delenv("SUPERINFER_CONFIG")
    monkeypatch.setenv("SUPERINFER_POLICY", "fifo")
    with pytest.raises(SystemExit, match=r"^superinfer: unknown policy 'fifo'; registered: "):
        register()
    assert dict(registry) == {}


def test_spawned_processes_load_it_only_with_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = multiprocessing.get_context("spawn")
    results = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("SUPERINFER_SGLANG", switch)
        monkeypatch.setenv("SUPERINFER_POLICY", "fcfs")
        out = ctx.Queue()
        child = ctx.Process(target=probe, args=(out,))
        child.start()  # the child copies the environment now
        results[switch] = (child, out)
    got = {}
    for switch, (child, out) in results.items():
        got[switch] = out.get(timeout=300)
        child.join(timeout=60)
        assert child.exitcode == 0
    assert got["0"] == {
        "wrapped": False,
        "preempt_wrapped": False,
        "retraction_static": True,
        "policy": None,
        "order": ["second", "first"],  # SGLang's priority scheduling: larger first
    }
    assert got["1"] == {
        "wrapped": True,
        "preempt_wrapped": True,
        "retraction_static": True,
        "policy": "fcfs",
        "strategy": "SuperinferEvictionStrategy",
        "order": ["first", "second"],  # our fcfs policy through the patched calc_priority
    }
