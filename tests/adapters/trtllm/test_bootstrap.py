"""Mode B in a fresh interpreter through the ``.pth`` hook, as in an MPI-spawned worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from superinfer.adapters.trtllm import bootstrap
from superinfer.adapters.trtllm.bootstrap import BootstrapError, load_config
from tests.adapters.trtllm.conftest import FAKE_ROOT

GOOD = {
    "policy": "priority",
    "slo_classes": {
        "chat": {"ttft_ms": 1000, "tpot_ms": 100, "priority": 0},
        "batch": {"deadline_s": 600, "priority": 1},
    },
    "default_slo": "batch",
}


def _write(tmp_path: Path, config: object, name: str = "mode_b.json") -> Path:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def test_a_good_config_parses(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, {**GOOD, "options": {"max_repeat_steps": 4}}))
    assert config.policy == "priority" and config.options == {"max_repeat_steps": "4"}
    assert config.slo_classes["chat"].ttft_ms == 1000 and config.default_slo == "batch"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"policy": "fcfs",\n "options": [}', r"mode_b.json:2: not JSON"),
        ({"options": {}}, "field 'policy' must be a policy name"),
        ({**GOOD, "slo_classes": {"chat": {"ttft": 5}}}, "slo_classes.chat must be an object"),
        (
            {**GOOD, "slo_classes": {"chat": {"ttft_ms": -1}}},
            "slo_classes.chat: .*ttft_ms must be > 0",
        ),
        ({**GOOD, "default_slo": "gold"}, "default_slo 'gold' is not in slo_classes"),
        ({**GOOD, "slo_table": 3}, "field 'slo_table' must be a path"),
    ],
)
def test_bad_configs_are_one_line_errors_naming_the_field(
    tmp_path: Path, config: object, message: str
) -> None:
    with pytest.raises(BootstrapError, match=message) as info:
        load_config(_write(tmp_path, config))
    assert "\n" not in str(info.value)
    with pytest.raises(BootstrapError, match="cannot read"):
        load_config(tmp_path / "missing.json")


def test_without_the_variable_nothing_is_armed(tmp_path: Path) -> None:
    before = list(sys.meta_path)
    assert bootstrap.install_from_env({}) is False
    assert sys.meta_path == before
    bootstrap.install_pth(str(tmp_path))
    # Another package's .pth (the SGLang CPU shim) may import superinfer itself; what must not
    # load is the TensorRT-LLM adapter.
    code = (
        f"import site, sys; site.addsitedir({str(tmp_path)!r}); "
        "print('superinfer.adapters.trtllm' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != bootstrap.CONFIG_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "False", out.stderr


def test_pth_install_and_uninstall(tmp_path: Path) -> None:
    path = bootstrap.install_pth(str(tmp_path))
    assert path == tmp_path / "superinfer_trtllm.pth"
    assert path.read_text() == bootstrap.PTH_LINE and path.read_text().startswith("import ")
    assert f"'{bootstrap.CONFIG_ENV}'" in bootstrap.PTH_LINE
    assert bootstrap.uninstall_pth(str(tmp_path)) == path and not path.exists()
    assert bootstrap.uninstall_pth(str(tmp_path)) is None


WORKER = textwrap.dedent(
    """
    import json, site, sys
    site.addsitedir(sys.argv[1])          # what the interpreter does with site-packages
    assert "tensorrt_llm" not in sys.modules, "the hook must not import the engine"
    from superinfer.adapters.trtllm.slo_table import FileSloTable
    from superinfer.policy_core.types import SLO
    from tensorrt_llm._fake import FakeClock
    from tensorrt_llm.llmapi import LLM, KvCacheConfig, SamplingParams
    llm = LLM("double", max_batch_size=8, kv_cache_config=KvCacheConfig(max_tokens=64,
              tokens_per_block=8), _fake_output_len=lambda p, sp: 4)
    front_end = FileSloTable(sys.argv[2], {"chat": SLO("chat"), "batch": SLO("batch")})
    names = {}
    for i, cls in enumerate(["batch", "batch", "chat", "batch", "chat"]):
        out = llm.generate_async(list(range(100 * i, 100 * i + 20)), SamplingParams(max_tokens=4))
        front_end.put(out.request_id, cls)
        names[out.request_id] = f"{cls}{i}"
    while llm._fake_has_work():
        llm._fake_step()
    order = []
    for _, ctx, _, _ in llm._engine._fake_log:
        order += [names[c] for c in ctx]
    print(json.dumps({"scheduler": type(llm._engine.scheduler).__name__, "order": order}))
    """
)


def _run_worker(
    tmp_path: Path, config: dict[str, object] | str
) -> subprocess.CompletedProcess[str]:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    bootstrap.install_pth(str(site_dir))
    script = _write(tmp_path, WORKER, "worker.py")
    env = {
        **os.environ,
        bootstrap.CONFIG_ENV: str(_write(tmp_path, config)),
        "PYTHONPATH": os.pathsep.join([str(FAKE_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, str(script), str(site_dir), str(tmp_path / "slo.jsonl")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_hook_installs_mode_b_in_a_fresh_interpreter(tmp_path: Path) -> None:
    result = _run_worker(tmp_path, {**GOOD, "slo_table": str(tmp_path / "slo.jsonl")})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["scheduler"] == "SuperinferScheduler"
    # 8 blocks of 8 tokens, 3 blocks per request to completion: two run at once; chat first
    assert out["order"] == ["chat2", "chat4", "batch0", "batch1", "batch3"]


def test_a_bad_config_stops_the_engine_with_the_same_one_line_error(tmp_path: Path) -> None:
    result = _run_worker(tmp_path, {**GOOD, "default_slo": "gold"})
    assert result.returncode != 0
    first, *_ = result.stderr.splitlines()
    assert first.startswith("superinfer: ") and "default_slo 'gold' is not in slo_classes" in first
    assert "BootstrapError: superinfer Mode B not installed" in result.stderr


def test_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, GOOD)
    assert bootstrap.main(["check", "--config", str(good)]) == 0
    assert "policy priority, 2 SLO classes" in capsys.readouterr().out
    bad = _write(tmp_path, {**GOOD, "policy": "fifo"}, "bad.json")
    assert bootstrap.main(["check", "--config", str(bad)]) == 1
    assert "unknown policy 'fifo'" in capsys.readouterr().err
