"""pytest configuration: GPU tests skip themselves where no CUDA device is present.

Without a CUDA device, Triton kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` must be
set before ``superinfer.kernels`` is first imported (kernels are built at import), so it is set
here, before any test module is collected. An explicit ``TRITON_INTERPRET`` is left alone.
"""

from __future__ import annotations

import os

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
