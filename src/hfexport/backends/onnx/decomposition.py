"""torch.onnx's decomposition of a captured program, done once, and torch.onnx's registry, built once.

# NOTE: converting a program, torch.onnx retraces it (`run_decompositions`) with the decomposition
# table its registry gives: every op torch.onnx has no translation for is decomposed
# (`_core._prepare_exported_program_for_export` -> `_fx_passes.decompose_with_registry`). A program
# that writes its inputs in place (a static cache's `index_copy_`) was already retraced once at
# capture, with an empty table, to state the writes in its signature (`capture.trace.functionalized`):
# two full retraces of the graph (4 and 6 s on an 8-layer Llama). Any table functionalizes, so the
# ONNX exporter functionalizes with torch.onnx's own table (`decomposed_for_onnx`) and marks the
# program; torch.onnx then takes a program marked as decomposed with the table its registry gives
# as it is (`patch_torch_onnx_decompose_once`, patches.py) and still inserts its type promotions
# and drops the asserts on it. A program the mark does not fit (one re-exported after an FX-graph
# quantizer, a registry with other translations) is decomposed by torch.onnx as before.
#
# The registry (torchlib's functions with their signatures, 1-2 s to build) is built once per
# process and opset, the way `torch.onnx.export` builds it (`_compat.export_compat`: from torchlib at
# the opset, then `custom_translation_table` registered), and handed to torch.onnx's `_core.export`,
# which `torch.onnx.export` calls with it; the public function takes no registry and builds its own.
#
# Every torch.onnx name below is internal: read from torch 2.13.0
# (torch/onnx/_internal/exporter/{_core,_compat,_fx_passes,_decomp,_registration}.py);
# tests/backends/onnx/test_decomposition.py fails the day one of them disappears or changes shape.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["onnx_registry", "decomposition_table", "decomposed_for_onnx", "is_decomposed_for", "to_onnx_program"]

#: the attribute a program decomposed by `decomposed_for_onnx` carries: `(registry, the ops its table decomposed)`
_DECOMPOSED = "_hfexport_onnx_decomposed"


@functools.lru_cache(maxsize=4)
def onnx_registry(opset: int) -> Any:
    """torch.onnx's `ONNXRegistry` at `opset`, with hfexport's translations (`translations.py`),
    built as `torch.onnx.export(..., opset_version=opset, custom_translation_table=...)` builds it
    (torch 2.13.0 `_compat.export_compat`). It is only read by a conversion, so one serves them all."""
    from torch.onnx._internal.exporter import _constants, _registration

    from .translations import translation_table

    registry = _registration.ONNXRegistry.from_torchlib(opset_version=max(opset, _constants.TORCHLIB_OPSET))
    for torch_op, onnx_op in translation_table().items():
        registry.register_op(torch_op, onnx_op, is_complex=False)
    return registry


def decomposition_table(registry: Any) -> dict[Any, Any]:
    """The table torch.onnx decomposes a program with before translating it with `registry`
    (torch 2.13.0 `_fx_passes.decompose_with_registry`): every ATen decomposition of an op the
    registry does not translate."""
    from torch.onnx._internal.exporter import _decomp

    return _decomp.create_onnx_friendly_decomposition_table(set(_decomp.get_onnx_implemented_overloads(registry)))


def decomposed_for_onnx(program: torch.export.ExportedProgram, registry: Any) -> torch.export.ExportedProgram:
    """`program` functionalized and decomposed by torch.onnx's own decomposition for `registry`, in one
    retrace, and marked so that torch.onnx's conversion then takes it as it is.

    As in torch 2.13.0 `_core._prepare_exported_program_for_export`, the retrace treats size-1
    dimensions like any other (`backed_size_oblivious`)."""
    from torch.fx.experimental import _config as fx_config
    from torch.onnx._internal.exporter import _fx_passes

    with fx_config.patch(backed_size_oblivious=True):
        decomposed = _fx_passes.decompose_with_registry(program, registry)  # unmarked: torch.onnx's own
    setattr(decomposed, _DECOMPOSED, (registry, frozenset(decomposition_table(registry))))
    return decomposed


def is_decomposed_for(program: torch.export.ExportedProgram, registry: Any) -> bool:
    """Whether `decomposed_for_onnx` made `program` with the table `registry` gives: that
    registry, or one whose table decomposes the same ops (torch builds a new function object for
    some decompositions on each call, so the functions are not compared)."""
    mark = getattr(program, _DECOMPOSED, None)
    if mark is None:
        return False
    made_with, ops = mark
    return made_with is registry or ops == frozenset(decomposition_table(registry))


def to_onnx_program(program: torch.export.ExportedProgram, registry: Any, *, input_names: Sequence[str],
                    output_names: Sequence[str], opset: int, optimize: bool) -> Any:
    """`program` converted by torch.onnx with `registry`: what `torch.onnx.export(program, dynamo=True,
    input_names=..., output_names=..., opset_version=opset, optimize=optimize, verbose=False,
    report=False)` does with the registry it builds (torch 2.13.0 `_compat.export_compat`, which
    for an `ExportedProgram` adds nothing else to `_core.export`'s call)."""
    from torch.onnx._internal.exporter import _core

    return _core.export(program, (), {}, registry=registry, input_names=input_names, output_names=output_names,
                        verbose=False, report=False, optimize=optimize, opset_version=opset)
