"""The package's import graph has no cycle, function-level imports included: layering holds up by
itself, not by deferred imports."""

from __future__ import annotations

import ast
from pathlib import Path

import hfexport

ROOT = Path(hfexport.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ["hfexport", *path.relative_to(ROOT).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(name: str, path: Path) -> set[str]:
    """Every module `name` imports (at any level of its code), `importlib.import_module("...")` included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            targets.add(module)
            targets.update(f"{module}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets.add(node.args[0].value)
    return targets


def import_graph() -> dict[str, set[str]]:
    """`module -> modules it runs when imported`: each imported module and the packages above it,
    except the importer's own packages (which are already running when it runs)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target in _imported(name, path):
            parts = target.split(".")
            for end in range(1, len(parts) + 1):
                candidate = ".".join(parts[:end])
                if candidate in modules and candidate != name and not name.startswith(candidate + "."):
                    graph[name].add(candidate)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_function_level_imports_included():
    assert cycles(import_graph()) == []


def test_the_registry_imports_nothing_of_the_package():
    assert import_graph()["hfexport.registry"] <= {"hfexport.errors"}


def test_the_checker_sees_a_cycle_through_a_function_level_import():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
