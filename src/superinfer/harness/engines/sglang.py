"""The ``sglang`` engine: a real SGLang server per policy, replayed through the ``http`` engine.

For each cell (one policy) :func:`run_sglang_cell` starts ``sglang.launch_server`` on a free
127.0.0.1 port with :class:`superinfer.adapters.sglang.server.SGLangServer` (the CPU recipe without
a CUDA GPU; ``native``, ``lpm`` and ``priority`` are SGLang's own scheduling without the plugin,
every other policy runs through it), waits for ``/health``, replays the workload with
``harness.engines.http.run_http_cell`` and ``--backend sglang``, stops the server by its process
group, and returns the ``http`` engine's :class:`~superinfer.harness.engines.base.CellResult` with
the server's facts added to ``info["sglang"]``: ``log`` (the kept server log), ``startup_s``,
``argv``, ``cpu_recipe`` (the recipe's log line, ``None`` on a GPU), ``plugin`` (whether the plugin
ran) and ``plugin_stats`` (the plugin's counters, :mod:`superinfer.adapters.sglang.stats`:
decisions, preemptions, retractions, radix placements, policy and step time per step).

Engine options (``--engine-option``) read here, the rest go to the ``http`` engine:

* ``sglang_args``: extra ``launch_server`` arguments, split on spaces (e.g.
  ``"--max-total-tokens 2048 --max-running-requests 4"``);
* ``sglang_log_dir``: where server logs go (default: a temporary folder);
* ``sglang_start_timeout_s``: the start-up bound (default
  :data:`~superinfer.adapters.sglang.server.DEFAULT_START_TIMEOUT_S`);
* ``sglang_config``: the adapter's JSON configuration file (``SUPERINFER_CONFIG``, e.g. its
  ``clock``; docs/adapters.md), for plugin policies.

``config.kv_policy`` and ``config.policy_options[policy]`` (``--policy-opt``) are passed to the
plugin (``SUPERINFER_KV_POLICY``, ``SUPERINFER_POLICY_OPTS``) for plugin policies.
"""

from __future__ import annotations

import dataclasses
import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from superinfer.harness.errors import UserError
from superinfer.harness.workload.workload import Workload

if TYPE_CHECKING:
    from superinfer.harness.engines.base import BenchConfig, CellResult

__all__ = ["SGLANG_ENGINE", "SGLANG_OPTION_KEYS", "run_sglang_cell"]

SGLANG_ENGINE = "sglang"

#: Engine options this runner consumes (not passed on to the ``http`` engine).
SGLANG_OPTION_KEYS = ("sglang_args", "sglang_log_dir", "sglang_start_timeout_s", "sglang_config")


def run_sglang_cell(
    config: BenchConfig, engine: str, policy: str, workload: Workload
) -> CellResult:
    """Start a server for ``policy``, replay ``workload`` against it, stop it.

    Args:
        config: the bench configuration (``engine_options`` as in the module docstring).
        engine: the engine id (``sglang``), for the rows.
        policy: a registered policy (through the plugin) or ``native``, ``lpm``, ``priority``.
        workload: the requests.

    Returns:
        The ``http`` engine's cell result, ``info["sglang"]`` added.

    Raises:
        UserError: a bad option, an unusable policy or configuration, sglang missing, or a server
            that does not come up (one line: the cause and the log's last line).
    """
    from superinfer.adapters.manager import UnknownPolicyError
    from superinfer.adapters.sglang.config import ConfigError
    from superinfer.adapters.sglang.launch import NATIVE_POLICIES, ServeError
    from superinfer.adapters.sglang.server import (
        DEFAULT_START_TIMEOUT_S,
        ServerStartError,
        SGLangServer,
    )
    from superinfer.harness.engines.http import run_http_cell

    options = dict(config.engine_options)
    args = shlex.split(options.pop("sglang_args", ""))
    log_dir = Path(options.pop("sglang_log_dir", "") or tempfile.mkdtemp(prefix="sglang-logs-"))
    raw_timeout = options.pop("sglang_start_timeout_s", str(DEFAULT_START_TIMEOUT_S))
    try:
        timeout_s = float(raw_timeout)
    except ValueError:
        raise UserError(f"sglang_start_timeout_s={raw_timeout!r} is not a number") from None
    log_dir.mkdir(parents=True, exist_ok=True)
    config_path = options.pop("sglang_config", "") or None
    plugin = policy not in NATIVE_POLICIES
    kv_policy = config.kv_policy if plugin else None
    policy_opts = (
        [f"{k}={v}" for k, v in config.policy_options.get(policy, {}).items()] if plugin else []
    )
    try:
        server = SGLangServer(
            policy,
            args,
            kv_policy=kv_policy,
            policy_opts=policy_opts,
            config_path=config_path if plugin else None,
            log_path=log_dir / f"sglang-{policy}.log",
            start_timeout_s=timeout_s,
        )
        server.start()
    except (ConfigError, UnknownPolicyError, ServeError, ServerStartError) as exc:
        raise UserError(str(exc)) from None
    try:
        cell_config = dataclasses.replace(
            config, url=server.url, backend="sglang", engine_options=options
        )
        result = run_http_cell(cell_config, engine, policy, workload)
    finally:
        server.stop()
    result.info["sglang"] = {
        "log": str(server.log_path),
        "startup_s": round(server.startup_s or 0.0, 1),
        "argv": server.argv[3:],
        "cpu_recipe": server.recipe_line,
        "plugin": server.plugin,
        "plugin_stats": server.stats(),
    }
    return result
