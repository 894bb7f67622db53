"""The package's import graph has no cycle, function-level imports included, and its imports follow
the layers drawn in `LAYERS` (docs/architecture.md): layering holds up by itself, not by deferred
imports."""

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


#: The package's layers, lowest first: a module may import its own layer's and lower layers'
#: modules. Each entry is a module or package under `hfexport` (`""`: `hfexport/__init__.py`); a
#: module is in the layer of its longest listed prefix (`generation.loop` above `generation`).
LAYERS = (
    ("errors", "_versions", "registry", "model_config", "timing", "resident"),  # plain helpers, no torch graph
    ("extensions", "config", "auto", "workarounds"),   # the registries, configs, patches
    ("capture",),                                      # torch.export and what it records
    ("runner", "generation"),                          # running an artifact; decomposing a model
    ("validation", "models"),                          # comparing with eager; model workarounds
    ("folder",),                                       # writing and opening an export folder
    ("generation.loop", "generation.chat", "generation.accuracy"),   # generating from a folder
    ("quantization",),                                 # quantizers (artifacts make their own copies)
    ("exporter", "backends"),                          # the pipeline and each format
    ("presets", "model_spec", "loading"),              # tiny models and loading a model
    ("job", "coverage", "fuzz"),                       # the export job, batches, the matrix, the fuzzer
    ("cli", "builtins", "utils", "exporter_dynamo", "quantizers", "__main__", ""),   # front ends, facades
)

#: Imports that run against `LAYERS`, each with why it stays (at most 4, issue 51).
ALLOWED_UPWARD = {
    # the exporter loads the built-in backends' patches and FX fixes before it traces: a plugin
    # loader above every backend, called once (`builtins.load_workarounds`)
    ("hfexport.exporter", "builtins"),
}


def _layer_of(module: str) -> tuple[str, int]:
    rest = module.split(".")[1:]
    levels = {name: index for index, names in enumerate(LAYERS) for name in names}
    for end in range(len(rest), -1, -1):
        prefix = ".".join(rest[:end])
        if prefix in levels:
            return prefix, levels[prefix]
    raise AssertionError(f"{module} is in no layer of LAYERS: add its package or module there")


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """`(module, layer entry)` for each import of a module in a higher layer."""
    found = set()
    for module, targets in graph.items():
        entry, level = _layer_of(module)
        for target in targets:
            target_entry, target_level = _layer_of(target)
            if target_level > level and not entry.startswith(target_entry + "."):
                found.add((module, target_entry))
    return found


def test_imports_follow_the_layers():
    assert upward_imports(import_graph()) == ALLOWED_UPWARD
    assert len(ALLOWED_UPWARD) <= 4


def test_the_layer_check_sees_an_upward_import():
    graph = {"hfexport.capture.trace": {"hfexport.job"}, "hfexport.job": {"hfexport.capture"}}
    assert upward_imports(graph) == {("hfexport.capture.trace", "job")}


#: What names a format in code: the four formats and the delegate.
_FORMAT_WORDS = re.compile(r"onnx|openvino|executorch|dynamo|xnnpack", re.IGNORECASE)


def test_the_export_job_and_generation_name_no_format():
    """`job/`, `generation/` and what opens and checks a generation folder are the same for every
    format: what differs per runtime (its own program, the files its LLM runner reads) lives in
    `backends/<format>/`, reached through the format's `RuntimePackage` (`folder/package.py`). Code
    only: an identifier, an import or a string that is not a docstring; prose may name the runtimes
    it explains."""
    found = []
    for path in [*sorted((ROOT / "job").glob("*.py")), *sorted((ROOT / "generation").glob("*.py")),
                 *(ROOT / "folder" / name for name in ("engine.py", "generation_export.py"))]:
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


def test_the_package_root_and_the_exporter_base_stay_small():
    """Issue 51's bounds: a loose module at the root of `src/hfexport` is one no layer owns, and
    `HfExporter` is the pipeline and a backend's hooks (docs/architecture.md); a new concern gets
    its own module in the package it belongs to, not a method or a root file."""
    from hfexport.exporter import HfExporter

    assert len(list(ROOT.glob("*.py"))) <= 20
    methods = [name for name, value in vars(HfExporter).items() if callable(value) and not isinstance(value, type)]
    assert len(methods) < 20, methods
