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
# (`graph_interface.GraphInterface`, used by `OnnxRunner`). A sliding window (the mask and-ed with a window the
# graph computes from it) becomes GQA's `local_window_size`, per layer (`_window_sizes`).
#
# Softcapped scores (Gemma-2's `attn_logit_softcapping`) leave no MultiHeadAttention: onnxscript's
# SDPA fusion does not match `Softmax(cap * tanh(scale * q k^T / cap) + bias)`. Such an attention
# is matched from its `Softmax` whose input adds the mask bias (the same `_mask_bias`, window
# included) to scores that `softcap.py` reads and checks in ONNX Runtime as exactly a softcap, with
# q, the cache writes behind k and the values, and the `Transpose` of its output; it becomes GQA
# with `softcap` and `scale` (ONNX Runtime 1.32 caps the scaled scores, measured there). Anything
# else (alibi, cross-attention, a partial rotary kept outside, scores capped another way) keeps
# today's graph or today's rotary, and the record says why.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .softcap import softcapped_scores

__all__ = ["fuse_static_gqa"]

_MASK = "attention_mask"
_BHSD = [0, 2, 1, 3]
_MHA_ATTRIBUTES = {"num_heads", "scale", "mask_filter_value", "unidirectional"}
#: The positions a sliding window is measured over where the config gives no max_position_embeddings.
_WINDOW_POSITIONS = 4096


@dataclasses.dataclass
class _Layer:
    attention: Any  # the node the rewrite goes before: the MultiHeadAttention, or a softcapped attention's Transpose
    query: Any  # q as [b, s, h * d] (MultiHeadAttention's), or None
    query_bhsd: Any  # q as [b, h, s, d] where the graph has it, else None
    output: Any  # what GroupQueryAttention's output replaces: [b, s, h * d], or [b, s, h, d] where `split_output`
    keys: Any  # the ScatterElements writing the keys
    values: Any
    heads: int
    kv_heads: int
    scale: float | None
    softcap: float = 0.0  # GQA's attribute: `softcap * tanh(scale * scores / softcap)` (0: none)
    split_output: bool = False
    rotary: tuple | None = None  # (x_query, x_key, cos, sin): the unrotated q/k [b, h, s, d], the rotation's inputs
    window: Any = None  # the boolean the mask is and-ed with (a sliding window), or None
    local_window_size: int = -1  # GQA's attribute: the keys it attends, up to the query's own (-1: all)


def fuse_static_gqa(model: Any, max_positions: int | None) -> tuple[Any, dict[str, Any]]:
    """Rewrite every static-cache attention of the ONNX IR `model` into `GroupQueryAttention`
    (see the module docstring); return the model to keep (a rewritten clone, or `model` itself)
    and the record's entry: `{"layers": n, "rotary": ..., "packed_qkv": n, "interface": {...}}`, or
    `{"kept": why}` when the graph keeps its attention.

    Args:
        max_positions: rows of the rotary caches, the positions GQA can rotate (ONNX Runtime
            refuses a longer sequence); `None` keeps the rotary outside GQA.
    """
    mask = next((v for v in model.graph.inputs if v.name == _MASK), None)
    if mask is None or not _attentions(model.graph, mask):
        return model, {"kept": "no MultiHeadAttention (or softmax over the mask) over a static cache with a boolean "
                               "attention_mask"}
    if mask.dtype is None or mask.dtype.name != "BOOL" or mask.shape is None or len(mask.shape) != 4:
        return model, {"kept": "the attention_mask is not the 4-D boolean causal mask of a static cache"}
    candidate = model.clone()  # the weights' tensors shared; the rewrite is all or nothing
    graph = candidate.graph
    mask = next(v for v in graph.inputs if v.name == _MASK)
    layers = []
    for node in _attentions(graph, mask):
        layer = _match(node, mask) if node.op_type == "MultiHeadAttention" else _match_softcapped(node, mask)
        if isinstance(layer, str):
            return model, {"kept": f"{node.name or 'a ' + node.op_type}: {layer}"}
        layers.append(layer)
    if why := _window_sizes(candidate, layers, max_positions or _WINDOW_POSITIONS):
        return model, {"kept": why}
    rotary_reason = _match_rotary(layers, max_positions)
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


