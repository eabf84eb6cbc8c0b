"""Adapter configuration, SLO resolution, the logical clock, ``superinfer serve`` and the CPU
torchvision stand-in; none of these needs sglang imported in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

import pytest

from superinfer.adapters.manager import UnknownPolicyError
from superinfer.adapters.sglang.config import AdapterConfig, ConfigError, load_config
from superinfer.adapters.sglang.cpu_compat import PTH_NAME
from superinfer.adapters.sglang.fixture import TINY_LLAMA, build_fixture, ensure_fixture
from superinfer.adapters.sglang.launch import (
    STAND_IN_PATH,
    cpu_dtype,
    cpu_recipe,
    launch_command,
)
from superinfer.adapters.sglang.view import (
    LogicalClock,
    SLOFieldError,
    WallClock,
    clock_for,
    make_clock,
    resolve_slo,
    single_rank,
)
from superinfer.policy_core.types import SLO


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "superinfer.json"
    path.write_text(text)
    return str(path)


def test_defaults_and_a_full_file(tmp_path: Path) -> None:
    assert load_config({}) == AdapterConfig()
    path = write(
        tmp_path,
        json.dumps(
            {
                "policy": "priority",
                "policy_options": {"max_repeat_steps": 4},
                "slo_classes": {"gold": {"ttft_ms": 200, "priority": 0}, "bulk": {"priority": 3}},
                "default_class": "bulk",
                "priority_classes": {"10": "gold"},
                "clock": {"step_s": 0.03, "token_s": 0.0002},
                "pin_budget_fraction": 0.5,
            }
        ),
    )
    config = load_config({"SUPERINFER_CONFIG": path})
    assert config.policy == "priority" and config.policy_options == {"max_repeat_steps": 4}
    assert config.slo_classes["gold"] == SLO("gold", ttft_ms=200, priority=0)
    assert (config.default_class, config.priority_classes) == ("bulk", {10: "gold"})
    assert (config.step_s, config.token_s, config.pin_budget_fraction) == (0.03, 0.0002, 0.5)


def test_environment_overrides_the_policy(tmp_path: Path) -> None:
    path = write(tmp_path, '{"policy": "priority", "policy_options": {"max_repeat_steps": 4}}')
    env = {"SUPERINFER_CONFIG": path, "SUPERINFER_POLICY": "fcfs"}
    assert load_config(env).policy_options == {}  # the file's options were for another policy
    env["SUPERINFER_POLICY_OPTS"] = "max_repeat_steps=2, a=b"
    assert load_config(env).policy_options == {"max_repeat_steps": "2", "a": "b"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"policy": "fcfs",\n "clock": 3,}', r"superinfer\.json:2: invalid JSON"),
        ("[1]", "the top level must be a JSON object"),
        ('{"polcy": "fcfs"}', "unknown field 'polcy'"),
        ('{"slo_classes": {"chat": {"ttft": 1}}}', "slo_classes.chat has unknown field 'ttft'"),
        ('{"slo_classes": {"chat": {"ttft_ms": -1}}}', "slo_classes.chat: SLO 'chat': ttft_ms"),
        ('{"default_class": "gold"}', "default_class 'gold' is not in slo_classes"),
        ('{"priority_classes": {"x": "chat"}}', "priority_classes keys must be integers"),
        ('{"clock": {"step_s": "fast"}}', "clock.step_s must be a number, got 'fast'"),
        ('{"pin_budget_fraction": 2}', r"pin_budget_fraction must be in \(0, 1\]"),
    ],
)
def test_every_mistake_is_one_line_naming_the_file_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config({"SUPERINFER_CONFIG": path})
    assert "\n" not in str(info.value) and str(info.value).startswith(path)


def test_missing_file_and_bad_opts() -> None:
    with pytest.raises(ConfigError, match=r"SUPERINFER_CONFIG=/nope.json: cannot read"):
        load_config({"SUPERINFER_CONFIG": "/nope.json"})
    with pytest.raises(ConfigError, match="SUPERINFER_POLICY_OPTS: 'x' is not key=value"):
        load_config({"SUPERINFER_POLICY_OPTS": "x"})


def fake_req(custom: Any = None, priority: int | None = None) -> Any:
    params = types.SimpleNamespace(custom_params=custom)
    return types.SimpleNamespace(sampling_params=params, priority=priority)


def test_slo_from_custom_params_then_priority_then_default() -> None:
    config = AdapterConfig(priority_classes={5: "chat"})
    chat = config.slo_classes["chat"]
    assert resolve_slo(fake_req({"slo": "chat"}), config) is chat
    tighter = resolve_slo(fake_req({"slo": {"class": "chat", "ttft_ms": 300}}), config)
    assert tighter == SLO("chat", ttft_ms=300, tpot_ms=100.0, priority=0)
    assert resolve_slo(fake_req(None, priority=5), config) is chat
    assert resolve_slo(fake_req({"other": 1}, priority=4), config).name == "batch"
    with pytest.raises(SLOFieldError, match=r"custom_params.slo: SLO 'chat': tpot_ms must be > 0"):
        resolve_slo(fake_req({"slo": {"class": "chat", "tpot_ms": 0}}), config)


def test_the_logical_clock_counts_steps_and_tokens() -> None:
    clock = LogicalClock(step_s=0.02, token_s=1e-4)
    assert clock.advance(100) == pytest.approx(0.03)
    assert clock.advance(0) == pytest.approx(0.02)
    assert (clock.step_index, clock.num_tokens, clock.now_s) == (2, 100, pytest.approx(0.05))


def test_the_logical_clock_ignores_measured_step_times() -> None:
    clock = LogicalClock(step_s=0.02, token_s=1e-4)
    assert clock.advance(100, busy_s=0.7) == pytest.approx(0.03)
    assert clock.now_s == pytest.approx(0.03)


class FakeTime:
    """A settable time source, s."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_wall_clock_reads_its_time_source_and_the_measured_step() -> None:
    t = FakeTime(1000.0)
    clock = WallClock(t)
    assert clock.now_s == 0.0
    t.t = 1000.25
    assert clock.now_s == 0.25
    assert clock.advance(512, busy_s=0.125) == 0.125  # the batch's own run time
    t.t = 1001.0
    assert clock.advance(3) == 0.75  # unmeasured: the time since the previous batch ended
    assert (clock.step_index, clock.num_tokens, clock.now_s) == (2, 515, 1.0)


