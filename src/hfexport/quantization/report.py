"""What a quantizer did to an artifact, counted in the artifact itself (a
"quantized" model whose layers were silently skipped must show it)."""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["quantization_summary"]

_LOW_PRECISION = {"u8", "i8", "u4", "i4", "nf4", "f4e2m1"}


def quantization_summary(export_format: str, artifact: Any) -> dict[str, Any]:
    """`{"quantized_matmuls": n, "float_matmuls": m, ...}` for the formats that can be inspected."""
    try:
        if export_format == "onnx":
            return _onnx(artifact.model.graph)
        if export_format == "openvino":
            return _openvino(artifact)
        if export_format == "dynamo":
            return _fx(artifact.graph)
        if export_format == "executorch":
            return _executorch(artifact.exported_program())
    except Exception as error:  # noqa: BLE001 - a report must not fail the export
        return {"summary_error": str(error)[:200]}
    return {}


def _onnx(graph: Any) -> dict[str, Any]:
    """Counted on the ONNX IR graph (`model_proto` would serialize every weight to count nodes)."""
    nodes = list(graph)
    ops = Counter(node.op_type for node in nodes)
    quantized = ops["MatMulInteger"] + ops["MatMulNBits"] + ops["QLinearMatMul"]
    # QDQ format: a MatMul fed by DequantizeLinear weights is an int8 MatMul at run time
    dequantized = {out for node in nodes if node.op_type == "DequantizeLinear" for out in node.outputs}
    qdq = sum(1 for node in nodes if node.op_type in ("MatMul", "Gemm") and dequantized.intersection(node.inputs))
    return {"quantized_matmuls": quantized + qdq, "float_matmuls": ops["MatMul"] + ops["Gemm"] - qdq,
            "quantize_ops": ops["QuantizeLinear"] + ops["DynamicQuantizeLinear"],
            "dequantize_ops": ops["DequantizeLinear"]}


def _openvino(model: Any) -> dict[str, Any]:
    types = Counter(op.get_type_name() for op in model.get_ops())
    low = sum(1 for op in model.get_ops() if op.get_type_name() == "Constant"
              and op.get_output_element_type(0).get_type_name() in _LOW_PRECISION)
    return {"fake_quantize_ops": types["FakeQuantize"], "low_precision_constants": low,
            "matmuls": types["MatMul"]}


def _from_low_precision(node: Any, depth: int = 5) -> bool:
    """Whether `node` is computed from an int8/uint8/int4 tensor within a few ops (a dequantize,
    or NNCF's decompression `(w - zero_point) * scale`)."""
    import torch

    if node is None or depth < 0 or not hasattr(node, "op"):
        return False
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor) and value.dtype in (torch.int8, torch.uint8) + tuple(
            getattr(torch, name) for name in ("int4", "uint4") if hasattr(torch, name)):
        return True
    if node.op == "call_function" and "dequantize" in str(node.target):
        return True
    return any(_from_low_precision(arg, depth - 1) for arg in node.args if hasattr(arg, "op"))


def _executorch(program: Any) -> dict[str, Any]:
    """`_fx` over the program's graph and the graphs its delegates took (XNNPACK runs those)."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    outside = _fx(program.graph)
    inside = [_fx(module.original_module.graph) for module in program.graph_module.children()
              if isinstance(module, LoweredBackendModule)]
    return {"quantized_matmuls": outside["quantized_matmuls"] + sum(c["quantized_matmuls"] for c in inside),
            "float_matmuls": outside["float_matmuls"] + sum(c["float_matmuls"] for c in inside),
            "delegated_quantized_matmuls": sum(c["quantized_matmuls"] for c in inside)}


def _fx(graph: Any) -> dict[str, Any]:
    quantized = floating = 0
    for node in graph.nodes:
        name = str(node.target)
        if node.op != "call_function" or not any(k in name for k in ("linear", "mm.default", "convolution")):
            continue
        weight = node.args[1] if len(node.args) > 1 else None
        if _from_low_precision(weight):
            quantized += 1
        else:
            floating += 1
    delegated = sum(1 for node in graph.nodes if "executorch_call_delegate" in str(node.target))
    out = {"quantized_matmuls": quantized, "float_matmuls": floating}
    if delegated:
        out["note"] = "matmuls inside XNNPACK delegates are counted by the delegate, not here"
    return out
