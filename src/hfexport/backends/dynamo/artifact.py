"""`torch.export` programs on disk: `torch.export.save` / `load`, with the two things a saved
transformers program needs to come back (its cache and output classes as pytree nodes)."""

from __future__ import annotations

import io
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


def read_program(source: Path | bytes, *, name: str | None = None) -> torch.export.ExportedProgram:
    """Load the program `write_program` wrote, from its bytes or its path (read once), after
    `check_archive` found in those very bytes nothing but what hfexport writes (`RuntimeLoadError`
    otherwise, naming the member and why).

    Args:
        source: the `.pt2`'s bytes (e.g. read once and checked against a folder's manifest), or
            its path.
        name: what to call the file in a refusal (default: the path's name, or "the .pt2").
    """
    from .archive import check_archive

    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    check_archive(data, name=name or (None if isinstance(source, bytes) else Path(source).name))
    # A PT2E-quantized program calls `quantized_decomposed` ops, which torch registers only when this
    # module is imported (torch 2.13 `torch/ao/quantization/fx/_decomposed.py`): in a fresh process
    # `torch.export.load` failed to resolve `dequantize_per_channel` without it.
    import torch.ao.quantization.fx._decomposed  # noqa: F401

    return torch.export.load(io.BytesIO(data))
