"""What a `.pt2` may hold before `torch.export.load` opens it: `check_archive`.

# NOTE: torch 2.13's `torch.export.load` runs code a file names, read in its source
# (torch/export/pt2_archive/_package.py, torch/_export/serde/serialize.py):
# - the example inputs are unpickled with `weights_only=True` and, when that fails, again with
#   `weights_only=False` (serialize.py `deserialize_torch_artifact`): any global the pickle names;
# - a weight or constant marked `use_pickle` in the archive's own config is unpickled with
#   `weights_only=False` (_package.py `_load_state_dict`, `_load_constants`), an opaque constant with
#   `pickle.loads`, a script object with TorchScript's unpickler;
# - the archive layout of torch < 2.8 has every payload go through `deserialize_torch_artifact`;
# - an AOTInductor model in the archive (`data/aotinductor/`) is a shared library it loads;
# - a symbolic size's `expr_str` is parsed with `sympy.sympify`, which `eval`s the text.
# `check_archive` reads those members first, refusing a pickle the weights-only unpickler refuses
# (that unpickler imports and calls only its allowlist, so a pickle it accepts calls nothing else
# when loaded again without it), opaque and script objects, AOTInductor libraries, the old layout,
# and any expression other than sympy's printed form of arithmetic on sizes. hfexport writes none
# of the refused kinds. The check guards hfexport's own load (`read_program`); a plain
# `torch.export.load` of the same file does none of it.
"""

from __future__ import annotations

import ast
import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from ...errors import RuntimeLoadError

__all__ = ["check_archive"]

#: A symbol as torch names a size (`s70`, `u0`): what sympify's `locals` holds for a bare name.
_SYMBOL = re.compile(r"[a-z]+[0-9]+")
#: A float's digits, as `srepr` writes them (`Float('0.5', precision=53)`).
_FLOAT = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


def check_archive(path: str | Path) -> None:
    """Refuse (`RuntimeLoadError`) a `.pt2` whose loading would run code it carries, before
    `torch.export.load` opens it: see this module's note for what is checked and why."""
    from torch.export.pt2_archive import constants  # read from torch 2.13

    with zipfile.ZipFile(path) as archive:
        members = {name.split("/", 1)[1]: name for name in archive.namelist() if "/" in name}

        def read(name: str) -> bytes:
            return archive.read(members[name])

        if constants.ARCHIVE_VERSION_PATH not in members:
            _refuse(path, "it has the archive layout of torch < 2.8, whose every payload torch.export.load "
                          "unpickles without the weights-only check",
                    "save the program again with torch.export.save of torch >= 2.8")
        if any(name.startswith(constants.AOTINDUCTOR_DIR) for name in members):
            _refuse(path, f"it holds an AOTInductor model ({constants.AOTINDUCTOR_DIR}), a shared library that "
                          "torch.export.load loads", "save the exported program again without AOTInductor")
        for name in members:
            if name.startswith(constants.WEIGHTS_DIR) and name.endswith("_config.json"):
                _check_payloads(path, json.loads(read(name)), constants.WEIGHTS_DIR, read, constants)
            elif name.startswith(constants.CONSTANTS_DIR) and name.endswith("_config.json"):
                _check_payloads(path, json.loads(read(name)), constants.CONSTANTS_DIR, read, constants)
            elif name.startswith("data/") and name.endswith(".pt"):  # example inputs, the old layout's weights
                _check_pickle(path, name, read(name))
            elif name.startswith(constants.MODELS_DIR) and name.endswith(".json"):
                _check_expressions(path, json.loads(read(name)))


