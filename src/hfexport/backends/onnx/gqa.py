"""A static cache's attention as ONNX Runtime's `GroupQueryAttention` on a shared past/present buffer,
the graph onnxruntime-genai runs (`genai.py` writes its config).

# NOTE: what the rewrite starts from and why onnxscript does not do it. After `optimize_for_ort`
# (onnxscript 0.7.2) a static-cache decode layer is: Q/K/V MatMuls, the rotary as Mul/Slice/Neg/
# Concat on cos/sin computed from `position_ids`, the new keys and values written by one
# `ScatterElements` each into `input.cache.<l>.keys|values` (`cache_writes.py`), the buffers sliced
# to the slots the 4-D boolean mask covers (`generation/attended.py`), repeated per query head, and
# `MultiHeadAttention` with the mask as bias. onnxscript's own GQA fusion (`ort_fusions/gqa.py`)
# matches a growing cache (`Concat(past, new)`) and a causal mask built from a 2-D `attention_mask`
# inside the graph: neither is in this graph, so the rewrite is hfexport's, anchored on what it
# knows: each `MultiHeadAttention` whose bias is the graph's boolean mask and whose key/value are
# slices of a scatter-written cache becomes
#
#     GroupQueryAttention(q, k, v, past_key=input.cache.<l>.keys, past_value=..., seqlens_k,
#                         total_sequence_length[, cos_cache, sin_cache, position_ids], num_heads, kv_num_heads,
#                         scale[, do_rotary=1]) -> (out, output.cache.<l>.keys, ...values)
#
# ONNX Runtime (1.32, `GroupQueryAttention` CPU) writes the new rows into `present_*` and shares the
# buffer with `past_*` when both are bound to one (`past_present_share_buffer`, what
# onnxruntime-genai does and `OnnxCacheSession` does). Attention is causal over slots
# `0..seqlens_k`, `seqlens_k = sum(attention_mask) - 1` from a 2-D `[batch, past + new]` mask of
# ones and `total_sequence_length = its width` (the builder's convention, read from
# `onnxruntime_genai/models/builder.py` 0.18.0 to learn the graph's shape, not copied).
#
# Rotary inside: where q and k are rotated by the standard half-split rotation
# `x * cos + cat(-x2, x1) * sin` with cos/sin whose two halves are equal, the cos/sin caches are
# the graph's own cos/sin subgraph evaluated in ONNX Runtime at positions `0..max_positions - 1`
# (so any rope scaling the model applies is in them), kept as initializers, and GQA takes the
# unrotated q/k and the graph's `position_ids` (`do_rotary=1`; given them, ONNX Runtime rotates at
# those positions, not at ones it derives from `seqlens_k`). Where q/k/v are MatMuls of one input by constant weights, they are packed
# into one MatMul whose output is GQA's packed query (key/value empty).
#
# The graph's interface changes: `attention_mask` is 2-D int64, the write counters
# (`cache.<l>.cumulative_length`) leave it (GQA counts from the mask). The export record keeps the interface hfexport's runners and validation feed
# (4-D mask, counters) and `record.details["graph_interface"]` says how to translate it
# (`graph_interface.GraphInterface`, used by `OnnxRunner`). A sliding window (the mask and-ed with a
# window the graph computes from it) becomes GQA's `local_window_size`, per layer (`window_sizes`).
#
# Softcapped scores (Gemma-2's `attn_logit_softcapping`) leave no MultiHeadAttention: onnxscript's
# SDPA fusion does not match `Softmax(cap * tanh(scale * q k^T / cap) + bias)`. Such an attention
# is matched from its `Softmax` whose input adds the mask bias (the same rule as for a
# MultiHeadAttention's bias, window included) to scores that `softcap.py` reads and checks in ONNX
# Runtime as exactly a softcap, with q, the cache writes behind k and the values, and the
# `Transpose` of its output; it becomes GQA with `softcap` and `scale` (ONNX Runtime 1.32 caps the
# scaled scores, measured there). Anything else (alibi, cross-attention, a partial rotary kept
# outside, scores capped another way) keeps today's graph or today's rotary, and the record says why.
#
# The rules that match an attention (read-only on the graph) are `gqa_match.py`; this module is
# the rewrite: the rotary caches, the new nodes, and the interface left behind.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .gqa_match import (BHSD, MASK, GqaLayer, attentions, evaluate, match_attention, match_rotary, match_softcapped,
                        window_sizes)
from .ir_values import constant_array, transpose_perm

__all__ = ["fuse_static_gqa"]

#: The positions a sliding window is measured over where the config gives no max_position_embeddings.
_WINDOW_POSITIONS = 4096


def fuse_static_gqa(model: Any, max_positions: int | None) -> tuple[Any, dict[str, Any]]:
    """Rewrite every static-cache attention of the ONNX IR `model` into `GroupQueryAttention`
    (see the module docstring); return the model to keep (a rewritten clone, or `model` itself)
    and the record's entry: `{"layers": n, "rotary": ..., "packed_qkv": n, "interface": {...}}`, or
    `{"kept": why}` when the graph keeps its attention.

    Args:
        max_positions: rows of the rotary caches, the positions GQA can rotate (ONNX Runtime
            refuses a longer sequence); `None` keeps the rotary outside GQA.
    """
    mask = next((v for v in model.graph.inputs if v.name == MASK), None)
    if mask is None or not attentions(model.graph, mask):
        return model, {"kept": "no MultiHeadAttention (or softmax over the mask) over a static cache with a boolean "
                               "attention_mask"}
    if mask.dtype is None or mask.dtype.name != "BOOL" or mask.shape is None or len(mask.shape) != 4:
        return model, {"kept": "the attention_mask is not the 4-D boolean causal mask of a static cache"}
    candidate = model.clone()  # the weights' tensors shared; the rewrite is all or nothing
    graph = candidate.graph
    mask = next(v for v in graph.inputs if v.name == MASK)
    layers = []
    for node in attentions(graph, mask):
        layer = match_attention(node, mask) if node.op_type == "MultiHeadAttention" else match_softcapped(node, mask)
        if isinstance(layer, str):
            return model, {"kept": f"{node.name or 'a ' + node.op_type}: {layer}"}
        layers.append(layer)
    if why := window_sizes(candidate, layers, max_positions or _WINDOW_POSITIONS):
        return model, {"kept": why}
    rotary_reason = match_rotary(layers, max_positions)
    caches = _rotary_caches(candidate, layers, max_positions) if rotary_reason is None else {}
    if isinstance(caches, str):
        rotary_reason, caches = caches, {}
        for layer in layers:
            layer.rotary = None
    seqlens, total = _lengths(graph, mask)
    packed = sum(_rewrite(graph, layer, seqlens, total, caches) for layer in layers)
    interface, why = _drop_unused_interface(candidate)
    if why:
        return model, {"kept": why}
    return candidate, {"layers": len(layers), "rotary": f"inside GroupQueryAttention (do_rotary=1), {max_positions} positions"
                       if rotary_reason is None else f"kept outside: {rotary_reason}",
                       "packed_qkv": packed, "interface": interface,
                       **({"local_window_size": [layer.local_window_size for layer in layers]}
                          if any(layer.window is not None for layer in layers) else {}),
                       **({"softcap": [layer.softcap for layer in layers]} if any(layer.softcap for layer in layers)
                          else {})}


# -- rotary caches ----------------------------------------------------------------------------


def _rotary_caches(model: Any, layers: list[GqaLayer], max_positions: int) -> dict | str:
    """`{cos value: (cos_cache, sin_cache)}` initializers, the graph's cos/sin evaluated at every
    position, or why not (their inputs are not `position_ids` alone, their halves differ)."""
    pairs = list(dict.fromkeys((layer.rotary[2], layer.rotary[3]) for layer in layers))
    evaluated = _evaluate_positions(model, [v for pair in pairs for v in pair], max_positions)
    if isinstance(evaluated, str):
        return evaluated
    caches = {}
    for index, (cos, sin) in enumerate(pairs):
        tables = []
        for array in evaluated[2 * index:2 * index + 2]:
            table = array.reshape(max_positions, -1)  # [1, 1, n, d] or [1, n, d]: one row per position
            half = table.shape[1] // 2
            if table.shape[1] % 2 or not np.array_equal(table[:, :half], table[:, half:]):
                return "the cos/sin the graph computes do not repeat their first half (not a standard rotary)"
            tables.append(np.ascontiguousarray(table[:, :half]))
        suffix = f"_{index}" if index else ""
        caches[cos] = tuple(_initializer(model.graph, f"{kind}_cache{suffix}", table)
                            for kind, table in zip(("cos", "sin"), tables))
    return caches


def _evaluate_positions(model: Any, values: list[Any], positions: int) -> list[np.ndarray] | str:
    """`values` of `model` computed in ONNX Runtime from `position_ids = [[0, ..., positions - 1]]`,
    when `position_ids` is the only graph input they depend on."""
    result = evaluate(model, values, {"position_ids": np.arange(positions, dtype=np.int64)[None]})
    return [np.asarray(out, dtype=np.float32) for out in result] if not isinstance(result, str) else result


# -- the rewrite ------------------------------------------------------------------------------


def _lengths(graph: Any, old_mask: Any) -> tuple[Any, Any]:
    """A new 2-D int64 `attention_mask` input in the old one's place; return `(seqlens_k, total_sequence_length)`
    computed from it (int32, as GQA takes them)."""
    import onnx_ir as ir

    batch = old_mask.shape[0]
    mask = ir.Value(name=MASK, shape=ir.Shape([batch, "attended"]), type=ir.TensorType(ir.DataType.INT64))
    old_mask.name = f"{MASK}__4d"
    graph.inputs[graph.inputs.index(old_mask)] = mask
    one = _initializer(graph, "gqa_one", np.array([1], dtype=np.int64))
    total_sum = ir.node("ReduceSum", [mask, one], {"keepdims": 0})
    last = ir.node("Sub", [total_sum.outputs[0], one])
    seqlens = ir.node("Cast", [last.outputs[0]], {"to": ir.DataType.INT32})
    shape = ir.node("Shape", [mask], {"start": 1, "end": 2})
    width = ir.node("Squeeze", [shape.outputs[0]])
    total = ir.node("Cast", [width.outputs[0]], {"to": ir.DataType.INT32})
    graph.insert_before(graph.node(0), [total_sum, last, seqlens, shape, width, total])
    seqlens.outputs[0].name, total.outputs[0].name = "seqlens_k", "total_sequence_length"
    return seqlens.outputs[0], total.outputs[0]


def _rewrite(graph: Any, layer: GqaLayer, seqlens: Any, total: Any, caches: dict) -> int:
    """Replace `layer`'s attention and cache writes with one GroupQueryAttention; return 1 when its
    q/k/v went in packed."""
    import onnx_ir as ir

    attention = layer.attention
    nodes: list = []
    packed = None
    if layer.rotary is not None:
        query_bhsd, key_bhsd, cos, _ = layer.rotary
        packed = _packed_projection(graph, [query_bhsd, key_bhsd, layer.values.inputs[2]], nodes)
        query, key, value = (packed, None, None) if packed is not None else (
            _to_bsd(query_bhsd, nodes), _to_bsd(key_bhsd, nodes), _to_bsd(layer.values.inputs[2], nodes))
        rotary_inputs = [*caches[cos], _position_ids(graph)]
    else:
        query = layer.query if layer.query is not None else _to_bsd(layer.query_bhsd, nodes)
        key, value = _to_bsd(layer.keys.inputs[2], nodes), _to_bsd(layer.values.inputs[2], nodes)
        rotary_inputs = []
    attributes = {"num_heads": layer.heads, "kv_num_heads": layer.kv_heads, "do_rotary": int(layer.rotary is not None),
                  "rotary_interleaved": 0, "local_window_size": layer.local_window_size, "softcap": layer.softcap}
    if layer.scale is not None:
        attributes["scale"] = float(layer.scale)
    gqa = ir.node("GroupQueryAttention", [query, key, value, layer.keys.inputs[0], layer.values.inputs[0], seqlens,
                                          total, *rotary_inputs], attributes, domain="com.microsoft", num_outputs=3)
    nodes.append(gqa)
    output = gqa.outputs[0]
    if layer.split_output:  # [b, s, h * d] as the [b, s, h, d] the softcapped attention's transpose gave
        shape = ir.node("Constant", [], {"value": ir.tensor(np.array([0, 0, layer.heads, -1], dtype=np.int64))})
        reshape = ir.node("Reshape", [output, shape.outputs[0]])
        nodes.extend([shape, reshape])
        output = reshape.outputs[0]
    graph.insert_before(attention, nodes)  # after every input the new nodes read, before the attention's readers
    _take_over(layer.output, output)
    _take_over(layer.keys.outputs[0], gqa.outputs[1])
    _take_over(layer.values.outputs[0], gqa.outputs[2])
    return int(packed is not None)


def _position_ids(graph: Any) -> Any:
    """The graph's `position_ids` input as GQA's rotary positions (int64 `[batch, query]`)."""
    return next(v for v in graph.inputs if v.name == "position_ids")


def _take_over(old: Any, new: Any) -> None:
    """`new` in place of `old`: its uses, its graph output, its name, shape and type."""
    name = old.name
    new.shape, new.type = old.shape, old.type
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    old.name, new.name = f"{name}__replaced", name


def _to_bsd(value: Any, nodes: list) -> Any:
    """`value` [b, h, s, d] as [b, s, h*d]: the 4-D tensor it was transposed from, reshaped."""
    import onnx_ir as ir

    transpose = value.producer()
    if transpose is not None and transpose.op_type == "Transpose" and transpose_perm(transpose) == BHSD:
        source = transpose.inputs[0]
    else:
        node = ir.node("Transpose", [value], {"perm": BHSD})
        nodes.append(node)
        source = node.outputs[0]
    shape = ir.node("Constant", [], {"value": ir.tensor(np.array([0, 0, -1], dtype=np.int64))})
    reshape = ir.node("Reshape", [source, shape.outputs[0]])
    nodes.extend([shape, reshape])
    return reshape.outputs[0]


def _projection(value: Any) -> tuple | None:
    """`(input, weight array, bias array or None, [W's value, b's or None])` where `value` [b, h, s, d]
    is `Transpose(Reshape(MatMul(input, W) [+ b]), [0, 2, 1, 3])` with constant `W` (and `b`)."""
    transpose = value.producer()
    if transpose is None or transpose.op_type != "Transpose" or transpose_perm(transpose) != BHSD:
        return None
    reshape = transpose.inputs[0].producer()
    if reshape is None or reshape.op_type != "Reshape":
        return None
    node, bias, bias_value = reshape.inputs[0].producer(), None, None
    if node is not None and node.op_type == "Add":
        for matmul, constant in (node.inputs, reversed(node.inputs)):
            if matmul.producer() is not None and matmul.producer().op_type == "MatMul" \
                    and constant_array(constant) is not None:
                node, bias, bias_value = matmul.producer(), constant_array(constant), constant
                break
        else:
            return None
    if node is None or node.op_type != "MatMul":
        return None
    weight = constant_array(node.inputs[1])
    if weight is None or weight.ndim != 2 or (bias is not None and bias.shape != (weight.shape[1],)):
        return None
    return node.inputs[0], weight, bias, [node.inputs[1], bias_value]


def _packed_projection(graph: Any, values: list[Any], nodes: list) -> Any:
    """One MatMul for the q, k and v projections when all three are MatMuls of one input by constant
    weights (with or without biases, all alike): its output `[b, s, (h + 2 kv) d]`, else None."""
    import onnx_ir as ir

    found = [_projection(v) for v in values]
    if any(f is None for f in found) or len({id(f[0]) for f in found}) != 1:
        return None
    if len({f[1].dtype for f in found}) != 1 or len({f[2] is None for f in found}) != 1:
        return None
    source = found[0][0]
    weight = _initializer(graph, None, np.concatenate([f[1] for f in found], axis=1),
                          _packed_from([f[3][0] for f in found]))
    matmul = ir.node("MatMul", [source, weight])
    nodes.append(matmul)
    out = matmul.outputs[0]
    if found[0][2] is not None:
        bias = _initializer(graph, None, np.concatenate([f[2] for f in found]), _packed_from([f[3][1] for f in found]))
        add = ir.node("Add", [out, bias])
        nodes.append(add)
        out = add.outputs[0]
    return out


def _packed_from(values: list[Any]) -> dict[str, str]:
    """The packed weight's metadata: each part's sources (a parameter's name, or those a folded
    constant was made from), which the layer stamp derives every layer's from (`layer_stamp.py`)."""
    from .layer_stamp import PACKED_FROM, folded_sources

    return {PACKED_FROM: json.dumps([folded_sources(value) for value in values])}


