"""`torch.export` programs on disk: `torch.export.save` / `load`, with the two things a saved
transformers program needs to come back (its cache and output classes as pytree nodes)."""

from __future__ import annotations

import importlib
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["write_program", "read_program"]


def _holds_model_output(tree: Any) -> bool:
    from transformers.utils import ModelOutput

    return any(isinstance(node, ModelOutput)
               for node in torch.utils._pytree.tree_flatten(tree, is_leaf=lambda x: isinstance(x, ModelOutput))[0])


def write_program(program: torch.export.ExportedProgram, path: Path) -> Path:
    """Write `program` to `path` (`.pt2`) in a folder the caller stages.

    # NOTE: torch.load(weights_only=True) cannot rebuild a ModelOutput (an OrderedDict subclass:
    # "Can only SETITEM for dict"), and torch 2.13's fallback then logs with a broken format
    # string (a TypeError wherever logging raises, e.g. under pytest). An encoder-decoder's
    # `encoder_outputs` is the only such input; its program is saved without example inputs
    # (nothing needs them: only a static cache template does).
    """
    example_inputs = program.example_inputs
    if _holds_model_output(example_inputs):
        program.example_inputs = None
    try:
        torch.export.save(program, path)
    finally:
        if program.example_inputs is None and example_inputs is not None:
            program.example_inputs = example_inputs
    return path


def _import_output_modules(path: Path) -> None:
    """Import the transformers modules whose classes a saved program's tree specs name.

    # NOTE: transformers registers each `ModelOutput` class as a pytree node when its module is
    # imported; `torch.export.load` of a program returning e.g. `LlavaCausalLMOutputWithPast`, in a
    # process that has not imported `modeling_llava`, fails with a generic "error when
    # deserializing" (the real NotImplementedError is only logged).
    """
    modules: set[str] = set()
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if name.endswith(".json"):
                text = archive.read(name).decode("utf-8", errors="ignore")
                modules.update(re.findall(r"(transformers(?:\.[a-z_0-9]+)+)\.[A-Z]\w*", text))
    for module in sorted(modules):
        try:
            importlib.import_module(module)
        except ImportError:
            continue
    # A program's pickled `example_inputs` may hold a ModelOutput (an encoder-decoder's
    # `encoder_outputs`); let the weights-only unpickler rebuild those plain containers.
    from transformers.utils import ModelOutput

    from ...capture.pytree import _all_subclasses

    torch.serialization.add_safe_globals([ModelOutput, *_all_subclasses(ModelOutput)])


def read_program(path: Path) -> torch.export.ExportedProgram:
    """Load the program `write_program` wrote (cache classes and output modules registered first),
    after `check_archive` found nothing in it that loading would run (`RuntimeLoadError` if it did)."""
    from ...capture.pytree import register_cache_pytree_nodes
    from .archive import check_archive

    register_cache_pytree_nodes()  # so the program's cache inputs unflatten (and load weights-only)
    _import_output_modules(path)
    check_archive(path)  # after the registrations: the classes they allow load weights-only
    return torch.export.load(path)
