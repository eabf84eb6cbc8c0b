"""docs/architecture.md names only things that exist: every ``.py`` path, every backticked
``superinfer.x.y`` module, and every function or class of its "who decides what" table in the
file that row names."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport (a dependency of the package there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"
TEXT = DOC.read_text()

#: A path to a Python file: at least one folder, then ``name.py``.
_PATH = re.compile(r"(?<![\w/.<>-])((?:[A-Za-z_][\w-]*/)+[A-Za-z_]\w*\.py)\b")
#: A backticked dotted name of ours.
_MODULE = re.compile(r"`(superinfer(?:\.[A-Za-z_]\w*)+)`")
#: A row of the decision table: | decision | `src/...py` | `Name`, `Class.method` ... |
_ROW = re.compile(r"^\|[^|]+\|\s*`(src/superinfer/[\w/]+\.py)`\s*\|([^|]+)\|\s*$", re.M)


def _entry_point_groups() -> set[str]:
    """Entry-point group names (``superinfer.policies``, ...): dotted, but not modules."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data.get("project", {}).get("entry-points", {}))


def _exists(path: str) -> bool:
    """``path`` from the repository root, or relative to ``src/superinfer/`` (code blocks)."""
    return (ROOT / path).is_file() or (SRC / "superinfer" / path).is_file()


def _is_module(dotted: str) -> bool:
    base = SRC.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _defines(path: Path, name: str) -> bool:
    """Whether ``path`` defines top-level ``name`` or ``Class.method``."""
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    outer, _, inner = name.partition(".")
    for node in tree.body:
        if isinstance(node, kinds) and node.name == outer:
            if not inner:
                return True
            return any(isinstance(n, kinds) and n.name == inner for n in node.body)
    return False


PATHS = sorted(set(_PATH.findall(TEXT)))
MODULES = sorted(set(_MODULE.findall(TEXT)) - _entry_point_groups())
ROWS = [
    (path, name) for path, names in _ROW.findall(TEXT) for name in re.findall(r"`([\w.]+)`", names)
]


def test_the_doc_names_paths_modules_and_decisions() -> None:
    assert len(PATHS) >= 40, PATHS
    assert any(p.startswith("src/superinfer/") for p in PATHS)
    assert len(MODULES) >= 15, MODULES
    assert len(ROWS) >= 15, ROWS


@pytest.mark.parametrize("path", PATHS)
def test_every_path_exists(path: str) -> None:
    assert _exists(path), f"docs/architecture.md names {path}, which does not exist"


@pytest.mark.parametrize("dotted", MODULES)
def test_every_backticked_module_exists(dotted: str) -> None:
    assert _is_module(dotted), f"docs/architecture.md names module {dotted}, which does not exist"


@pytest.mark.parametrize(("path", "name"), ROWS, ids=lambda v: str(v))
def test_every_decision_is_made_where_the_table_says(path: str, name: str) -> None:
    assert (ROOT / path).is_file(), path
    assert _defines(ROOT / path, name), f"{path} defines no {name}"


def test_the_path_pattern_finds_paths_and_skips_placeholders() -> None:
    found = _PATH.findall("`src/superinfer/sim/kv.py`, sim/engine.py, adapters/<engine>/view.py")
    assert found == ["src/superinfer/sim/kv.py", "sim/engine.py"]
