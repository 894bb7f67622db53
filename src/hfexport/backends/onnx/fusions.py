"""ONNX Runtime's fused kernels on the converted graph: onnxscript's `optimize_for_ort`, with what
fused counted in the graph and, for the fusions a decoder would want that did not happen, why.

# NOTE: onnxscript (0.7.2, `onnxscript.rewriter.ort_fusions._core.optimize_for_ort`) rewrites
# RMSNorm into `SimplifiedLayerNormalization`, residual + RMSNorm into
# `SkipSimplifiedLayerNormalization`, and SDPA into `MultiHeadAttention` (`com.microsoft` ops, so
# the model then runs in ONNX Runtime only). Its own fusion counts name intermediate steps (a
# rotary match that a later step did not take is inlined back), so the record counts the fused
# ops in the final graph instead.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np

from .gqa import fuse_static_gqa

__all__ = ["fuse_for_ort"]

#: The fused ops (ONNX Runtime contrib ops) whose count the record gives.
FUSED_OPS = ("GroupQueryAttention", "MultiHeadAttention", "Attention", "RotaryEmbedding",
             "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "SkipLayerNormalization",
             "LayerNormalization", "FastGelu", "BiasGelu", "Gelu", "FusedMatMul")


#: why a static cache's attention stayed MultiHeadAttention when GroupQueryAttention was not asked for
_GQA_NOT_ASKED = ("not asked: OnnxConfig(group_query_attention=False), or None through export()/export_for_generation, "
                  "whose decode keeps the seed's interface (an export folder turns it on)")


def fuse_for_ort(model: Any, max_positions: int | None = None, *,
                 group_query_attention: bool = True, load_check: bool = True) -> tuple[Any, dict[str, Any]]:
    """`optimize_for_ort` on a copy of the ONNX IR `model`, then a static cache's attention as
    `GroupQueryAttention` (`gqa.py`); return the model to keep and the record's entry
    `{"fused": {op type: count}, "not_fused": {fusion: reason}, "group_query_attention": ...}`.

    Args:
        max_positions: rows of GroupQueryAttention's rotary caches, the positions it can rotate
            (`None`: the rotary stays outside it).
        group_query_attention: rewrite a static cache's attention (`OnnxConfig.group_query_attention`).

    When ONNX Runtime refuses to load the fused graph, the unfused `model` is kept and the entry
    says so (`{"fused": {}, "refused": error}`): the export is what it would be with
    `OnnxConfig(ort_fusions=False)`, and the record shows why. Without `load_check` the fused graph
    is kept unloaded: the caller loads what it makes of it (`load_error`; the layer stamp's graph).
    A QDQ graph is left as it is (`{"fused": {}, "skipped": why}`).

    """
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    if any(node.op_type == "DequantizeLinear" for node in model.graph):
        # NOTE: a QDQ graph (a PT2E-quantized program): ONNX Runtime's QDQ transformer turns each
        # DequantizeLinear -> MatMul into an int8 kernel, and optimize_for_ort (0.7.2) would fold
        # the weight's transpose into a FusedMatMul, which that transformer does not take
        return model, {"fused": {}, "skipped": "a QDQ graph (quantized on the torch.export graph): its "
                       "DequantizeLinear -> MatMul pairs are left for ONNX Runtime's QDQ transformer"}
    fused_model = model.clone()  # new graph, nodes and values; the weights' tensors shared, not copied
    _, steps = optimize_for_ort(fused_model)
    flattened = fix_mha_flattened_output(fused_model)
    kv_4d = fix_mha_transposed_kv(fused_model)
    with_gqa, gqa = (fuse_static_gqa(fused_model, max_positions) if group_query_attention else
                     (fused_model, {"kept": _GQA_NOT_ASKED}))
    refused = load_error(with_gqa) if load_check else None
    if refused and with_gqa is not fused_model:  # keep the other fusions, with MultiHeadAttention
        gqa = {"kept": f"ONNX Runtime refused the GroupQueryAttention graph: {refused}"}
        refused = load_error(fused_model)
    else:
        fused_model = with_gqa
    if refused:
        return model, {"fused": {}, "refused": f"ONNX Runtime refused the fused graph, kept unfused: {refused}"}
    # NOTE: ONNX Runtime registers SimplifiedLayerNormalization in the default domain, not com.microsoft.
    ops = Counter(node.op_type for node in fused_model.graph if node.domain in ("", "com.microsoft"))
    fused = {op: ops[op] for op in FUSED_OPS if ops[op]}
    entry = {"fused": fused, "not_fused": _not_fused(fused_model, steps, fused, gqa), "group_query_attention": gqa}
    if flattened:
        entry["mha_output_flattened"] = flattened
    if kv_4d and "MultiHeadAttention" in fused:
        entry["mha_cache_layout"] = f"{kv_4d} attentions read the cache as it is (4-D key/value)"
    return fused_model, entry


def fix_mha_flattened_output(model: Any) -> int:
    """Flatten `MultiHeadAttention`'s output again where a `Gemm` reads it; return how many were.

    # NOTE: onnxscript's SDPA -> MHA fusion (0.7.2) replaces the attention's Transpose + Reshape
    # with MHA's `[batch, length, hidden]` output, also where the model reshaped to
    # `[batch * length, hidden]` for a 2-D matmul: GPT-2's `Conv1D` (`x.view(-1, x.size(-1))`,
    # `addmm`, exported as `Gemm`). ONNX Runtime then refuses the graph ("Gemm: Input 0 expected to
    # have rank 2 but has rank 3"). A Reshape to `[-1, hidden]` is the flattening the fusion dropped.
    """
    import onnx_ir as ir

    count = 0
    for node in [n for n in model.graph if n.op_type == "Gemm" and n.domain == ""]:
        source = node.inputs[0]
        producer = source.producer() if source is not None else None
        if producer is None or producer.op_type != "MultiHeadAttention" or producer.domain != "com.microsoft":
            continue
        weight = node.inputs[1].shape
        trans_b = node.attributes.get("transB")
        if weight is None or len(weight) != 2 or not isinstance(weight[1 if trans_b and trans_b.value else 0], int):
            continue
        hidden = weight[1 if trans_b and trans_b.value else 0]
        shape = ir.Value(name=f"{source.name}_flat_shape", const_value=ir.tensor(np.array([-1, hidden], np.int64)))
        model.graph.register_initializer(shape)
        flat = ir.node("Reshape", [source, shape], name=f"{node.name}_flatten")
        flat.outputs[0].name, flat.outputs[0].dtype = f"{source.name}_flat", source.dtype
        flat.outputs[0].shape = source.shape
        source.shape = None  # MHA's output is 3-D, not the 2-D shape the dropped Reshape's value had
        model.graph.insert_before(node, flat)
        node.replace_input_with(0, flat.outputs[0])
        count += 1
    return count


def fix_mha_transposed_kv(model: Any) -> int:
    """Feed `MultiHeadAttention` its key and value as `[batch, heads, length, head_size]` where the
    fusion transposed them to `[batch, length, hidden]`; return how many were rewritten.

    # NOTE: onnxscript's SDPA -> MHA fusion (0.7.2) always gives MHA 3-D key/value, so a cache
    # `[b, n, max_cache_len, h]` is transposed and reshaped in full before each attention: on the
    # 134 MB Llama at static cache 2048 that Transpose took a third of the decode step (ORT profiler).
    # ORT's MHA also takes 4-D BNSH key/value (its `past` layout), which is the cache as it is.
    """
    count = 0
    for node in [n for n in model.graph if n.op_type == "MultiHeadAttention" and n.domain == "com.microsoft"]:
        heads = node.attributes.get("num_heads")
        if len(node.inputs) < 3 or heads is None:
            continue
        sources = [_bnsh_source(node.inputs[i], heads.value) for i in (1, 2)]
        if any(source is None for source in sources):
            continue
        for index, source in zip((1, 2), sources):
            node.replace_input_with(index, source)
        count += 1
    if count:
        from onnx_ir.passes.common import RemoveUnusedNodesPass

        RemoveUnusedNodesPass()(model)
    return count


def _bnsh_source(value: Any, heads: int) -> Any:
    """The 4-D `[b, heads, s, h]` tensor that `value` is `Reshape(Transpose(x, [0, 2, 1, 3]), [b, s, heads*h])` of."""
    reshape = value.producer() if value is not None else None
    if reshape is None or reshape.op_type != "Reshape":
        return None
    transpose = reshape.inputs[0].producer()
    perm = transpose.attributes.get("perm") if transpose is not None and transpose.op_type == "Transpose" else None
    if perm is None or list(perm.value) != [0, 2, 1, 3]:
        return None
    source = transpose.inputs[0]
    shape = source.shape
    if shape is None or len(shape) != 4 or shape[1] != heads or not isinstance(shape[3], int):
        return None
    return source


def load_error(model: Any) -> str | None:
    """Why ONNX Runtime cannot open `model` as `OnnxRunner` does (its own graph optimizations on),
    the first line of its error, or None when it can. The model is opened from a scratch file
    (`scratch.scratch_model`: weights mapped, not copied, and written once for the export: validation
    and the folder take the same file)."""
    import onnxruntime as ort

    from .artifact import scratch_session_options
    from .scratch import scratch_model

    with scratch_model(model) as path:
        try:
            ort.InferenceSession(path, scratch_session_options(), providers=["CPUExecutionProvider"])
        except Exception as error:  # noqa: BLE001 - recorded in the export record, the unfused graph kept
            return str(error).splitlines()[0][:300]
    return None


def _not_fused(model: Any, steps: dict[str, int], fused: dict[str, int], gqa: dict[str, Any]) -> dict[str, str]:
    """Why the fusions a decoder's graph would take did not apply (only those whose pattern is there)."""
    reasons = {}
    if steps.get("rotary_embedding") and "RotaryEmbedding" not in fused:
        reasons["RotaryEmbedding"] = (
            "the rotary pattern matched, but onnxscript's cos/sin cache fusion (CosSinCacheFusion, 0.7.2) "
            "expects the angles as MatMul(inv_freq, position_ids) + Transpose; torch.export lowers that "
            "product (inner size 1) to a broadcast Mul, so the rotation stays as Mul/Slice/Neg/Concat")
    has_scatter = any(node.op_type in ("ScatterND", "ScatterElements") for node in model.graph)
    if "GroupQueryAttention" in fused:
        # the rotation went into GroupQueryAttention, or stayed outside with the reason its entry gives
        reasons.pop("RotaryEmbedding", None)
    elif steps.get("sdpa") and has_scatter:
        reasons["GroupQueryAttention"] = (
            "onnxscript's GQA fusion matches a growing cache (Concat(past, new) fed to attention), not this "
            "graph's static cache written in place by a scatter (ScatterElements, see cache_writes.py); "
            f"hfexport's own rewrite (gqa.py) kept the graph: {gqa.get('kept')}")
    return reasons