def _attentions(graph: Any, mask: Any) -> list[Any]:
    """The nodes each attention is matched from, in graph order: every `MultiHeadAttention`, and
    every `Softmax` of scores plus the mask as a bias (an attention the fusion left unfused, as it
    leaves a softcapped one)."""
    found = []
    for node in graph:
        if node.op_type == "MultiHeadAttention" and node.domain == "com.microsoft":
            found.append(node)
        elif node.op_type == "Softmax" and node.domain == "" and _biased_scores(node, mask) is not None:
            found.append(node)
    return found


def _biased_scores(softmax: Any, mask: Any) -> tuple[Any, Any] | None:
    """`(scores, bias)` where `softmax` reads `scores + bias` with `bias` the mask (`_mask_bias`), else None."""
    add = softmax.inputs[0].producer()
    if add is None or add.op_type != "Add":
        return None
    for scores, bias in (add.inputs, reversed(add.inputs)):
        if _mask_bias(bias, mask) is not None:
            return scores, bias
    return None


def _match(node: Any, mask: Any) -> _Layer | str:
    """The layer around the MultiHeadAttention `node`, or why it is not a static-cache attention."""
    inputs = list(node.inputs) + [None] * (6 - len(node.inputs))
    query, key, value, bias, padding, attention_bias = inputs[:6]
    if bias is not None or padding is not None or any(v is not None for v in inputs[6:]):
        return "it takes a bias, key padding mask or past of its own"
    if set(node.attributes) - _MHA_ATTRIBUTES or node.attributes.get_int("unidirectional", 0):
        return f"attributes {sorted(node.attributes)} beyond {sorted(_MHA_ATTRIBUTES)}"
    matched = _mask_bias(attention_bias, mask) if attention_bias is not None else None
    if matched is None:
        return ("its bias is not the boolean attention_mask (or the mask and a window) as 0/-inf (a softcap or "
                "alibi built on it); GroupQueryAttention's causal mask would not be the model's")
    keys, values = _cache_write(key), _cache_write(value)
    if keys is None or values is None:
        return "its key/value are not slices of a cache written in place (cross-attention, or a growing cache)"
    heads = node.attributes.get_int("num_heads", 0)
    cache_shape = keys.inputs[0].shape
    kv_heads = cache_shape[1] if cache_shape is not None and len(cache_shape) == 4 else None
    if not isinstance(kv_heads, int) or not heads or heads % kv_heads:
        return f"{heads} query heads cannot share {kv_heads} key/value heads"
    scale = node.attributes.get("scale")
    return _Layer(node, query, _through_bsd(query), node.outputs[0], keys, values, heads, kv_heads,
                  scale.value if scale is not None else None, window=matched if matched is not True else None)


