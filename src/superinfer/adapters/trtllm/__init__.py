"""TensorRT-LLM 1.2.x adapter: a front-end gate (Mode A) and an in-worker scheduler (Mode B).

``tensorrt_llm`` is imported lazily and never required: the names below load their module on first
use, and importing this package (as the ``.pth`` hook of :mod:`.bootstrap` does in every
interpreter) costs nothing. See ``docs/adapters.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "FileSloTable",
    "GateConfig",
    "InMemorySloTable",
    "PrecisionRouter",
    "RetentionMapping",
    "SuperinferScheduler",
    "TrtllmGate",
    "UnsupportedEngineError",
    "install",
    "is_installed",
    "uninstall",
]

_HOME = {
    "FileSloTable": "slo_table",
    "InMemorySloTable": "slo_table",
    "GateConfig": "gate",
    "PrecisionRouter": "precision_router",
    "TrtllmGate": "gate",
    "RetentionMapping": "apply",
    "SuperinferScheduler": "scheduler",
    "UnsupportedEngineError": "engine",
    "install": "plugin",
    "is_installed": "plugin",
    "uninstall": "plugin",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
