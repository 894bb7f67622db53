"""Every built-in workaround has a "still needed" test: a test function under `tests/` that names it
and takes a workaround out with `tests.harness.without(...)`, so a new patch or FX fix cannot land
without a reproduction that fails without it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from hfexport.builtins import WORKAROUND_MODULES, load_workarounds
from hfexport.workarounds import Patch, all_workarounds

TESTS = Path(__file__).resolve().parents[1]


def _builtin_workaround_names() -> list[str]:
    """The workarounds registered by `WORKAROUND_MODULES` (not those other tests register)."""
    load_workarounds()
    names = []
    for workaround in all_workarounds():
        function = workaround.factory if isinstance(workaround, Patch) else workaround.fn
        if inspect.getmodule(function).__name__ in WORKAROUND_MODULES:
            names.append(workaround.name)
    return sorted(names)


def _calls_without(function: ast.AST) -> bool:
    return any(isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "without"
               for node in ast.walk(function))


def _names_taken_out() -> set[str]:
    """Every string literal in a test function (its decorators included, so a `parametrize` list
    counts) that calls `without(`; a name merely mentioned elsewhere in the module does not count."""
    here = Path(__file__).resolve()
    found: set[str] = set()
    for path in sorted(TESTS.rglob("test_*.py")):
        if path == here:
            continue
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and _calls_without(function):
                found.update(node.value for node in ast.walk(function)
                             if isinstance(node, ast.Constant) and isinstance(node.value, str))
    return found


def test_every_builtin_workaround_has_a_still_needed_test():
    names = _builtin_workaround_names()
    assert len(names) >= 10, f"expected the built-in workarounds, found {names}"
    taken_out = _names_taken_out()
    untested = [name for name in names if name not in taken_out]
    assert not untested, (
        f"workarounds without a still-needed test: {', '.join(untested)}. Add a test under tests/ that "
        "passes with the workaround and fails inside `with without(REGISTRY, \"<name>\"):` "
        "(see tests/models/test_view_or_copy.py)")
