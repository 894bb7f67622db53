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

from collections import Counter
from typing import Any

__all__ = ["fuse_for_ort"]

#: The fused ops (ONNX Runtime contrib ops) whose count the record gives.
FUSED_OPS = ("GroupQueryAttention", "MultiHeadAttention", "Attention", "RotaryEmbedding",
             "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "SkipLayerNormalization",
             "LayerNormalization", "FastGelu", "BiasGelu", "Gelu", "FusedMatMul")


def fuse_for_ort(model: Any) -> tuple[Any, dict[str, Any]]:
    """`optimize_for_ort` on a copy of the ONNX IR `model`; return the model to keep and the
    record's entry `{"fused": {op type: count}, "not_fused": {fusion: reason}}`.

    When ONNX Runtime refuses to load the fused graph, the unfused `model` is kept and the entry
    says so (`{"fused": {}, "refused": error}`): the export is what it would be with
    `OnnxConfig(ort_fusions=False)`, and the record shows why.

    # NOTE: seen with onnxscript 0.7.2 / onnxruntime 1.32 on GPT-2 traced with static shapes: the
    # fused graph feeds a rank-3 tensor to a `Gemm` ("Input 0 expected to have rank 2"); the
    # unfused one runs.
    """
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    fused_model = ir.from_proto(ir.to_proto(model))
    _, steps = optimize_for_ort(fused_model)
    refused = _load_error(fused_model)
    if refused:
        return model, {"fused": {}, "refused": f"ONNX Runtime refused the fused graph, kept unfused: {refused}"}
    # NOTE: ONNX Runtime registers SimplifiedLayerNormalization in the default domain, not com.microsoft.
    ops = Counter(node.op_type for node in fused_model.graph if node.domain in ("", "com.microsoft"))
    fused = {op: ops[op] for op in FUSED_OPS if ops[op]}
    return fused_model, {"fused": fused, "not_fused": _not_fused(fused_model, steps, fused)}


def _load_error(model: Any) -> str | None:
    """Why ONNX Runtime cannot open `model` as `OnnxRunner` does (its own graph optimizations on),
    the first line of its error, or None when it can."""
    import onnx_ir as ir
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        ort.InferenceSession(ir.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - recorded in the export record, the unfused graph kept
        return str(error).splitlines()[0][:300]
    return None


def _not_fused(model: Any, steps: dict[str, int], fused: dict[str, int]) -> dict[str, str]:
    """Why the fusions a decoder's graph would take did not apply (only those whose pattern is there)."""
    reasons = {}
    if steps.get("rotary_embedding") and "RotaryEmbedding" not in fused:
        reasons["RotaryEmbedding"] = (
            "the rotary pattern matched, but onnxscript's cos/sin cache fusion (CosSinCacheFusion, 0.7.2) "
            "expects the angles as MatMul(inv_freq, position_ids) + Transpose; torch.export lowers that "
            "product (inner size 1) to a broadcast Mul, so the rotation stays as Mul/Slice/Neg/Concat")
    has_scatter = any(node.op_type in ("ScatterND", "ScatterElements") for node in model.graph)
    if steps.get("sdpa") and "GroupQueryAttention" not in fused and has_scatter:
        reasons["GroupQueryAttention"] = (
            "onnxscript's GQA fusion matches a growing cache (Concat(past, new) fed to attention); this "
            "graph's static cache is written in place by a scatter (ScatterElements, see cache_writes.py) and "
            "attention reads the whole buffer "
            "under the boolean mask, so SDPA became MultiHeadAttention with the mask as bias")
    return reasons