def _match_softcapped(softmax: Any, mask: Any) -> _Layer | str:
    """The layer around the `softmax` of softcapped scores plus the mask (`softcap.py`): its
    probabilities times the cache's values, transposed to `[b, s, h, d]`; or why it is not."""
    scores, bias = _biased_scores(softmax, mask)
    if softmax.attributes.get_int("axis", -1) not in (-1, 3):
        return "its softmax is not over the keys"
    capped = softcapped_scores(scores)
    if isinstance(capped, str):
        return f"its scores are not softcapped the way GroupQueryAttention softcaps: {capped}"
    readers = softmax.outputs[0].uses()
    product = readers[0].node if len(readers) == 1 else None
    if product is None or product.op_type != "MatMul" or product.inputs[0] is not softmax.outputs[0]:
        return "its probabilities are read by more than their product with the values"
    readers = product.outputs[0].uses()
    transpose = readers[0].node if len(readers) == 1 else None
    if transpose is None or transpose.op_type != "Transpose" or _perm(transpose) != _BHSD:
        return "its output is not transposed to [batch, sequence, heads, head_size] alone"
    keys, values = _cache_write(capped.key), _cache_write(product.inputs[1])
    if keys is None or values is None:
        return "its key/value are not slices of a cache written in place (cross-attention, or a growing cache)"
    query_shape, cache_shape = capped.query.shape, keys.inputs[0].shape
    heads = query_shape[1] if query_shape is not None and len(query_shape) == 4 else None
    kv_heads = cache_shape[1] if cache_shape is not None and len(cache_shape) == 4 else None
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or heads % kv_heads:
        return f"{heads} query heads cannot share {kv_heads} key/value heads"
    window = _mask_bias(bias, mask)
    return _Layer(transpose, None, capped.query, transpose.outputs[0], keys, values, heads, kv_heads, capped.scale,
                  softcap=capped.softcap, split_output=True, window=window if window is not True else None)


def _mask_bias(value: Any, mask: Any) -> Any:
    """`True` where `value` is `Expand(Where(mask, 0, very negative))`, the boolean mask as an additive
    bias; `w` where it is `Expand(Where(And(mask, w), 0, very negative))` (a sliding window, checked
    in `_window_sizes`); else None."""
    node = value.producer()
    while node is not None and node.op_type == "Expand":
        node = node.inputs[0].producer()
    if node is None or node.op_type != "Where":
        return None
    allowed, blocked = (_constant(v) for v in node.inputs[1:3])
    if allowed is None or blocked is None or allowed.size != 1 or blocked.size != 1 \
            or float(allowed) != 0.0 or not _blocks(blocked):
        return None
    condition = node.inputs[0]
    if condition is mask:
        return True
    both = condition.producer()
    if both is None or both.op_type != "And" or mask not in both.inputs:
        return None
    other = [v for v in both.inputs if v is not mask]
    return other[0] if len(other) == 1 else None


def _blocks(bias: Any) -> bool:
    """Whether the additive bias `bias` (one value) blocks a key: -inf, or at most the lowest
    finite value of its dtype (what transformers fills a masked slot with, `torch.finfo(dtype).min`).

    # NOTE: a fixed floor (-1e30) held for float32 (-3.4e38) and bfloat16, not for float16, whose
    # lowest value is -65504: a `--dtype float16` graph's mask was not recognised and its attention
    # kept, so the export had no onnxruntime-genai package (issue 50, item 3).
    """
    try:
        lowest = float(np.finfo(bias.dtype).min)
    except (TypeError, ValueError):  # not a floating dtype numpy knows
        lowest = -1e30
    return float(bias) <= max(lowest, -1e30)


def _window_sizes(model: Any, layers: list[_Layer], positions: int) -> str | None:
    """Set each windowed layer's `local_window_size`, or return why a window is not GQA's.

    # NOTE: transformers 5.24 ands the causal mask with `kv_idx > q_idx - sliding_window`
    # (`masking_utils.sliding_window_overlay`), which hfexport's static-cache graph computes from the
    # 4-D mask itself (the query's position is its row's last attended slot). The and-ed boolean is
    # evaluated here in ONNX Runtime: on one query at position `positions - 1` attending every slot
    # before it, where it keeps the window's `W` keys, then on the causal mask of a 64-token
    # prompt, where every row must keep exactly the `W` keys up to its own. ONNX Runtime 1.32's
    # CPU GQA attends the last `local_window_size` keys up to the query's own, so it gets `W`
    # (measured: a Mistral with sliding_window=6 equals eager with 6, not 5; older ONNX Runtime
    # kernels attended `local_window_size + 1`); a window no shorter than `positions` is none (-1).
    """
    windowed = [layer for layer in layers if layer.window is not None]
    if not windowed:
        return None
    values = list(dict.fromkeys(layer.window for layer in windowed))
    last = _evaluate(model, values, {_MASK: np.ones((1, 1, 1, positions), dtype=bool)})
    square = min(positions, 64)
    causal = np.tril(np.ones((square, square), dtype=bool))
    prompt = _evaluate(model, values, {_MASK: causal[None, None]})
    if isinstance(last, str) or isinstance(prompt, str):
        return f"the sliding window: {last if isinstance(last, str) else prompt}"
    rows, keys = np.indices(causal.shape)
    sizes = {}
    for value, row, rows_kept in zip(values, last, prompt):
        size = int(np.broadcast_to(row.astype(bool), (1, 1, 1, positions)).sum())
        kept = np.broadcast_to(rows_kept.astype(bool), (1, 1, square, square))[0, 0] & causal
        if not np.array_equal(kept, causal & (keys > rows - size)):
            return "the boolean and-ed with the attention mask is not a sliding window over the keys"
        sizes[value] = size if size < positions else -1
    for layer in windowed:
        layer.local_window_size = sizes[layer.window]
    return None


