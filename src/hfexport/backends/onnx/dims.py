"""The dimensions an ONNX graph declares: the program's own (a number where it fixes a size, a
role name where it is symbolic), and 0-d outputs pinned to 0-d."""

from __future__ import annotations

from typing import Any

from ...capture.names import dim_names, rename_expression

__all__ = ["rename_symbolic_dims", "fix_scalar_outputs"]


def rename_symbolic_dims(model: Any, input_names: list[str], input_shapes: list[tuple]) -> dict[str, str]:
    """Declare the program's dims on every value of the ONNX IR `model`: a size the program fixes
    as a number, a symbolic one by its role name (`dim_names`); return the symbol -> name map.

    # NOTE: torch.onnx (2.13, `_core._set_shape_type`) writes `str(dim.node)` as a `dim_param` for
    # every `SymInt` of a placeholder, including one the trace resolved to a constant (a cache's
    # heads and head_dim, asked dynamic but equated with the projections' sizes, stay `SymInt`s
    # whose expression is `2`): the graph would declare `[1, '2', 'cache_length', '8']`. Such a
    # dim becomes the number it is.
    """
    import onnx_ir as ir

    mapping = dim_names(input_names, input_shapes)

    def declared(value: ir.Value) -> None:
        shape = value.shape
        if shape is None or not any(isinstance(d, ir.SymbolicDim) and d.value for d in shape.dims):
            return
        value.shape = ir.Shape([_declared_dim(d, mapping) for d in shape.dims])

    graph = model.graph
    for value in [*graph.inputs, *graph.outputs]:
        declared(value)
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for value in node.outputs:
            declared(value)
    return mapping


def _declared_dim(dim: Any, mapping: dict[str, str]) -> Any:
    """`dim` as the graph should declare it: an int for a constant, a role name for a symbol."""
    import onnx_ir as ir

    if not isinstance(dim, ir.SymbolicDim) or not dim.value:
        return dim
    if dim.value.isdigit():
        return int(dim.value)
    return ir.SymbolicDim(rename_expression(dim.value, mapping))


def fix_scalar_outputs(model: Any) -> list[str]:
    """Give every output declared 0-d a value that really is 0-d; return the outputs changed.

    # NOTE: torch.onnx (2.13) lowers a `SymInt` such as `sym_size` to a 1-element 1-D tensor, so
    # `counter + seq_len` (a static cache layer's `cumulative_length.add_(kv_length)`) comes out
    # of ONNX Runtime as shape [1] while the graph declares []. A loop feeding `output.<name>`
    # back into `input.<name>` then fails on the rank. A `Reshape(x, [])` pins the declared rank.
    """
    import numpy as np
    import onnx_ir as ir

    graph = model.graph
    changed = []
    for index, value in enumerate(list(graph.outputs)):
        if value.shape is None or len(value.shape) != 0 or value.producer() is None:
            continue
        name = value.name
        value.name = f"{name}__unpinned"
        shape = ir.node("Constant", inputs=[], attributes={"value": ir.tensor(np.array([], dtype=np.int64))})
        reshape = ir.node("Reshape", inputs=[value, shape.outputs[0]])
        pinned = reshape.outputs[0]
        pinned.name, pinned.shape, pinned.type = name, ir.Shape([]), value.type
        graph.extend([shape, reshape])
        graph.outputs[index] = pinned
        changed.append(name)
    return changed
