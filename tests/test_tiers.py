"""The test tiers: a test module imports an optional backend only through `pytest.importorskip`,
so the fast tier (`pytest -m "not slow"`) collects and runs with no extra installed."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import import BACKEND_PACKAGES

TESTS = Path(__file__).parent


def _module_level_backend_imports(path: Path) -> list[str]:
    """`file:line imports name` for each `import`/`from ... import` of a backend package at module level."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{path.relative_to(TESTS)}:{node.lineno} imports {name}" for name in names
                  if name.split(".")[0] in BACKEND_PACKAGES]
    return found


def test_test_modules_import_backends_only_through_importorskip():
    found = [line for path in sorted(TESTS.rglob("*.py")) for line in _module_level_backend_imports(path)]
    assert not found, "use pytest.importorskip(...) instead: " + "; ".join(found)
