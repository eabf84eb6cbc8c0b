"""Which implementation runs an op: the Triton kernel, or its pure-torch reference.

The Triton kernel runs wherever Triton can run it: on CUDA tensors, and on CPU tensors when the
kernels were built by Triton's interpreter (``TRITON_INTERPRET=1`` set before
``superinfer.kernels`` is first imported). The reference runs only when Triton cannot (it is not
installed, or a CPU tensor meets a compiled kernel), and a ``RuntimeWarning`` says so, once per
reason. ``backend="ref"`` or ``"triton"`` forces a choice (tests, benchmarks).
"""

import warnings
from typing import Any, Literal

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where Triton is missing

    class _NoTriton:
        """Stands in for ``triton`` and ``triton.language`` so kernel modules still import.

        Only what a kernel *definition* touches is provided: ``jit`` returns the function
        unchanged and ``constexpr`` is a bare annotation. Kernels are never launched without
        Triton: :func:`select_backend` picks the reference.
        """

        constexpr = Any

        @staticmethod
        def jit(fn: Any = None, **_: Any) -> Any:
            return fn if fn is not None else (lambda f: f)

    triton = tl = _NoTriton()
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "Backend", "is_interpreted", "select_backend", "tl", "triton"]

Backend = Literal["triton", "ref"]

_warned: set[str] = set()


def is_interpreted(kernel: object) -> bool:
    """True if ``kernel`` was built by Triton's interpreter (runs on CPU tensors)."""
    return type(kernel).__name__ == "InterpretedFunction"


def _fall_back(reason: str) -> Backend:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"{reason}: using the pure-torch reference kernels", RuntimeWarning, stacklevel=3
        )
    return "ref"


def select_backend(kernel: object, device: torch.device, backend: Backend | None = None) -> Backend:
    """Choose the implementation of one op call.

    Args:
        kernel: the op's Triton kernel (a ``JITFunction`` or ``InterpretedFunction``).
        device: device of the op's tensors.
        backend: ``None`` to choose automatically, or ``"triton"`` / ``"ref"`` to force.

    Returns:
        ``"triton"`` or ``"ref"``.

    Raises:
        RuntimeError: ``backend="triton"`` where Triton cannot run on ``device``.
        ValueError: an unknown ``backend``.
    """
    if backend == "ref":
        return "ref"
    if backend not in (None, "triton"):
        raise ValueError(f"backend must be 'triton', 'ref' or None, got {backend!r}")
    if not HAS_TRITON:
        reason = "Triton is not installed"
    elif device.type == "cuda" or (device.type == "cpu" and is_interpreted(kernel)):
        return "triton"
    elif device.type == "cpu":
        reason = (
            "Triton runs on CPU tensors only in its interpreter (set TRITON_INTERPRET=1 before "
            "superinfer.kernels is imported)"
        )
    else:
        reason = f"Triton cannot run on {device.type} tensors"
    if backend == "triton":
        raise RuntimeError(reason)
    return _fall_back(reason)
