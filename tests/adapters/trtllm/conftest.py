"""The TensorRT-LLM 1.2 double on ``sys.path`` for one test, and nowhere else."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

FAKE_ROOT = Path(__file__).resolve().parents[2] / "fakes" / "trtllm12"


def _drop_trtllm_modules() -> None:
    for name in [n for n in sys.modules if n == "tensorrt_llm" or n.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture
def trtllm12(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """Import the double as ``tensorrt_llm``; uninstall Mode B and forget it afterwards."""
    from superinfer.adapters.trtllm import plugin

    _drop_trtllm_modules()
    monkeypatch.syspath_prepend(str(FAKE_ROOT))
    import tensorrt_llm

    yield tensorrt_llm
    plugin.uninstall()
    _drop_trtllm_modules()
