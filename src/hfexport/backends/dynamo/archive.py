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

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import torch

from ...errors import RuntimeLoadError
from .expressions import is_guard, is_size_expression

__all__ = ["check_archive"]

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
    """Refuse every `expr_str` in `tree` (a model's JSON) outside the size grammar, and every guard
    outside the guard grammar (`expressions.py`)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "expr_str":
                if not (isinstance(value, str) and is_size_expression(value)):
                    _refuse(path, f"a symbolic size's expression {str(value)[:120]!r} is not one of the size "
                                  "expressions hfexport's programs hold; torch.export.load would evaluate it as "
                                  "Python (sympy.sympify)", "do not load it")
            elif key == "guards_code" and isinstance(value, list):
                for guard in value:
                    if not (isinstance(guard, str) and is_guard(guard)):
                        _refuse(path, f"its guard {str(guard)[:120]!r} is not a test on input sizes; the loaded "
                                      "program would run it as Python before each run", "do not load it")
            else:
                _check_expressions(path, value)
    elif isinstance(tree, list):
        for value in tree:
            _check_expressions(path, value)


def _refuse(path: Any, why: str, remedy: str) -> None:
    raise RuntimeLoadError(f"refused to load {Path(path).name}: {why}", remedy=remedy)
