"""Mode B in worker processes: an env-gated import hook, installed as a ``.pth`` file.

TensorRT-LLM 1.2 builds its ``PyExecutor`` in an MPI-spawned worker process by default, even for
TP1 (engine notes §1.3), where a patch applied in the launching process never arrives. A ``.pth``
file in site-packages runs in *every* interpreter, workers included::

    python -m superinfer.adapters.trtllm.bootstrap install     # writes superinfer_trtllm.pth
    export SUPERINFER_TRTLLM_CONFIG=/path/mode_b.json          # only then does anything happen

With the variable unset the hook costs one environment lookup and imports nothing of superinfer.
With it set, the hook waits for ``tensorrt_llm._torch.pyexecutor.py_executor_creator`` to be
imported (it never imports TensorRT-LLM itself) and then calls
:func:`superinfer.adapters.trtllm.plugin.install` with the configured policy. The configuration
file (JSON)::

    {"policy": "priority",                       # a registered policy name
     "options": {"max_repeat_steps": "8"},       # its options (optional)
     "slo_classes": {"chat": {"ttft_ms": 1000, "tpot_ms": 100, "priority": 0},
                     "batch": {"deadline_s": 600, "priority": 1}},
     "default_slo": "batch",                     # class of requests nobody registered
     "slo_table": "/path/slo_table.jsonl"}       # FileSloTable the front end appends to

A bad file is reported in one line on stderr at interpreter start, and the executor construction
then fails with the same message (the engine never runs without the policy it was told to use).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "CONFIG_ENV",
    "PTH_NAME",
    "BootstrapConfig",
    "BootstrapError",
    "install_from_env",
    "install_pth",
    "load_config",
    "main",
    "uninstall_pth",
]

CONFIG_ENV = "SUPERINFER_TRTLLM_CONFIG"
PTH_NAME = "superinfer_trtllm.pth"
#: Checks the variable before importing anything of ours: it runs in every interpreter.
PTH_LINE = (
    "import os; os.environ.get('SUPERINFER_TRTLLM_CONFIG') and __import__("
    "'superinfer.adapters.trtllm.bootstrap', fromlist=['_']).install_from_env()\n"
)
_CREATOR = "tensorrt_llm._torch.pyexecutor.py_executor_creator"
_SLO_FIELDS = ("ttft_ms", "tpot_ms", "deadline_s", "weight", "priority")


class BootstrapError(ValueError):
    """A bad Mode B configuration (one line, naming the file and the field)."""


@dataclass(frozen=True)
class BootstrapConfig:
    """A parsed configuration file (see the module docstring)."""

    path: Path
    policy: str
    options: Mapping[str, str] = field(default_factory=dict)
    slo_classes: Mapping[str, Any] = field(default_factory=dict)
    default_slo: str | None = None
    slo_table: Path | None = None


def load_config(path: str | os.PathLike[str]) -> BootstrapConfig:
    """Read and check a Mode B configuration file.

    Raises:
        BootstrapError: unreadable file, bad JSON, a missing or mistyped field, an unknown
            ``default_slo``; the message names the file and the field.
    """
    from superinfer.policy_core.types import SLO

    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BootstrapError(f"{p}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise BootstrapError(f"{p}:{exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise BootstrapError(f"{p}: expected a JSON object")
    policy = raw.get("policy")
    if not isinstance(policy, str) or not policy:
        raise BootstrapError(f"{p}: field 'policy' must be a policy name")
    options = raw.get("options", {})
    if not isinstance(options, dict):
        raise BootstrapError(f"{p}: field 'options' must be an object")
    classes: dict[str, SLO] = {}
    for name, spec in dict(raw.get("slo_classes", {})).items():
        if not isinstance(spec, dict) or set(spec) - set(_SLO_FIELDS):
            raise BootstrapError(
                f"{p}: slo_classes.{name} must be an object with fields {', '.join(_SLO_FIELDS)}"
            )
        try:
            classes[name] = SLO(name, **spec)
        except (TypeError, ValueError) as exc:
            raise BootstrapError(f"{p}: slo_classes.{name}: {exc}") from None
    default = raw.get("default_slo")
    if default is not None and default not in classes:
        raise BootstrapError(f"{p}: default_slo {default!r} is not in slo_classes")
    table = raw.get("slo_table")
    if table is not None and not isinstance(table, str):
        raise BootstrapError(f"{p}: field 'slo_table' must be a path")
    return BootstrapConfig(
        path=p,
        policy=policy,
        options={str(k): str(v) for k, v in options.items()},
        slo_classes=classes,
        default_slo=default,
        slo_table=None if table is None else Path(table),
    )


def _install(config: BootstrapConfig) -> None:
    from superinfer.adapters.manager import build_plugin_manager
    from superinfer.adapters.trtllm import plugin
    from superinfer.adapters.trtllm.slo_table import FileSloTable, InMemorySloTable

    pm = build_plugin_manager(config.policy, config.options)
    table = (
        FileSloTable(config.slo_table, config.slo_classes)
        if config.slo_table is not None
        else InMemorySloTable()
    )
    default = config.slo_classes[config.default_slo] if config.default_slo else plugin.DEFAULT_SLO
    plugin.install(pm.hook, slo_table=table, default_slo=default)


class _RunAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` right after ``fullname`` is executed, on every import of it."""

    def __init__(self, fullname: str, callback: Callable[[ModuleType], None]) -> None:
        self.fullname = fullname
        self.callback = callback
        self._finding = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.fullname or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _CallbackLoader(spec.loader, self.callback)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, callback: Callable[[ModuleType], None]):
        self.loader = loader
        self.callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.callback(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... of the real loader
        return getattr(self.__dict__["loader"], name)


def install_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Arm Mode B for this interpreter when ``SUPERINFER_TRTLLM_CONFIG`` is set.

    Returns:
        Whether the hook was armed (or, if TensorRT-LLM's creator module is already imported,
        the patch applied).

    Raises:
        BootstrapError: only when the creator module is already imported and the configuration
            is bad (otherwise the error is printed now and raised when the executor is built).
    """
    env = os.environ if environ is None else environ
    path = env.get(CONFIG_ENV)
    if not path:
        return False
    try:
        config: BootstrapConfig | BootstrapError = load_config(path)
    except BootstrapError as exc:
        print(f"superinfer: {exc}", file=sys.stderr)
        config = exc

    def on_import(module: ModuleType) -> None:
        if isinstance(config, BootstrapError):
            original = module.create_py_executor_instance

            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise BootstrapError(f"superinfer Mode B not installed: {config}")

            refuse.__wrapped__ = original  # type: ignore[attr-defined]
            setattr(module, "create_py_executor_instance", refuse)  # noqa: B010
            return
        _install(config)

    if _CREATOR in sys.modules:
        on_import(sys.modules[_CREATOR])
    else:
        sys.meta_path.insert(0, _RunAfterImport(_CREATOR, on_import))
    return True


def _site_dir(site_dir: str | None) -> Path:
    return Path(site_dir) if site_dir else Path(sysconfig.get_paths()["purelib"])


def install_pth(site_dir: str | None = None) -> Path:
    """Write the ``.pth`` hook into ``site_dir`` (this environment's site-packages by default)."""
    target = _site_dir(site_dir) / PTH_NAME
    target.write_text(PTH_LINE, encoding="utf-8")
    return target


def uninstall_pth(site_dir: str | None = None) -> Path | None:
    """Remove the ``.pth`` hook; returns its path, or ``None`` when there was none."""
    target = _site_dir(site_dir) / PTH_NAME
    if not target.exists():
        return None
    target.unlink()
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m superinfer.adapters.trtllm.bootstrap install|uninstall|status|check``."""
    parser = argparse.ArgumentParser(prog="python -m superinfer.adapters.trtllm.bootstrap")
    parser.add_argument("action", choices=("install", "uninstall", "status", "check"))
    parser.add_argument("--site-dir", help="site-packages folder (default: this environment's)")
    parser.add_argument("--config", help=f"configuration file to check (default: ${CONFIG_ENV})")
    args = parser.parse_args(argv)
    if args.action == "install":
        print(f"wrote {install_pth(args.site_dir)}; set {CONFIG_ENV} to enable Mode B")
    elif args.action == "uninstall":
        removed = uninstall_pth(args.site_dir)
        print(f"removed {removed}" if removed else "no superinfer .pth hook installed")
    elif args.action == "status":
        target = _site_dir(args.site_dir) / PTH_NAME
        armed = os.environ.get(CONFIG_ENV) or "unset"
        print(
            f"hook: {'installed' if target.exists() else 'absent'} ({target}); {CONFIG_ENV}={armed}"
        )
    else:
        path = args.config or os.environ.get(CONFIG_ENV)
        if not path:
            print(f"superinfer: no --config and {CONFIG_ENV} is unset", file=sys.stderr)
            return 2
        from superinfer.adapters.manager import UnknownPolicyError, build_plugin_manager

        try:
            config = load_config(path)
            build_plugin_manager(config.policy, config.options)
        except (BootstrapError, UnknownPolicyError) as exc:
            print(f"superinfer: {exc}", file=sys.stderr)
            return 1
        print(f"{config.path}: policy {config.policy}, {len(config.slo_classes)} SLO classes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