def _initializer(graph: Any, name: str | None, array: np.ndarray, metadata: dict[str, str] | None = None) -> Any:
    import onnx_ir as ir

    if name is None:
        index = sum(1 for n in graph.initializers if n.startswith("gqa_packed_"))
        name = f"gqa_packed_{index}"
    if name in graph.initializers:
        return graph.initializers[name]
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     const_value=ir.tensor(array, name=name), metadata_props=metadata)
    graph.register_initializer(value)
    return value


def _read_sizes_elsewhere(graph: Any) -> None:
    """Have a `Shape` read of the old 4-D mask read the same sizes from another input.

    # NOTE: torch.export names a symbolic size after the first input that has it, so a graph may
    # take the query length from the 4-D mask's shape (`[batch, 1, query, keys]`): a mixture of
    # experts sizes its token dispatch so (Mixtral, Qwen3-MoE, OLMoE). The mask is gone after the
    # rewrite; `input_ids` has the same symbol along its sequence axis.
    """
    import onnx_ir as ir

    readers = [(node, index) for node in graph for index, v in enumerate(node.inputs)
               if v is not None and v.name == f"{MASK}__4d"]
    for node, index in readers:
        if node.op_type != "Shape" or node.domain != "" or node.inputs[index].shape is None:
            continue
        dims = list(node.inputs[index].shape)
        start, end = (node.attributes[k].value if k in node.attributes else default
                      for k, default in (("start", 0), ("end", len(dims))))
        wanted = dims[start:end]
        if not wanted or not all(isinstance(dim, ir.SymbolicDim) and dim.value for dim in wanted):
            continue
        for value in graph.inputs:
            shape = list(value.shape) if value.shape is not None and value.name != MASK else []
            at = next((i for i in range(len(shape) - len(wanted) + 1)
                       if all(isinstance(a, ir.SymbolicDim) and a.value == b.value
                              for a, b in zip(shape[i:i + len(wanted)], wanted))), None)
            if at is not None:
                node.replace_input_with(index, value)
                node.attributes["start"] = ir.AttrInt64("start", at)
                node.attributes["end"] = ir.AttrInt64("end", at + len(wanted))
                break


