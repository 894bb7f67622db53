"""Which attentions of a converted graph the `GroupQueryAttention` rewrite (`gqa.py`) takes, and what
it reads from each (`GqaLayer`): the rules, read-only on the graph. `attentions` finds the candidates;
`match_attention` (a `MultiHeadAttention`) and `match_softcapped` (a softmax of softcapped scores)
match one layer or say why not; `window_sizes` and `match_rotary` complete the matched layers with
their sliding window and rotary. What the rules look for, and why: `gqa.py`'s docstring.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .ir_values import constant_array, transpose_perm
from .softcap import softcapped_scores

__all__ = ["MASK", "BHSD", "GqaLayer", "attentions", "match_attention", "match_softcapped", "window_sizes",
           "match_rotary", "evaluate"]

#: The graph input the rewrite is anchored on: the 4-D boolean causal mask of a static cache.
MASK = "attention_mask"
#: The Transpose between [batch, heads, sequence, head_size] and [batch, sequence, heads, head_size].
BHSD = [0, 2, 1, 3]
_MHA_ATTRIBUTES = {"num_heads", "scale", "mask_filter_value", "unidirectional"}


@dataclasses.dataclass
class GqaLayer:
    """One attention the rewrite takes: the nodes and values it reads, and the attributes its
    `GroupQueryAttention` gets (set while matching: `match_rotary`, `window_sizes`)."""

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


def attentions(graph: Any, mask: Any) -> list[Any]:
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


def match_attention(node: Any, mask: Any) -> GqaLayer | str:
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
    return GqaLayer(node, query, _through_bsd(query), node.outputs[0], keys, values, heads, kv_heads,
                  scale.value if scale is not None else None, window=matched if matched is not True else None)


def match_softcapped(softmax: Any, mask: Any) -> GqaLayer | str:
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
    if transpose is None or transpose.op_type != "Transpose" or transpose_perm(transpose) != BHSD:
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
    return GqaLayer(transpose, None, capped.query, transpose.outputs[0], keys, values, heads, kv_heads, capped.scale,
                  softcap=capped.softcap, split_output=True, window=window if window is not True else None)


def _mask_bias(value: Any, mask: Any) -> Any:
    """`True` where `value` is `Expand(Where(mask, 0, very negative))`, the boolean mask as an additive
    bias; `w` where it is `Expand(Where(And(mask, w), 0, very negative))` (a sliding window, checked
    in `window_sizes`); else None."""
    node = value.producer()
    while node is not None and node.op_type == "Expand":
        node = node.inputs[0].producer()
    if node is None or node.op_type != "Where":
        return None
    allowed, blocked = (constant_array(v) for v in node.inputs[1:3])
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


def window_sizes(model: Any, layers: list[GqaLayer], positions: int) -> str | None:
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
    mask = next(v for v in model.graph.inputs if v.name == MASK)
    query = mask.shape[2] if mask.shape is not None and isinstance(mask.shape[2], int) else None
    square = min(positions, 64)
    if query is not None:  # a graph of one query length (a decode's 1): the prompt's rows `query` at a time
        square = max(query, square // query * query)
    causal = np.tril(np.ones((square, square), dtype=bool))
    rows_at_once = query or square
    results = evaluate(model, values, {MASK: np.ones((1, 1, query or 1, positions), dtype=bool)},
                       *({MASK: causal[None, None, start:start + rows_at_once]} for start in range(0, square, rows_at_once)))
    if isinstance(results, str):
        return f"the sliding window: {results}"
    last = [value.reshape(-1, value.shape[-1])[-1] for value in results[0]]  # each row attends every slot
    prompt = [np.concatenate([np.broadcast_to(block[i], (1, 1, rows_at_once, square)) for block in results[1:]], axis=2)
              for i in range(len(values))]
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
    starts = constant_array(node.inputs[1])
    axes = constant_array(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    steps = constant_array(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else np.ones(1)
    return (starts is not None and axes is not None and steps is not None and starts.tolist() == [0]
            and axes.tolist() in ([2], [-2]) and steps.tolist() == [1])


# -- rotary -----------------------------------------------------------------------------------


def match_rotary(layers: list[GqaLayer], max_positions: int | None) -> str | None:
    """Find each layer's rotation of q and k (`GqaLayer.rotary`); return why the rotary stays outside, or None."""
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
    if transpose is None or transpose.op_type != "Transpose" or transpose_perm(transpose) != BHSD:
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
    values = [constant_array(v) if v is not None else None for v in (list(node.inputs) + [None] * 5)[1:5]]
    starts, ends, axes, steps = values
    if starts is None or ends is None or axes is None or axes.tolist() not in ([-1], [3]):
        return False
    if steps is not None and steps.tolist() != [1]:
        return False
    stop = int(ends[0])
    return int(starts[0]) == start and (stop >= 2**31 if end is None else stop == end)


def evaluate(model: Any, values: list[Any], feed: dict[str, np.ndarray],
             *more: dict[str, np.ndarray]) -> list[Any] | str:
    """`values` of `model` computed in ONNX Runtime from `feed`, when the graph inputs they depend on
    are exactly `feed`'s; else why not. With `more` feeds (the same inputs), one session runs each
    and the list holds each feed's values."""
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
        try:
            results = [[np.asarray(out) for out in session.run(names, each)] for each in (feed, *more)]
        except Exception as error:  # noqa: BLE001 - a feed the graph's fixed shapes refuse: why, not a crash
            return f"ONNX Runtime could not compute them: {str(error).splitlines()[0][:200]}"
    return results if more else results[0]
