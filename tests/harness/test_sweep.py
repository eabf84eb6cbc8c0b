"""Sweeps: spec parsing and its errors, grid expansion, executors agreeing, resuming from cache."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from superinfer.harness.errors import UserError
from superinfer.harness.grid.cells import CellCache
from superinfer.harness.grid.executors import CellRunner
from superinfer.harness.grid.sweep import SWEEP_CELL_COLUMNS, load_sweep_spec, sweep_table

SPEC = """
out = "somewhere"

[cell]
model = "llama-3.1-8b"
gpu = "a100-80gb"
tp = 1
start_s = 1200
duration_s = 30

[grid]
engine = ["sim:vllm", "sim:sglang"]
policy = ["native", "fcfs", "priority"]
replicas = [1, 2]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def test_grid_expands_in_file_order_and_resolves_native(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, SPEC))
    assert spec.out == Path("somewhere") and spec.base.duration_s == 30.0
    cells, notes = spec.cells()
    # native is fcfs on sim:vllm and on sim:sglang (SGLang 0.5.23's default, issue 19), folding
    # into the fcfs cells.
    assert [(c.engine, c.policy, c.replicas) for c in cells] == [
        (e, p, r)
        for e, native in (("sim:vllm", "fcfs"), ("sim:sglang", "fcfs"))
        for p in dict.fromkeys((native, "fcfs", "priority"))
        for r in (1, 2)
    ]
    assert notes == []
    assert all(c.model == "llama-3.1-8b" and c.start_s == 1200.0 for c in cells)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[grid]\nreplica = [1]\n", "[grid] unknown field 'replica'; fields: trace, engine"),
        ("[cell]\ntp = '4'\n", "[cell] tp: expected an integer, got '4'"),
        ("[grid]\nreplicas = []\n", "[grid] replicas: expected a non-empty list of values"),
        ("[grid]\nrate_scale = 2\n", "[grid] rate_scale: expected a non-empty list of values"),
        ("[cell]\ngpu = 'v100'\n", "unknown GPU 'v100'"),
        ("[grid]\npolicy = ['fifo']\n", "unknown policy 'fifo'; registered: "),
        ("[cells]\ntp = 1\n", "unknown key 'cells'; a spec has out, [cell], [grid]"),
        ("[cell]\ntp = \n", "Invalid value (at line 2, column 6)"),
        # a helper's audit (2026-12-05): both ran silently
        ("", "no [cell] or [grid] settings; a spec sets what its cells run"),
        ("[cell]\ntp = 4\n[grid]\ntp = [4, 8]\n", "tp is set in both [cell] and [grid]; keep one"),
    ],
)
def test_spec_errors_name_the_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UserError) as info:
        load_sweep_spec(path).cells()
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def tiny_cells(tmp_path: Path) -> list:
    text = SPEC.replace('["native", "fcfs", "priority"]', '["fcfs", "priority"]')
    return load_sweep_spec(write(tmp_path, text)).cells()[0]


def test_pool_and_in_process_agree_and_a_rerun_resumes_from_the_cache(tmp_path: Path) -> None:
    cells = tiny_cells(tmp_path)
    with CellRunner("local", workers=1, cache=CellCache(tmp_path / "a")) as runner:
        serial = sweep_table(cells, runner.run(cells))
    assert runner.num_run == len(cells) == 8
    with CellRunner("local", workers=2, cache=CellCache(tmp_path / "b")) as runner:
        pooled = sweep_table(cells, runner.run(cells[:3]) + runner.run(cells[3:]))
    pd.testing.assert_frame_equal(serial, pooled)
    assert list(serial.columns[: len(SWEEP_CELL_COLUMNS)]) == list(SWEEP_CELL_COLUMNS)
    assert len(serial) == 8 * 3  # batch, chat, all per cell
    assert (serial.gpus == serial.replicas).all()
    # An interrupted sweep: half the cache is gone; a rerun computes only that half.
    files = sorted((tmp_path / "a").glob("*.json"))
    for path in files[:4]:
        os.remove(path)
    with CellRunner("local", workers=1, cache=CellCache(tmp_path / "a")) as runner:
        again = sweep_table(cells, runner.run(cells))
    assert (runner.num_run, runner.num_cached) == (4, 4)
    pd.testing.assert_frame_equal(serial, again)


@pytest.mark.slow
def test_ray_executor_gives_the_local_numbers(tmp_path: Path) -> None:
    """A tiny sweep as Ray tasks on a local 2-CPU instance bound to 127.0.0.1."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
    ray = pytest.importorskip("ray")
    cells = tiny_cells(tmp_path)
    with CellRunner("local", workers=1) as runner:
        local = sweep_table(cells, runner.run(cells))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
        with CellRunner("ray", cache=CellCache(tmp_path / "ray")) as runner:
            remote = sweep_table(cells, runner.run(cells))
        assert runner.num_run == len(cells)
    finally:
        ray.shutdown()
    pd.testing.assert_frame_equal(local, remote)


def test_runner_rejects_bad_settings() -> None:
    with pytest.raises(UserError, match="unknown executor 'dask'"):
        CellRunner("dask")
    with pytest.raises(UserError, match="--address needs --executor ray"):
        CellRunner("local", address="auto")