def _cache_write(value: Any) -> Any:
    """The `ScatterElements` writing a graph input cache that `value` is the first slots of (through
    the slice to the attended slots and the repeat per query head), else None."""
    node = value.producer() if value is not None else None
    while node is not None and node.op_type in ("Reshape", "Expand", "Unsqueeze", "Slice"):
        if node.op_type == "Slice" and not _slices_from_start_on_axis_2(node):
            return None
        node = node.inputs[0].producer()
    if node is None or node.op_type != "ScatterElements" or node.attributes.get_int("axis", 0) != 2:
        return None
    data, out = node.inputs[0], node.outputs[0]
    return node if data.is_graph_input() and out.is_graph_output() else None


def _slices_from_start_on_axis_2(node: Any) -> bool:
    starts = _constant(node.inputs[1])
    axes = _constant(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    steps = _constant(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else np.ones(1)
    return (starts is not None and axes is not None and steps is not None and starts.tolist() == [0]
            and axes.tolist() in ([2], [-2]) and steps.tolist() == [1])


def _constant(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    node = value.producer()
    if node is not None and node.op_type == "Constant" and "value" in node.attributes:
        return node.attributes["value"].value.numpy()
    return None


# -- rotary -----------------------------------------------------------------------------------


def _match_rotary(layers: list[_Layer], max_positions: int | None) -> str | None:
    """Find each layer's rotation of q and k (`_Layer.rotary`); return why the rotary stays outside, or None."""
    if not max_positions:
        return "the model's config gives no max_position_embeddings for the rotary caches' rows"
    for layer in layers:
        query = layer.query_bhsd
        rq = _rotation(query) if query is not None else None
        rk = _rotation(layer.keys.inputs[2])
        if rq is None or rk is None:
            return ("q or k is not rotated by the standard half-split rotation x*cos + cat(-x2, x1)*sin "
                    "(a partial or interleaved rotary, or none)")
        if rq[1] is not rk[1] or rq[2] is not rk[2]:
            return "q and k are rotated with different cos/sin"
        if rq[0].shape[3] % 16:
            # ONNX Runtime 1.32's CPU kernel: "head_size shall be a multiple of 16" with do_rotary=1
            return f"ONNX Runtime's GroupQueryAttention rotates only head sizes that are multiples of 16, not {rq[0].shape[3]}"
        layer.rotary = (rq[0], rk[0], rq[1], rq[2])
    return None


def _through_bsd(value: Any) -> Any:
    """`x` [b, h, s, d] where `value` is `Reshape(Transpose(x, [0, 2, 1, 3]), [b, s, h*d])`, else None."""
    reshape = value.producer()
    if reshape is None or reshape.op_type != "Reshape":
        return None
    transpose = reshape.inputs[0].producer()
    if transpose is None or transpose.op_type != "Transpose" or _perm(transpose) != _BHSD:
        return None
    return transpose.inputs[0]


def _rotation(value: Any) -> tuple | None:
    """`(x, cos, sin)` where `value = x * cos + cat(-x[..., d/2:], x[..., :d/2]) * sin`, else None."""
    add = value.producer()
    if add is None or add.op_type != "Add":
        return None
    for straight, rotated in (add.inputs, reversed(add.inputs)):
        first, second = straight.producer(), rotated.producer()
        if first is None or second is None or first.op_type != "Mul" or second.op_type != "Mul":
            continue
        for x, cos in (first.inputs, reversed(first.inputs)):
            for half, sin in (second.inputs, reversed(second.inputs)):
                if _rotate_half_of(half) is x:
                    return x, cos, sin
    return None


def _rotate_half_of(value: Any) -> Any:
    """`x` where `value = Concat(Neg(x[..., d/2:]), x[..., :d/2], axis=-1)`, else None."""
    concat = value.producer()
    if concat is None or concat.op_type != "Concat" or len(concat.inputs) != 2:
        return None
    neg, first = concat.inputs[0].producer(), concat.inputs[1].producer()
    if neg is None or neg.op_type != "Neg" or first is None or first.op_type != "Slice":
        return None
    second = neg.inputs[0].producer()
    if second is None or second.op_type != "Slice" or second.inputs[0] is not first.inputs[0]:
        return None
    x = first.inputs[0]
    if x.shape is None or len(x.shape) != 4 or not isinstance(x.shape[3], int):
        return None
    if concat.attributes.get_int("axis", 0) not in (-1, 3):
        return None
    half = x.shape[3] // 2
    if not (_slice_is(first, 0, half) and _slice_is(second, half, None)):
        return None
    return x


def _slice_is(node: Any, start: int, end: int | None) -> bool:
    """Whether the Slice `node` takes `[start:end]` (end None: to the end) of the last axis, step 1."""
    values = [_constant(v) if v is not None else None for v in (list(node.inputs) + [None] * 5)[1:5]]
    starts, ends, axes, steps = values
    if starts is None or ends is None or axes is None or axes.tolist() not in ([-1], [3]):
        return False
    if steps is not None and steps.tolist() != [1]:
        return False
    stop = int(ends[0])
    return int(starts[0]) == start and (stop >= 2**31 if end is None else stop == end)


def _rotary_caches(model: Any, layers: list[_Layer], max_positions: int) -> dict | str:
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
    result = _evaluate(model, values, {"position_ids": np.arange(positions, dtype=np.int64)[None]})
    return [np.asarray(out, dtype=np.float32) for out in result] if not isinstance(result, str) else result


def _evaluate(model: Any, values: list[Any], feed: dict[str, np.ndarray]) -> list[np.ndarray] | str:
    """`values` of `model` computed in ONNX Runtime from `feed`, when the graph inputs they depend on
    are exactly `feed`'s; else why not."""
    import tempfile

    import onnx_ir as ir
    import onnxruntime as ort
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    names = [v.name for v in values]
    sub = model.clone()
    graph = sub.graph
    by_name = {v.name: v for node in graph for v in node.outputs}
    outputs = [by_name.get(name) for name in names]
    if any(v is None for v in outputs):
        return "they are not computed in the graph"
    graph.outputs.clear()
    graph.outputs.extend(outputs)
    RemoveUnusedNodesPass()(sub)
    used = {v.name for node in graph for v in node.inputs if v is not None}
    needed = [v for v in graph.inputs if v.name in used]
    if sorted(v.name for v in needed) != sorted(feed):
        return f"they depend on {[v.name for v in needed]}, not on {list(feed)} alone"
    graph.inputs.clear()
    graph.inputs.extend(needed)
    for name in [n for n in graph.initializers if n not in used]:
        graph.initializers.pop(name)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="hfexport-gqa-") as scratch:
        path = f"{scratch}/sub.onnx"
        ir.save(sub, path)
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        return [np.asarray(out) for out in session.run(names, feed)]


# -- the rewrite ------------------------------------------------------------------------------


def _lengths(graph: Any, old_mask: Any) -> tuple[Any, Any]:
    """A new 2-D int64 `attention_mask` input in the old one's place; return `(seqlens_k, total_sequence_length)`
    computed from it (int32, as GQA takes them)."""
    import onnx_ir as ir

    batch = old_mask.shape[0]
    mask = ir.Value(name=_MASK, shape=ir.Shape([batch, "attended"]), type=ir.TensorType(ir.DataType.INT64))
    old_mask.name = f"{_MASK}__4d"
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


def _rewrite(graph: Any, layer: _Layer, seqlens: Any, total: Any, caches: dict) -> int:
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
    if transpose is not None and transpose.op_type == "Transpose" and _perm(transpose) == _BHSD:
        source = transpose.inputs[0]
    else:
        node = ir.node("Transpose", [value], {"perm": _BHSD})
        nodes.append(node)
        source = node.outputs[0]
    shape = ir.node("Constant", [], {"value": ir.tensor(np.array([0, 0, -1], dtype=np.int64))})
    reshape = ir.node("Reshape", [source, shape.outputs[0]])
    nodes.extend([shape, reshape])
    return reshape.outputs[0]


def _projection(value: Any) -> tuple | None:
    """`(input, weight array, bias array or None)` where `value` [b, h, s, d] is
    `Transpose(Reshape(MatMul(input, W) [+ b]), [0, 2, 1, 3])` with constant `W` (and `b`)."""
    transpose = value.producer()
    if transpose is None or transpose.op_type != "Transpose" or _perm(transpose) != _BHSD:
        return None
    reshape = transpose.inputs[0].producer()
    if reshape is None or reshape.op_type != "Reshape":
        return None
    node, bias = reshape.inputs[0].producer(), None
    if node is not None and node.op_type == "Add":
        for matmul, constant in (node.inputs, reversed(node.inputs)):
            if matmul.producer() is not None and matmul.producer().op_type == "MatMul" and _constant(constant) is not None:
                node, bias = matmul.producer(), _constant(constant)
                break
        else:
            return None
    if node is None or node.op_type != "MatMul":
        return None
    weight = _constant(node.inputs[1])
    if weight is None or weight.ndim != 2 or (bias is not None and bias.shape != (weight.shape[1],)):
        return None
    return node.inputs[0], weight, bias


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
    weight = _initializer(graph, None, np.concatenate([f[1] for f in found], axis=1))
    matmul = ir.node("MatMul", [source, weight])
    nodes.append(matmul)
    out = matmul.outputs[0]
    if found[0][2] is not None:
        bias = _initializer(graph, None, np.concatenate([f[2] for f in found]))
        add = ir.node("Add", [out, bias])
        nodes.append(add)
        out = add.outputs[0]
    return out


def _initializer(graph: Any, name: str | None, array: np.ndarray) -> Any:
    import onnx_ir as ir

    if name is None:
        index = sum(1 for n in graph.initializers if n.startswith("gqa_packed_"))
        name = f"gqa_packed_{index}"
    if name in graph.initializers:
        return graph.initializers[name]
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     const_value=ir.tensor(array, name=name))
    graph.register_initializer(value)
    return value


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
    used = {id(v) for node in graph for v in node.inputs if v is not None} | {id(v) for v in graph.outputs}
    dropped = [v for v in graph.inputs if id(v) not in used]
    names = {v.name for v in dropped}
    counter_inputs = {"input." + v.name[len("output."):] for v in counters}
    if any(v is not None and v.name == f"{_MASK}__4d" for node in graph for v in node.inputs):
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


def _perm(node: Any) -> list[int] | None:
    attribute = node.attributes.get("perm")
    return list(attribute.value) if attribute is not None else None
