"""Import direction (DESIGN §3): policy_core imports nothing of ours and no engine; sim imports
policy_core and adapters.hookspecs only; nothing but the CLI imports the harness."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "superinfer"
ENGINES = ("torch", "triton", "sglang", "tensorrt_llm", "transformers", "vllm", "pandas")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


@pytest.mark.parametrize("path", _modules("policy_core"), ids=lambda p: p.name)
def test_policy_core_is_pure(path: Path) -> None:
    for name in _imports(path):
        if name.startswith("superinfer."):
            assert name.startswith("superinfer.policy_core"), f"{path.name} imports {name}"
        assert name.split(".")[0] not in ENGINES + ("pluggy",), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", _modules("sim"), ids=lambda p: p.name)
def test_sim_imports_policy_core_and_hookspecs_only(path: Path) -> None:
    for name in _imports(path):
        if name.startswith("superinfer."):
            allowed = ("superinfer.policy_core", "superinfer.sim", "superinfer.adapters.hookspecs")
            assert name.startswith(allowed), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", _modules("adapters/sglang"), ids=lambda p: p.name)
def test_the_sglang_adapter_imports_policy_core_adapters_and_sglang_only(path: Path) -> None:
    for name in _imports(path):
        if name.startswith("superinfer."):
            assert name.startswith(("superinfer.policy_core", "superinfer.adapters")), name
        assert name.split(".")[0] not in set(ENGINES) - {"sglang", "torch"}, f"{path.name}: {name}"


def test_only_the_cli_imports_the_harness() -> None:
    for path in SRC.rglob("*.py"):
        if path.name == "cli.py" or "harness" in path.relative_to(SRC).parts:
            continue
        assert not any(n.startswith("superinfer.harness") for n in _imports(path)), path


@pytest.mark.parametrize("path", _modules("kernels"), ids=lambda p: p.name)
def test_kernels_import_torch_triton_and_themselves_only(path: Path) -> None:
    for name in _imports(path):
        if name.startswith("superinfer."):
            assert name.startswith("superinfer.kernels"), f"{path.name} imports {name}"
        assert name.split(".")[0] not in ("pluggy", "pandas", "transformers"), path.name
