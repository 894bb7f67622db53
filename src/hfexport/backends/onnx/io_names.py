"""ONNX input/output names and readable dimension names for a captured program."""

from __future__ import annotations

from typing import Any

import torch

from ...capture.names import dim_names, io_leaf_names, rename_expression
from ...record import _placeholder_tree

__all__ = ["onnx_io_names", "rename_symbolic_dims"]


def onnx_io_names(program: torch.export.ExportedProgram) -> tuple[list[str], list[str]]:
    """Input and output names: forward kwarg names, `ModelOutput` fields, and cache leaves as
    `input.cache.<layer>.<tensor>` / `output.cache.<layer>.<tensor>` pairs."""
    _, kwargs = _placeholder_tree(program.call_spec.in_spec)
    outputs = _placeholder_tree(program.call_spec.out_spec)
    return io_leaf_names(kwargs, side="input"), io_leaf_names(outputs, side="output")


def rename_symbolic_dims(model: Any, input_names: list[str], input_shapes: list[tuple]) -> dict[str, str]:
    """Rename `s0`-style dims of every value in the ONNX IR `model` to role names; return the map."""
    import onnx_ir as ir

    mapping = dim_names(input_names, input_shapes)
    if not mapping:
        return mapping

    def renamed(value: ir.Value) -> None:
        shape = value.shape
        if shape is None or not any(isinstance(d, ir.SymbolicDim) and d.value for d in shape.dims):
            return
        dims = [ir.SymbolicDim(rename_expression(d.value, mapping)) if isinstance(d, ir.SymbolicDim) and d.value
                else d for d in shape.dims]
        value.shape = ir.Shape(dims)

    graph = model.graph
    for value in [*graph.inputs, *graph.outputs]:
        renamed(value)
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for value in node.outputs:
            renamed(value)
    return mapping