def _check_payloads(path: Any, config: dict, folder: str, read: Any, constants: Any) -> None:
    """Refuse the weights or constants of `config` (a payload config) that are not plain tensors
    or pickles of them."""
    for fqn, payload in config.get("config", {}).items():
        name = payload.get("path_name", "")
        if name.startswith((constants.CUSTOM_OBJ_FILENAME_PREFIX, constants.OPAQUE_OBJ_FILENAME_PREFIX)):
            _refuse(path, f"its constant {fqn} is a pickled Python or TorchScript object ({name}), which "
                          "torch.export.load unpickles without the weights-only check", "do not load it")
        if payload.get("use_pickle"):
            _check_pickle(path, folder + name, read(folder + name))


def _check_pickle(path: Any, name: str, data: bytes) -> None:
    """Refuse `data` (a `torch.save` pickle) unless `torch.load(weights_only=True)` takes it."""
    if not data:  # a program saved without example inputs: torch reads none
        return
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:  # noqa: BLE001 (any refusal of the weights-only unpickler)
        reason = str(error).splitlines()
        found = next((line for line in reason if "GLOBAL" in line), reason[0] if reason else type(error).__name__)
        _refuse(path, f"its {name} is a pickle that needs more than the weights-only unpickler allows "
                      f"({found.strip()}); torch.export.load would unpickle it without that check",
                "if you trust the file and the classes it names are plain data, allow them with "
                "torch.serialization.add_safe_globals before loading; otherwise do not load it")


def _check_expressions(path: Any, tree: Any) -> None:
    """Refuse every `expr_str` in `tree` (a model's JSON) that is not sympy's printed arithmetic."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "expr_str" and isinstance(value, str):
                if not _is_sympy_arithmetic(value):
                    _refuse(path, f"a symbolic size's expression {value[:120]!r} is not sympy arithmetic on sizes; "
                                  "torch.export.load would evaluate it as Python (sympy.sympify)", "do not load it")
            else:
                _check_expressions(path, value)
    elif isinstance(tree, list):
        for value in tree:
            _check_expressions(path, value)


#: The syntax allowed around calls, names and numbers: arithmetic, comparisons, logic.
_ARITHMETIC = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.operator, ast.unaryop, ast.cmpop,
               ast.boolop, ast.Load)


def _is_sympy_arithmetic(text: str) -> bool:
    """Whether `text` is made only of calls of sympy expression classes (`Mul(Integer(2), Symbol('s0',
    positive=True))`), numbers, size symbols and arithmetic: what `sympify` evaluates without
    reaching anything but sympy's own constructors."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    names = set()  # the strings allowed: a symbol's name, a float's digits
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            first = node.args[0]
            pattern = _SYMBOL if node.func.id in ("Symbol", "Dummy") else _FLOAT if node.func.id == "Float" else None
            is_string = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if pattern and is_string and pattern.fullmatch(first.value):
                names.add(id(first))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and _is_sympy_class(node.func.id)):
                return False
        elif isinstance(node, ast.keyword):
            if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, (bool, int))):
                return False
        elif isinstance(node, ast.Name):
            if not (_SYMBOL.fullmatch(node.id) or _is_sympy_class(node.id) or _is_sympy_constant(node.id)):
                return False
        elif isinstance(node, ast.Constant):
            if not (isinstance(node.value, (bool, int, float)) or id(node) in names):
                return False
        elif not isinstance(node, _ARITHMETIC):
            return False
    return True


def _sympy_namespace(name: str) -> Any:
    """What `name` is where `sympify` evaluates (sympy's namespace, torch's size functions)."""
    import sympy
    import torch.utils._sympy.functions as size_functions

    return getattr(size_functions, name, None) or getattr(sympy, name, None)


def _is_sympy_class(name: str) -> bool:
    import sympy

    found = _sympy_namespace(name)
    return not name.startswith("_") and isinstance(found, type) and issubclass(found, sympy.Basic)


def _is_sympy_constant(name: str) -> bool:
    import sympy

    return not name.startswith("_") and isinstance(_sympy_namespace(name), sympy.Basic)


def _refuse(path: Any, why: str, remedy: str) -> None:
    raise RuntimeLoadError(f"refused to load {Path(path).name}: {why}", remedy=remedy)
