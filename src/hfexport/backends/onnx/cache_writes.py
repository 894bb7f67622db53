"""A static cache's in-place write as one ONNX op on the cache buffer itself.

# NOTE: torch.onnx (2.13) lowers `cache.index_copy_(2, cache_position, new)` (transformers'
# StaticCache update) as `Transpose(perm=[2, 0, 1, 3]) -> ScatterND -> Transpose(perm=[1, 2, 0, 3])`:
# ScatterND can only address leading axes, so the cache axis is moved to the front and back. That is
# three copies of the whole `[batch, heads, max_cache_len, head_dim]` buffer per key and value, per
# layer, per step, whatever the tokens written; and no op writes the graph input's buffer, so
# binding `input.cache.*` and `output.cache.*` to one buffer would save nothing. Rewritten as
# `ScatterElements(cache, positions expanded to new's shape, new, axis=2)`, the write is one op whose
# data input is the cache input and whose output is the cache output: with both bound to one buffer
# (`OnnxRunner.cache_session`), ONNX Runtime scatters the new rows in place and copies nothing.
"""

from __future__ import annotations

from typing import Any

from .ir_values import transpose_perm

__all__ = ["fix_index_copy_transposes"]

_TO_FRONT, _TO_BACK = [2, 0, 1, 3], [1, 2, 0, 3]


def fix_index_copy_transposes(model: Any) -> int:
    """Rewrite each `Transpose -> ScatterND -> Transpose` cache write of the ONNX IR `model` into one
    `ScatterElements` on axis 2; return how many were rewritten (the graph changed when > 0)."""
    import onnx_ir as ir

    graph = model.graph
    count = 0
    for scatter in [node for node in graph if node.op_type == "ScatterND" and node.domain == ""]:
        match = _match(scatter)
        if match is None:
            continue
        front, back, indices, updates = match
        data = front.inputs[0]
        new = _untransposed(updates, graph, scatter)
        # positions [q, 1] -> [1, 1, q, 1] -> new's shape [b, h, q, d]
        shape = ir.node("Constant", inputs=[], attributes={"value": ir.tensor([1, 1, -1, 1], dtype=ir.DataType.INT64)})
        column = ir.node("Reshape", inputs=[indices, shape.outputs[0]])
        new_shape = ir.node("Shape", inputs=[new])
        expanded = ir.node("Expand", inputs=[column.outputs[0], new_shape.outputs[0]])
        write = ir.node("ScatterElements", inputs=[data, expanded.outputs[0], new], attributes={"axis": 2})
        graph.insert_before(scatter, [shape, column, new_shape, expanded, write])
        old, out = back.outputs[0], write.outputs[0]
        out.shape, out.type = old.shape, old.type
        name = old.name
        old.replace_all_uses_with(out, replace_graph_outputs=True)
        old.name, out.name = f"{name}__transposed", name  # the output keeps its name (the cache pair)
        graph.remove([back, scatter, front], safe=True)
        producer = updates.producer()
        if producer is not None and not updates.uses() and not updates.is_graph_output():
            graph.remove(producer, safe=True)
        count += 1
    return count


def _match(scatter: Any) -> tuple | None:
    """`(front, back, indices, updates)` when `scatter` is the middle of the pattern, else None."""
    data, indices, updates = scatter.inputs[:3]
    front = data.producer() if data is not None else None
    if front is None or front.op_type != "Transpose" or transpose_perm(front) != _TO_FRONT or len(data.uses()) != 1:
        return None
    users = list(scatter.outputs[0].uses())
    if len(users) != 1 or scatter.outputs[0].is_graph_output():
        return None
    back = users[0].node
    if back.op_type != "Transpose" or transpose_perm(back) != _TO_BACK:
        return None
    # indices address the cache axis only: [q, 1]
    if indices.shape is None or len(indices.shape) != 2 or indices.shape[1] != 1:
        return None
    if scatter.attributes.get("reduction") is not None and scatter.attributes["reduction"].value != "none":
        return None
    return front, back, indices, updates


def _untransposed(updates: Any, graph: Any, before: Any) -> Any:
    """The new rows as `[b, h, q, d]`: the input of the Transpose that made `updates`, or a Transpose back."""
    import onnx_ir as ir

    producer = updates.producer()
    if producer is not None and producer.op_type == "Transpose" and transpose_perm(producer) == _TO_FRONT:
        return producer.inputs[0]
    node = ir.node("Transpose", inputs=[updates], attributes={"perm": _TO_BACK})
    graph.insert_before(before, [node])
    return node.outputs[0]
