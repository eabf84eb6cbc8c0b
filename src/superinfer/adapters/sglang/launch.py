"""``superinfer serve --engine sglang -- <sglang launch args>``: the switches, then SGLang's server.

Builds the environment and the ``python -m sglang.launch_server`` command line, checks what can be
checked before a multi-minute server start (configuration, policy, sglang installed), and replaces
the current process with the server. ``--policy native``, ``lpm`` and ``priority`` start SGLang's
own scheduling without the plugin (:data:`NATIVE_POLICIES`); every other name runs through it.
Without a CUDA GPU the CPU recipe of ``../shared/engines/sglang-cpu.md`` is applied
(:func:`cpu_recipe`), announced in one log line.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from superinfer.adapters.manager import build_plugin_manager
from superinfer.adapters.sglang.config import (
    ENV_CONFIG,
    ENV_KV_POLICY,
    ENV_POLICY,
    ENV_POLICY_OPTS,
    ENV_SWITCH,
    ConfigError,
    load_config,
)

__all__ = [
    "BF16_CPU_FLAGS",
    "CPU_FLAGS",
    "NATIVE_POLICIES",
    "STAND_IN_PATH",
    "ServeError",
    "cpu_dtype",
    "cpu_recipe",
    "exec_server",
    "has_cuda_gpu",
    "launch_command",
    "server_command",
]

TREE_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"

#: SGLang's own scheduling, no plugin: policy name -> launch flags. ``native`` is SGLang's default
#: as shipped (0.5.23: ``--schedule-policy fcfs``, ``sglang/srt/arg_groups/fields/schedule.py``);
#: ``priority`` ranks by the request's ``priority`` field, which the ``http`` engine's ``sglang``
#: backend sets to ``-SLO.priority`` (chat 0 before batch -1; SGLang runs higher values first).
NATIVE_POLICIES: dict[str, tuple[str, ...]] = {
    "native": ("--schedule-policy", "fcfs"),
    "lpm": ("--schedule-policy", "lpm"),
    "priority": ("--schedule-policy", "fcfs", "--enable-priority-scheduling"),
}

#: The folder holding the import-only ``sgl_kernel`` stand-in (put on the server's PYTHONPATH).
STAND_IN_PATH = Path(__file__).resolve().parent / "cpu_path"

#: ``/proc/cpuinfo`` flags of native bfloat16 matrix math. Without one, torch 2.13's CPU bf16 GEMM
#: is two orders of magnitude slower than fp32: on an AVX2-only AMD EPYC VM (2026-12-07) a
#: [512 x 576] x [576 x 1536] product ran at 1.2 GFLOP/s in bf16 (and fp16) against 125 in fp32,
#: and SGLang 0.5.23 answered a 901-token SmolLM2-135M prompt in 14.3 s with ``--dtype bfloat16``
#: against 3.3 s with ``float32`` (its decode steps alike: 30 tokens in 2.1 and 2.3 s).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")

#: The CPU recipe's flags, measured on sglang 0.5.23 (``../shared/engines/sglang-cpu.md`` sec. 3):
#: the pure-torch attention, sampling and norms, no CUDA graphs, no overlap thread, a small KV pool
#: (and ``--dtype`` from :func:`cpu_dtype`). A flag the caller gave keeps the caller's value.
CPU_FLAGS: tuple[tuple[str, str | None], ...] = (
    ("--device", "cpu"),
    ("--attention-backend", "torch_native"),
    ("--cuda-graph-backend-decode", "disabled"),
    ("--cuda-graph-backend-prefill", "disabled"),
    ("--disable-overlap-schedule", None),
    ("--sampling-backend", "pytorch"),
    ("--mem-fraction-static", "0.1"),
    ("--max-total-tokens", "4096"),
    ("--max-running-requests", "8"),
    ("--chunked-prefill-size", "512"),
    ("--context-length", "1024"),
    ("--sleep-on-idle", None),
)

#: Files whose presence means a model folder has real weights (else ``--load-format dummy``).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


class ServeError(RuntimeError):
    """The server cannot be started here; the message is one line saying why."""


def _flag(args: Sequence[str], name: str) -> str | None:
    """The value of ``--name VALUE`` / ``--name=VALUE`` in ``args``, ``""`` for a bare flag."""
    for i, arg in enumerate(args):
        if arg == name:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            return "" if nxt.startswith("--") else nxt
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def has_cuda_gpu() -> bool:
    """Whether torch sees a CUDA GPU here (``False`` when torch is missing)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def cpu_dtype(cpuinfo: str | None = None) -> str:
    """The recipe's ``--dtype``: ``bfloat16`` where the CPU has native bf16 math (a flag of
    :data:`BF16_CPU_FLAGS`), else ``float32`` (the weights upcast at load; the KV pool in fp32,
    twice the bytes per token).

    Args:
        cpuinfo: the text of ``/proc/cpuinfo``; read when ``None``. Where it cannot be read (not
            Linux), ``bfloat16``, the dtype the recipe was measured with.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "bfloat16"
    flags = {
        flag
        for line in cpuinfo.splitlines()
        if line.startswith("flags")
        for flag in line.partition(":")[2].split()
    }
    return "bfloat16" if flags & set(BF16_CPU_FLAGS) else "float32"


def cpu_recipe(
    args: Sequence[str], env: Mapping[str, str], cpuinfo: str | None = None
) -> tuple[list[str], dict[str, str], str]:
    """SGLang's launch arguments and environment for a machine without a CUDA GPU.

    Adds :data:`CPU_FLAGS` and ``--dtype`` (:func:`cpu_dtype`) the caller did not give,
    ``--model-path`` of the tiny-Llama fixture when none is given (:func:`.fixture.ensure_fixture`),
    ``--load-format dummy`` for a model folder without weights, ``SGLANG_USE_CPU_ENGINE=1`` (else
    RoPE imports ``vllm._custom_ops``), ``HF_HUB_OFFLINE=1``, and the ``sgl_kernel`` stand-in folder
    first on ``PYTHONPATH``.

    Args:
        args: ``sglang.launch_server`` arguments.
        env: the server's environment.
        cpuinfo: ``/proc/cpuinfo``'s text for :func:`cpu_dtype` (read when ``None``).

    Returns:
        ``(args, env, line)``: the new arguments, environment and the one log line saying so.

    Raises:
        ServeError: the fixture cannot be built, or ``--model-path`` is not a local folder.
    """
    from superinfer.adapters.sglang.fixture import FixtureError, ensure_fixture

    out = list(args)
    env = dict(env)
    if _flag(out, "--model-path") is None and _flag(out, "--model") is None:
        try:
            out += ["--model-path", str(ensure_fixture())]
        except FixtureError as exc:
            raise ServeError(str(exc)) from None
    given_model = _flag(out, "--model-path") or _flag(out, "--model") or ""
    if not Path(given_model).is_dir():
        raise ServeError(
            f"--model-path {given_model}: no such folder (the CPU recipe runs offline, "
            "HF_HUB_OFFLINE=1: give a local model folder, or none for the tiny-Llama fixture)"
        )
    added = []
    for name, value in (*CPU_FLAGS, ("--dtype", cpu_dtype(cpuinfo))):
        if _flag(out, name) is None:
            out += [name] if value is None else [name, value]
            added.append(name if value is None else f"{name} {value}")
    model = Path(given_model)
    has_weights = any(f.suffix in _WEIGHT_SUFFIXES for f in model.iterdir() if f.is_file())
    if _flag(out, "--load-format") is None and not has_weights:
        out += ["--load-format", "dummy"]
        added.append("--load-format dummy")
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(STAND_IN_PATH), env.get("PYTHONPATH", "")) if p
    )
    line = (
        "superinfer: no CUDA GPU here: SGLang CPU recipe (SGLANG_USE_CPU_ENGINE=1, sgl_kernel "
        f"stand-in {STAND_IN_PATH}, HF_HUB_OFFLINE=1, {' '.join(added) or 'flags as given'})"
    )
    return out, env, line


def launch_command(
    engine_args: Sequence[str],
    *,
    policy: str | None = None,
    policy_opts: Sequence[str] = (),
    config_path: str | None = None,
    kv_policy: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start SGLang with the policy.

    For a policy in :data:`NATIVE_POLICIES` the plugin stays off (``SUPERINFER_SGLANG`` removed)
    and its flags are added. Otherwise it adds ``--enable-priority-scheduling`` (SGLang asks for
    preemption victims only then) and, unless the caller chose an eviction policy,
    ``--radix-eviction-policy superinfer`` on the Python tree core; with
    ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=rust`` set it uses ``priority`` (the Rust core's
    degraded mode: insert priorities from the policy's ranks).

    Args:
        engine_args: arguments for ``sglang.launch_server``.
        policy: policy name (``SUPERINFER_POLICY``), or one of :data:`NATIVE_POLICIES`.
        policy_opts: ``key=value`` options of that policy.
        config_path: adapter configuration file (``SUPERINFER_CONFIG``).
        kv_policy: prefix-cache placement policy (``SUPERINFER_KV_POLICY``: ``lru``, ``lfu``,
            ``reuse``).
        environ: the environment to extend; ``os.environ`` by default.

    Returns:
        ``(argv, env)`` for ``os.execvpe``.

    Raises:
        ConfigError: an unusable configuration, launch arguments that contradict the adapter, or
            plugin options given with a native policy.
        UnknownPolicyError: the policy is not registered.
    """
    env = dict(os.environ if environ is None else environ)
    args = list(engine_args)
    if policy in NATIVE_POLICIES:
        if policy_opts or kv_policy or config_path:
            raise ConfigError(
                f"--policy {policy} is SGLang's own scheduling without the plugin: it takes no "
                "policy options, kv policy or adapter config"
            )
        for key in (ENV_SWITCH, ENV_POLICY, ENV_POLICY_OPTS, ENV_KV_POLICY, ENV_CONFIG):
            env.pop(key, None)
        flags = NATIVE_POLICIES[policy]
        given = _flag(args, "--schedule-policy")
        if given is not None and given != flags[1]:
            raise ConfigError(f"--policy {policy} means --schedule-policy {flags[1]}, not {given}")
        if given is None:
            args += flags[:2]
        if len(flags) > 2 and _flag(args, flags[2]) is None:
            args.append(flags[2])
        return [sys.executable, "-m", "sglang.launch_server", *args], env
    env[ENV_SWITCH] = "1"
    if config_path is not None:
        env[ENV_CONFIG] = str(Path(config_path).resolve())
    if policy is not None:
        env[ENV_POLICY] = policy
    if policy_opts:
        env[ENV_POLICY_OPTS] = ",".join(policy_opts)
    if kv_policy is not None:
        env[ENV_KV_POLICY] = kv_policy
    config = load_config(env)
    # fails now, not in the server
    build_plugin_manager(config.policy, config.policy_options, kv_policy=config.kv_policy)

    schedule_policy = _flag(args, "--schedule-policy")
    if schedule_policy not in (None, "fcfs", "lof"):
        raise ConfigError(
            f"--schedule-policy {schedule_policy}: superinfer needs SGLang's priority scheduling, "
            "which SGLang allows with fcfs or lof only"
        )
    if _flag(args, "--enable-priority-scheduling") is None:
        args.append("--enable-priority-scheduling")
    if _flag(args, "--radix-eviction-policy") is None:
        rust = env.get(TREE_CORE_ENV, "").lower() == "rust"
        args += ["--radix-eviction-policy", "priority" if rust else "superinfer"]
        if not rust:
            env[TREE_CORE_ENV] = "python"
    elif _flag(args, "--radix-eviction-policy") == "superinfer":
        if env.get(TREE_CORE_ENV, "python").lower() != "python":
            raise ConfigError(
                f"--radix-eviction-policy superinfer needs {TREE_CORE_ENV}=python "
                "(the Rust tree core takes built-in eviction policies only)"
            )
        env[TREE_CORE_ENV] = "python"
    return [sys.executable, "-m", "sglang.launch_server", *args], env


