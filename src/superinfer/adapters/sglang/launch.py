"""``superinfer serve --engine sglang -- <sglang launch args>``: the switches, then SGLang's server.

Builds the environment and the ``python -m sglang.launch_server`` command line, checks what can be
checked before a multi-minute server start (configuration, policy, sglang installed, a CUDA GPU),
and replaces the current process with the server.
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
    ENV_POLICY,
    ENV_POLICY_OPTS,
    ENV_SWITCH,
    ConfigError,
    load_config,
)

__all__ = ["ServeError", "exec_server", "launch_command"]

TREE_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"


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


def launch_command(
    engine_args: Sequence[str],
    *,
    policy: str | None = None,
    policy_opts: Sequence[str] = (),
    config_path: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start SGLang with the policy.

    Adds ``--enable-priority-scheduling`` (SGLang asks for preemption victims only then) and, unless
    the caller chose an eviction policy, ``--radix-eviction-policy superinfer`` on the Python tree
    core; with ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=rust`` set it uses ``priority`` (the Rust
    core's degraded mode: insert priorities from the policy's ranks).

    Args:
        engine_args: arguments for ``sglang.launch_server``.
        policy: policy name (``SUPERINFER_POLICY``).
        policy_opts: ``key=value`` options of that policy.
        config_path: adapter configuration file (``SUPERINFER_CONFIG``).
        environ: the environment to extend; ``os.environ`` by default.

    Returns:
        ``(argv, env)`` for ``os.execvpe``.

    Raises:
        ConfigError: an unusable configuration, or launch arguments that contradict the adapter.
        UnknownPolicyError: the policy is not registered.
    """
    env = dict(os.environ if environ is None else environ)
    env[ENV_SWITCH] = "1"
    if config_path is not None:
        env[ENV_CONFIG] = str(Path(config_path).resolve())
    if policy is not None:
        env[ENV_POLICY] = policy
    if policy_opts:
        env[ENV_POLICY_OPTS] = ",".join(policy_opts)
    config = load_config(env)
    build_plugin_manager(config.policy, config.policy_options)  # fails now, not in the server

    args = list(engine_args)
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


def exec_server(argv: list[str], env: dict[str, str]) -> None:
    """Check that SGLang can serve here, then become the server process.

    Raises:
        ServeError: sglang is not installed, or there is no CUDA GPU (SGLang's server has no CPU
            build on PyPI: its CPU engine needs ``sgl_kernel`` CPU ops built from source).
    """
    if importlib.util.find_spec("sglang") is None:
        raise ServeError(
            "sglang is not installed: pip install 'sglang==0.5.23' on a GPU machine "
            "(docs/adapters.md)"
        )
    try:
        import torch

        has_gpu = bool(torch.cuda.is_available())
    except ImportError:
        has_gpu = False
    if not has_gpu:
        raise ServeError(
            "superinfer serve --engine sglang needs a CUDA GPU; this machine has none "
            "(the adapter's CPU tests run the real SGLang classes: make test)"
        )
    os.execvpe(argv[0], argv, env)
