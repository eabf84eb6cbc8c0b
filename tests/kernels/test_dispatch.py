"""dispatch: Triton where it can run, the reference otherwise, and a warning that says so."""

from __future__ import annotations

import warnings

import pytest
import torch

from superinfer.kernels import dispatch
from superinfer.kernels.quantize_kv import _quantize_key_kernel


class _CompiledKernel:
    """Stands in for a compiled JITFunction: it cannot take CPU tensors."""


def test_interpreted_kernels_run_on_cpu() -> None:
    assert dispatch.is_interpreted(_quantize_key_kernel)
    assert dispatch.select_backend(_quantize_key_kernel, torch.device("cpu")) == "triton"
    assert dispatch.select_backend(_quantize_key_kernel, torch.device("cpu"), "ref") == "ref"


def test_compiled_kernel_on_cpu_falls_back_once_with_a_warning(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(dispatch, "_warned", set())
    with pytest.warns(RuntimeWarning, match="TRITON_INTERPRET=1.*pure-torch reference"):
        assert dispatch.select_backend(_CompiledKernel(), torch.device("cpu")) == "ref"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not on every call
        assert dispatch.select_backend(_CompiledKernel(), torch.device("cpu")) == "ref"
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        dispatch.select_backend(_CompiledKernel(), torch.device("cpu"), "triton")


def test_missing_triton_falls_back(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(dispatch, "HAS_TRITON", False)
    monkeypatch.setattr(dispatch, "_warned", set())
    with pytest.warns(RuntimeWarning, match="Triton is not installed"):
        assert dispatch.select_backend(_quantize_key_kernel, torch.device("cpu")) == "ref"
    with pytest.raises(ValueError, match="backend must be"):
        dispatch.select_backend(_quantize_key_kernel, torch.device("cpu"), "cuda")  # type: ignore[arg-type]
