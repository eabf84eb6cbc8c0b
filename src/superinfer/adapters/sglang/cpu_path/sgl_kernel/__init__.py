"""Import-only stand-in for ``sgl_kernel`` on a CPU machine (superinfer's SGLang CPU recipe).

sglang 0.5.23 imports CPU ops from ``sgl_kernel`` at module level when it runs on CPU
(``kernels/ops/kvcache/cache_move.py``, ``mem_cache/allocation.py``, the speculative-decoding
modules), and PyPI has no CPU build of that package (``../shared/engines/sglang-cpu.md``). On the
Llama path with ``SGLANG_USE_CPU_ENGINE=1`` none of those ops is ever called, so every name
resolves to a placeholder that raises one line naming the op if it is called. No
``torch.ops.sgl_kernel.*`` op is registered, so SGLang's AMX CPU path stays off.

Only :mod:`superinfer.adapters.sglang.launch` puts this folder's parent on the server's
``PYTHONPATH``; nothing else imports it.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.0.0+superinfer.cpu.stand.in"


class _Unavailable:
    """A CPU op that this stand-in does not provide; calling it raises ``NotImplementedError``."""

    def __init__(self, name: str) -> None:
        self.__name__ = self.__qualname__ = name

    def __call__(self, *_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{self.__name__}: not available on CPU (superinfer's import-only "
            "sgl_kernel stand-in; this SGLang path needs the real sgl_kernel CPU build)"
        )

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self.__name__}>"


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Unavailable(name)
