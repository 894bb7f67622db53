"""The package's import graph has no cycle, function-level imports included: layering holds up by
itself, not by deferred imports."""

from __future__ import annotations

import ast
import re
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


#: What names a format in code: the four formats and the delegate.
_FORMAT_WORDS = re.compile(r"onnx|openvino|executorch|dynamo|xnnpack", re.IGNORECASE)


def test_the_export_job_and_generation_name_no_format():
    """`job.py` and `generation/` are the same for every format: what differs per runtime (its own
    program, the files its LLM runner reads) lives in `backends/<format>/`, reached through the
    format's `RuntimePackage` (`folder/package.py`). Code only: an identifier, an import or a
    string that is not a docstring; prose may name the runtimes it explains."""
    found = []
    for path in [ROOT / "job.py", *sorted((ROOT / "generation").glob("*.py"))]:
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            names = {ast.Name: "id", ast.Attribute: "attr", ast.alias: "name", ast.arg: "arg", ast.FunctionDef: "name",
                     ast.ClassDef: "name", ast.ImportFrom: "module", ast.keyword: "arg"}
            text = getattr(node, names[type(node)], None) if type(node) in names else (
                node.value if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings else None)
            if text and _FORMAT_WORDS.search(text):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text[:80]!r}")
    assert found == []