def _drop_unused_interface(model: Any) -> tuple[dict[str, Any], str | None]:
    """Remove what the rewrite left dead: the write counters' outputs and then every input no node
    reads (the 4-D mask, the counters; `position_ids` where nothing reads it). Return the
    interface translation (`GraphInterface`'s fields), or why the rewrite must be dropped."""
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    graph = model.graph
    counters = [v for v in graph.outputs if v.name.startswith("output.cache.") and v.name.endswith(".cumulative_length")]
    for value in counters:
        graph.outputs.remove(value)
    RemoveUnusedNodesPass()(model)
    _read_sizes_elsewhere(graph)  # before `used`: the input it reads from instead is kept
    used = {id(v) for node in graph for v in node.inputs if v is not None} | {id(v) for v in graph.outputs}
    dropped = [v for v in graph.inputs if id(v) not in used]
    names = {v.name for v in dropped}
    counter_inputs = {"input." + v.name[len("output."):] for v in counters}
    if any(v is not None and v.name == f"{MASK}__4d" for node in graph for v in node.inputs):
        return {}, "the 4-D attention_mask is still read after the rewrite"
    if not counter_inputs <= names:
        return {}, f"write counters still read after the rewrite: {sorted(counter_inputs - names)}"
    for value in dropped:
        graph.inputs.remove(value)
    for name in [n for n, v in graph.initializers.items() if not v.uses() and not v.is_graph_output()]:
        graph.initializers.pop(name)
    graph.sort()
    unfed = sorted(names - counter_inputs)
    return {"mask": "2-D", "counters": sorted(n[len("input."):] for n in counter_inputs), "unfed": unfed}, None
