"""Every public function, class and method of the package says what it does in a docstring
(a method that overrides a documented one of its base class inherits its docstring)."""

from __future__ import annotations

import ast
from pathlib import Path

import hfexport

ROOT = Path(hfexport.__file__).parent


def _documented_methods(tree: ast.Module) -> dict[str, set[str]]:
    """`class name -> names of its methods that have a docstring`, within one module."""
    return {node.name: {m.name for m in node.body if isinstance(m, ast.FunctionDef) and ast.get_docstring(m)}
            for node in tree.body if isinstance(node, ast.ClassDef)}


def _undocumented() -> list[str]:
    trees = {path: ast.parse(path.read_text()) for path in ROOT.rglob("*.py")}
    documented: dict[str, set[str]] = {}
    for tree in trees.values():
        for cls, methods in _documented_methods(tree).items():
            documented.setdefault(cls, set()).update(methods)
    missing = []
    for path, tree in trees.items():
        where = path.relative_to(ROOT.parent)
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                continue
            if not ast.get_docstring(node):
                missing.append(f"{where}:{node.name}")
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [getattr(b, "id", getattr(b, "attr", "")) for b in node.bases]
            inherited = set().union(*(documented.get(b, set()) for b in bases)) if bases else set()
            for method in node.body:
                if (isinstance(method, ast.FunctionDef) and not method.name.startswith("_")
                        and not ast.get_docstring(method) and method.name not in inherited):
                    missing.append(f"{where}:{node.name}.{method.name}")
    return sorted(missing)


def test_every_public_function_and_class_has_a_docstring():
    assert _undocumented() == []
