"""Import direction (DESIGN §3): policy_core imports nothing of ours and no engine; sim imports
policy_core and adapters.hookspecs only; nothing but the CLI imports the harness; the harness
rooms import only the rooms before them on a run's data path; no import cycle inside src/."""

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


def _is_cli(path: Path) -> bool:
    """``cli.py`` and the ``cli_<command>.py`` modules that register a command of their own."""
    return path.parent == SRC and (path.name == "cli.py" or path.name.startswith("cli_"))


def test_only_the_cli_imports_the_harness() -> None:
    for path in SRC.rglob("*.py"):
        if _is_cli(path) or "harness" in path.relative_to(SRC).parts:
            continue
        assert not any(n.startswith("superinfer.harness") for n in _imports(path)), path


@pytest.mark.parametrize("path", _modules("serve"), ids=lambda p: p.name)
def test_the_server_imports_policy_core_adapters_and_itself_only(path: Path) -> None:
    for name in _imports(path):
        if name.startswith("superinfer."):
            allowed = ("superinfer.serve", "superinfer.adapters", "superinfer.policy_core")
            assert name.startswith(allowed), f"{path.name} imports {name}"


def test_only_the_cli_and_the_harness_import_the_server() -> None:
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC).parts
        if _is_cli(path) or parts[0] in ("serve", "harness"):
            continue
        assert not any(n.startswith("superinfer.serve") for n in _imports(path)), path


@pytest.mark.parametrize("path", _modules("kernels"), ids=lambda p: p.name)
def test_kernels_import_torch_triton_and_themselves_only(path: Path) -> None:
    for name in _imports(path):
        if name.startswith("superinfer."):
            assert name.startswith("superinfer.kernels"), f"{path.name} imports {name}"
        assert name.split(".")[0] not in ("pluggy", "pandas", "transformers"), path.name


# -- the harness rooms (DESIGN §3; harness/__init__.py) ------------------------------------------

#: Rooms of the harness along a run's data path; a room imports only rooms of lower or equal
#: rank. ``engines.registry`` is data only (no runner), so the report may read it.
HARNESS_RANKS = {
    "errors": 0,
    "workload": 1,
    "engines.registry": 2,
    "report": 3,
    "policies": 4,
    "engines": 5,
    "bench": 6,
    "grid": 7,
    "offline": 8,
    "suites": 9,
    "conform": 10,
    "suites_seed": 9,
    "suites_engines": 9,
    "suites_engines_report": 9,
    "suites_engines_knee": 9,
    "suites_engines_options": 9,
    "suites_engines_fidelity": 9,
    "suites_engines_checks": 9,
    "suites_engines_workload": 9,
    "suites_engines_replay": 9,
}


def _room(module: str) -> str | None:
    """The harness room of dotted ``module`` (``superinfer.harness.engines.sim`` -> ``engines``)."""
    prefix = "superinfer.harness."
    if not module.startswith(prefix):
        return None
    rest = module[len(prefix) :]
    if rest == "engines.registry" or rest.startswith("engines.registry."):
        return "engines.registry"
    return rest.split(".")[0]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _all_imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at top level or lazily inside a function; ``from P import
    N`` counts as ``P.N`` when that is a module of ours, else ``P``; relative imports resolved."""
    own = _module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                names.add(candidate if candidate in _OWN_MODULES else base)
    return names


_OWN_MODULES = {_module_name(p) for p in SRC.rglob("*.py")}


@pytest.mark.parametrize("path", _modules("harness"), ids=lambda p: str(p.relative_to(SRC)))
def test_harness_rooms_import_only_downward(path: Path) -> None:
    room = _room(_module_name(path))
    if room is None:  # harness/__init__.py
        return
    assert room in HARNESS_RANKS, f"{path}: room {room!r} has no rank in HARNESS_RANKS"
    for name in _all_imports(path):
        target = _room(name)
        if target is None:
            continue
        assert HARNESS_RANKS[target] <= HARNESS_RANKS[room], (
            f"{path.relative_to(SRC)} (room {room}) imports {name} (room {target}): upward"
        )


def test_the_report_imports_no_engine_runner() -> None:
    for path in _modules("harness/report"):
        for name in _all_imports(path):
            if name.startswith("superinfer.harness.engines"):
                assert name == "superinfer.harness.engines.registry", f"{path.name}: {name}"


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (node -> successors)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_strongly_connected_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert sorted(_strongly_connected(graph)) == [["a", "b", "c"], ["d"]]


def test_no_import_cycle_inside_src() -> None:
    graph = {
        _module_name(path): {n for n in _all_imports(path) if n in _OWN_MODULES}
        for path in SRC.rglob("*.py")
    }
    graph = {node: succs - {node} for node, succs in graph.items()}
    cycles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_no_source_file_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert not long, f"files over 600 lines: {long}"


def test_engine_ids_are_compared_only_in_the_registry() -> None:
    """No ``== "sim:..."``, ``startswith("sim:")`` or ``in ("hf", ...)`` outside the registry.

    An HTTP *backend* (``--backend sglang``: a client dialect) is not an engine id.
    """
    import re

    pattern = re.compile(
        r"""(==|!=)\s*["'](sim:[\w-]+|hf|http|sglang)["']"""
        r"""|startswith\(\s*["']sim:?["']"""
        r"""|\bengine\w*\s+(not\s+)?in\s+\(\s*["'](sim:[\w-]+|hf|http)["']"""
    )
    registry = SRC / "harness" / "engines" / "registry.py"
    hits = [
        f"{p.relative_to(SRC)}:{i}: {line.strip()}"
        for p in SRC.rglob("*.py")
        if p != registry
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line) and "backend" not in line
    ]
    assert not hits, "engine ids compared outside harness/engines/registry.py:\n" + "\n".join(hits)
