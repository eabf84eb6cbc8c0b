"""The version gate, lazy imports, and what the adapter refuses."""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

import pytest

from superinfer.adapters.trtllm.engine import UnsupportedEngineError, check_version, load_engine


@pytest.mark.parametrize("version", ["1.2.0rc6", "1.2.0rc8", "1.2.0", "1.2.1", "1.2.1.post1"])
def test_accepts_the_12_series(version: str) -> None:
    check_version(version)


@pytest.mark.parametrize("version", ["1.1.0", "1.3.0rc3", "1.4.0rc4", "0.21.0", "unknown", "12.1"])
def test_refuses_other_releases_naming_them(version: str) -> None:
    with pytest.raises(
        UnsupportedEngineError, match=rf"supports 1\.2\.x; found tensorrt_llm {version}"
    ):
        check_version(version)


def test_importing_the_adapter_imports_no_engine() -> None:
    code = (
        "import sys, superinfer.adapters.trtllm as t, superinfer.adapters.trtllm.bootstrap;"
        "from superinfer.adapters.trtllm import gate, precision_router, scheduler, plugin;"
        "from superinfer.adapters.trtllm import apply, view, kv_events;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorrt_llm', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_load_engine_without_tensorrt_llm_is_an_import_error() -> None:
    if "tensorrt_llm" in sys.modules:
        pytest.skip("a tensorrt_llm is imported in this process")
    with pytest.raises(ImportError):
        load_engine()


def test_load_engine_gates_the_double_by_version(
    trtllm12: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_engine().version == "1.2.1"
    monkeypatch.setattr(trtllm12, "__version__", "1.3.0rc3")
    with pytest.raises(UnsupportedEngineError, match="found tensorrt_llm 1.3.0rc3"):
        load_engine()


def test_adapter_modules_import_the_engine_only_inside_functions() -> None:
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[3] / "src" / "superinfer" / "adapters" / "trtllm"
    other_engines = ("sglang", "vllm", "transformers", "torch", "triton", "pandas")
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert not name.startswith("tensorrt_llm"), f"{path.name} imports {name} eagerly"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module.split(".")[0] not in other_engines, (path.name, node.module)
                if node.module.startswith("superinfer."):
                    assert node.module.startswith(
                        ("superinfer.policy_core", "superinfer.adapters")
                    ), (path.name, node.module)
