"""Double of ``tensorrt_llm.bindings.internal``: pure-Python stand-ins of C++ components."""

from . import algorithms, batch_manager

__all__ = ["algorithms", "batch_manager"]