def server_command(
    argv: list[str], env: dict[str, str], *, cpu: bool | None = None
) -> tuple[list[str], dict[str, str], str | None]:
    """Check that SGLang can serve here; on a machine without a CUDA GPU apply the CPU recipe.

    Args:
        argv: from :func:`launch_command`.
        env: from :func:`launch_command`.
        cpu: force the CPU recipe on or off; ``None``: on when :func:`has_cuda_gpu` is false.

    Returns:
        ``(argv, env, line)``: ``line`` is the CPU recipe's log line, ``None`` on a GPU.

    Raises:
        ServeError: sglang is not installed, or the CPU fixture cannot be built.
    """
    if importlib.util.find_spec("sglang") is None:
        raise ServeError(
            "sglang is not installed: make install-sglang (CPU) or pip install 'sglang==0.5.23' "
            "on a GPU machine (docs/adapters.md)"
        )
    if cpu is None:
        cpu = not has_cuda_gpu()
    if not cpu:
        return argv, env, None
    head, tail = argv[:3], argv[3:]
    tail, env, line = cpu_recipe(tail, env)
    return [*head, *tail], env, line


def exec_server(argv: list[str], env: dict[str, str]) -> None:
    """Become the SGLang server process (the CPU recipe applied without a CUDA GPU).

    Raises:
        ServeError: see :func:`server_command`.
    """
    argv, env, line = server_command(argv, env)
    if line is not None:
        print(line, file=sys.stderr, flush=True)
    os.execvpe(argv[0], argv, env)