def scheduler(tp: int = 1, pp: int = 1, dp_attention: bool = False) -> types.SimpleNamespace:
    args = types.SimpleNamespace(tp_size=tp, pp_size=pp, enable_dp_attention=dp_attention)
    return types.SimpleNamespace(tp_size=tp, server_args=args)


def test_which_schedulers_decide_alone() -> None:
    assert single_rank(scheduler()) is True
    assert single_rank(scheduler(tp=2)) is False
    assert single_rank(scheduler(pp=2)) is False
    assert single_rank(scheduler(dp_attention=True)) is False
    assert single_rank(types.SimpleNamespace(server_args=types.SimpleNamespace(tp_size=4))) is False


def test_clock_modes() -> None:
    t = FakeTime(5.0)
    assert isinstance(make_clock("auto", 0.02, 1e-4, single=True, time_fn=t), WallClock)
    assert make_clock("auto", 0.02, 1e-4, single=False) == LogicalClock(0.02, 1e-4)
    assert make_clock("auto", 0.02, 1e-4, single=None) == LogicalClock(0.02, 1e-4)
    assert make_clock("logical", 0.03, 0.0, single=True) == LogicalClock(0.03, 0.0)
    assert isinstance(make_clock("wall", 0.02, 1e-4, single=None), WallClock)
    with pytest.raises(ValueError, match=r"clock.mode 'wall' needs a lone scheduler rank"):
        make_clock("wall", 0.02, 1e-4, single=False)
    with pytest.raises(ValueError, match=r"clock.mode 'tsc': use one of auto, wall, logical"):
        make_clock("tsc", 0.02, 1e-4, single=True)
    config = AdapterConfig()
    assert config.clock_mode == "auto"
    assert isinstance(clock_for(config), LogicalClock)  # before a scheduler is bound
    assert isinstance(clock_for(config, scheduler()), WallClock)
    assert isinstance(clock_for(config, scheduler(tp=2)), LogicalClock)


