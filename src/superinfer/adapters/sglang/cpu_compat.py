"""CPU test support for the SGLang adapter: an import-time stand-in for ``torchvision``.

sglang 0.5.23 imports ``torchvision.transforms`` while importing its radix cache
(``mem_cache/radix_cache.py -> base_prefix_cache -> memory_pool -> configs -> nano_nemotron_vl
-> multimodal/internvl_utils.py``). The PyPI torchvision wheel links the CUDA torch build, so next
to the CPU ``torch==2.13.0`` it fails to import (``operator torchvision::nms does not exist``). The
CPU test environment therefore leaves torchvision uninstalled and puts this finder at the *end* of
``sys.meta_path`` (from a ``.pth`` file, so spawned children get it too): a real torchvision, when
present, is always found first.

The stand-in answers imports only, never availability probes: transformers 5.19 decides whether
torchvision is usable with ``importlib.util.find_spec`` (``utils/import_utils.py::
_is_package_available``) and, told yes, imports ``torchvision.io`` for its image utilities. A probe
therefore finds nothing, while the ``import torchvision.transforms`` that sglang runs gets the
stand-in. Anything that calls a transform raises ``RuntimeError``. Nothing here is used on a GPU
server.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import sys
import sysconfig
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "PTH_NAME",
    "InterpolationMode",
    "TorchvisionStandIn",
    "install_pth",
    "install_torchvision_stand_in",
]

PTH_NAME = "superinfer_sglang_cpu.pth"
_PTH_LINE = (
    "import superinfer.adapters.sglang.cpu_compat as _m; _m.install_torchvision_stand_in()\n"
)

# What sglang 0.5.23 touches at import: ``torchvision.transforms as T`` (the names below appear in
# its multimodal preprocessing, called only when an image arrives) and
# ``torchvision.transforms.functional.InterpolationMode``.
_TRANSFORMS = ("CenterCrop", "Compose", "Lambda", "Normalize", "Resize", "ToTensor")
_PACKAGES = {"torchvision": True, "torchvision.transforms": True}
_MODULES = {"torchvision.transforms.functional": False}


class InterpolationMode(enum.Enum):
    """The interpolation modes sglang names at import (torchvision's enum values)."""

    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"


def _unavailable(name: str) -> Callable[..., Any]:
    def call(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(
            f"torchvision.transforms.{name}: torchvision is not installed (CPU stand-in of the "
            "superinfer SGLang test environment); image inputs need a real torchvision"
        )

    call.__name__ = name
    return call


def _called_by_import_statement() -> bool:
    """True when the import machinery (not ``importlib.util.find_spec``) is asking.

    Both reach a finder through ``importlib._bootstrap._find_spec``; an ``import`` statement comes
    from ``_find_and_load_unlocked`` one frame further up (CPython 3.10 to 3.13).
    """
    frame = sys._getframe(3)  # 0 this, 1 find_spec, 2 _bootstrap._find_spec, 3 its caller
    return frame.f_code.co_name == "_find_and_load_unlocked"


class TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and builds ``torchvision``, ``.transforms`` and ``.transforms.functional``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        is_package = {**_PACKAGES, **_MODULES}.get(fullname)
        if is_package is None or not _called_by_import_statement():
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "torchvision":
            module.__version__ = "0.0.0+superinfer.stand.in"  # type: ignore[attr-defined]
        elif module.__name__ == "torchvision.transforms":
            module.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]
            for name in _TRANSFORMS:
                setattr(module, name, _unavailable(name))
        else:
            module.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]


def install_torchvision_stand_in() -> None:
    """Append the stand-in finder to ``sys.meta_path`` (idempotent); imports nothing."""
    if not any(isinstance(f, TorchvisionStandIn) for f in sys.meta_path):
        sys.meta_path.append(TorchvisionStandIn())


def install_pth(site_packages: Path | None = None) -> Path:
    """Write the ``.pth`` file that installs the stand-in at every interpreter start.

    Args:
        site_packages: target folder; the running interpreter's ``purelib`` by default.

    Returns:
        The path written.
    """
    folder = site_packages or Path(sysconfig.get_paths()["purelib"])
    path = folder / PTH_NAME
    path.write_text(_PTH_LINE)
    return path
