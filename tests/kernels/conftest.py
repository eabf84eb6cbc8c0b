"""Kernel tests run the Triton kernels (interpreter on CPU) against their references."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton", reason="kernel tests need triton (the `kernels` extra)")

from superinfer.kernels.dispatch import is_interpreted  # noqa: E402
from superinfer.kernels.quantize_kv import _quantize_key_kernel  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def _triton_can_run() -> None:
    if DEVICE.type == "cpu" and not is_interpreted(_quantize_key_kernel):
        pytest.fail(
            "kernels were built before TRITON_INTERPRET=1 was set; run pytest from the repo "
            "root so tests/conftest.py sets it"
        )