def test_clock_mode_in_the_config_file(tmp_path: Path) -> None:
    path = write(tmp_path, '{"clock": {"mode": "logical", "step_s": 0.05}}')
    config = load_config({"SUPERINFER_CONFIG": path})
    assert (config.clock_mode, config.step_s, config.token_s) == ("logical", 0.05, 1e-4)
    bad = write(tmp_path, '{"clock": {"mode": "sundial"}}')
    with pytest.raises(ConfigError, match=r"clock.mode 'sundial': use one of auto, wall, logical"):
        load_config({"SUPERINFER_CONFIG": bad})
    extra = write(tmp_path, '{"clock": {"tick_s": 1}}')
    with pytest.raises(ConfigError, match=r"clock must be an object with mode, step_s, token_s"):
        load_config({"SUPERINFER_CONFIG": extra})


def test_launch_command_adds_the_switches(tmp_path: Path) -> None:
    path = write(tmp_path, '{"policy": "priority"}')
    argv, env = launch_command(
        ["--model-path", "m", "--port", "30000"],
        policy_opts=["max_repeat_steps=8"],
        config_path=path,
        environ={"PATH": "/bin"},
    )
    assert argv == [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        "m",
        "--port",
        "30000",
        "--enable-priority-scheduling",
        "--radix-eviction-policy",
        "superinfer",
    ]
    assert env == {
        "PATH": "/bin",
        "SUPERINFER_SGLANG": "1",
        "SUPERINFER_CONFIG": path,
        "SUPERINFER_POLICY_OPTS": "max_repeat_steps=8",
        "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
    }


def test_launch_command_respects_the_callers_choices() -> None:
    rust = {"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "rust"}
    argv, env = launch_command(["--enable-priority-scheduling"], policy="fcfs", environ=rust)
    assert argv[3:] == ["--enable-priority-scheduling", "--radix-eviction-policy", "priority"]
    assert env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "rust"
    argv, _ = launch_command(["--radix-eviction-policy=lru"], environ={})
    assert argv[3:] == ["--radix-eviction-policy=lru", "--enable-priority-scheduling"]
    with pytest.raises(ConfigError, match="needs SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python"):
        launch_command(["--radix-eviction-policy", "superinfer"], environ=rust)
    with pytest.raises(ConfigError, match="--schedule-policy lpm: superinfer needs"):
        launch_command(["--schedule-policy", "lpm"], environ={})
    with pytest.raises(UnknownPolicyError, match="unknown policy 'fifo'"):
        launch_command([], policy="fifo", environ={})


def test_serve_on_a_machine_without_a_gpu_is_a_one_line_error() -> None:
    # Without a GPU the CPU recipe applies (runs offline): a model folder that does not exist is
    # refused in one line before any server starts.
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cli = Path(sys.executable).with_name("superinfer")
    run = subprocess.run(
        [str(cli), "serve", "--engine", "sglang", "--", "--model-path", "m"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert run.stderr.startswith(
        (
            "Error: --model-path m: no such folder (the CPU recipe runs offline",
            "Error: sglang is not installed",
        )
    )


def test_native_policies_start_sglang_without_the_plugin() -> None:
    plugin_env = {"SUPERINFER_SGLANG": "1", "SUPERINFER_POLICY": "edf", "KEEP": "1"}
    argv, env = launch_command(["--model-path", "m"], policy="native", environ=plugin_env)
    assert argv[3:] == ["--model-path", "m", "--schedule-policy", "fcfs"] and env == {"KEEP": "1"}
    argv, _ = launch_command([], policy="lpm", environ={})
    assert argv[3:] == ["--schedule-policy", "lpm"]
    argv, _ = launch_command([], policy="priority", environ={})
    assert argv[3:] == ["--schedule-policy", "fcfs", "--enable-priority-scheduling"]
    with pytest.raises(ConfigError, match="--policy lpm means --schedule-policy lpm, not fcfs"):
        launch_command(["--schedule-policy", "fcfs"], policy="lpm", environ={})
    with pytest.raises(ConfigError, match="--policy native is SGLang's own scheduling"):
        launch_command([], policy="native", kv_policy="reuse", environ={})


def test_kv_policy_reaches_the_scheduler_through_the_environment() -> None:
    argv, env = launch_command([], policy="fcfs", kv_policy="reuse", environ={})
    assert env["SUPERINFER_KV_POLICY"] == "reuse" and load_config(env).kv_policy == "reuse"
    with pytest.raises(UnknownPolicyError, match="unknown kv policy 'mru'"):
        launch_command([], policy="fcfs", kv_policy="mru", environ={})


def test_cpu_recipe_fills_what_the_caller_left_out(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    args, env, line = cpu_recipe(
        ["--model-path", str(tmp_path), "--max-total-tokens", "700"],
        {"PYTHONPATH": "/x"},
        cpuinfo="flags\t\t: fpu avx2 avx512_bf16\n",
    )
    flags = [a for a in args if a.startswith("--")]
    assert flags == [
        "--model-path", "--max-total-tokens", "--device", "--attention-backend",
        "--cuda-graph-backend-decode", "--cuda-graph-backend-prefill",
        "--disable-overlap-schedule", "--sampling-backend", "--mem-fraction-static",
        "--max-running-requests", "--chunked-prefill-size", "--context-length", "--sleep-on-idle",
        "--dtype", "--load-format",
    ]  # fmt: skip
    assert args[args.index("--max-total-tokens") + 1] == "700" and args[-1] == "dummy"
    assert args[args.index("--dtype") + 1] == "bfloat16" and "--dtype bfloat16" in line
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["PYTHONPATH"] == f"{STAND_IN_PATH}{os.pathsep}/x"
    assert line.startswith("superinfer: no CUDA GPU here: SGLang CPU recipe (")
    (tmp_path / "model.safetensors").write_bytes(b"")
    args, _, _ = cpu_recipe(["--model-path", str(tmp_path)], {})
    assert "--load-format" not in args
    # a CPU without native bf16 math runs float32; a --dtype given is kept
    args, _, line = cpu_recipe(["--model-path", str(tmp_path)], {}, cpuinfo="flags : avx2\n")
    assert args[args.index("--dtype") + 1] == "float32" and "--dtype float32" in line
    args, _, _ = cpu_recipe(["--model-path", str(tmp_path), "--dtype=bfloat16"], {}, cpuinfo="")
    assert args.count("--dtype") == 0 and "--dtype=bfloat16" in args


@pytest.mark.parametrize(
    ("cpuinfo", "dtype"),
    [
        ("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n", "float32"),
        ("flags\t\t: avx2 amx_bf16 amx_tile\nflags\t\t: avx2 amx_bf16\n", "bfloat16"),
        ("flags\t\t: avx512_bf16\n", "bfloat16"),
        ("model name\t: avx512_bf16 in a name, not a flag\n", "float32"),
        ("", "float32"),
    ],
)
def test_cpu_dtype_is_bfloat16_only_with_native_bf16_math(cpuinfo: str, dtype: str) -> None:
    assert cpu_dtype(cpuinfo) == dtype


def test_the_sgl_kernel_stand_in_names_the_op_it_lacks() -> None:
    code = (
        "import sgl_kernel\n"
        "from sgl_kernel import copy_all_layer_kv_cache_cpu as op\n"
        "try:\n"
        "    op(1)\n"
        "except NotImplementedError as e:\n"
        "    print(e)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(STAND_IN_PATH)},
    )
    assert run.stdout.splitlines() == [
        "sgl_kernel.copy_all_layer_kv_cache_cpu: not available on CPU (superinfer's import-only "
        "sgl_kernel stand-in; this SGLang path needs the real sgl_kernel CPU build)"
    ]


def test_torchvision_stand_in_answers_imports_not_probes() -> None:
    if not (Path(sysconfig.get_paths()["purelib"]) / PTH_NAME).exists():
        pytest.skip("the CPU stand-in is installed by make install-sglang")
    code = (
        "import importlib.util\n"
        "print(importlib.util.find_spec('torchvision'))\n"
        "import torchvision.transforms as T\n"
        "from torchvision.transforms.functional import InterpolationMode\n"
        "print(T.InterpolationMode.BICUBIC.value, InterpolationMode is T.InterpolationMode)\n"
        "try:\n"
        "    T.Resize(3)\n"
        "except RuntimeError as e:\n"
        "    print(str(e).split(':')[0])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.stdout.splitlines() == ["None", "bicubic True", "torchvision.transforms.Resize"]


def test_the_tiny_llama_fixture_is_built_offline_from_the_smollm2_gguf(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    folder = build_fixture(tmp_path / "tiny")
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        ".superinfer-fixture.json", "chat_template.jinja", "config.json",
        "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    assert json.loads((folder / "config.json").read_text()) == TINY_LLAMA
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) == TINY_LLAMA["vocab_size"] == 49152
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert ensure_fixture(folder) == folder and (folder / "config.json").stat().st_mtime_ns == stamp
