"""Attention scores softcapped as `cap * tanh(scale * q k^T / cap)` (Gemma-2's `attn_logit_softcapping`)
in an optimized ONNX graph: matched from the scores back to the `q k^T` product, then measured in ONNX
Runtime, which gives `GroupQueryAttention`'s `scale` and `softcap` (`gqa.py`).

# NOTE: the chain between the product and the mask's bias is whatever scalar arithmetic the model
# and onnxscript left (Gemma-2 in transformers 5.24 after onnxscript 0.7.2: `Mul(scaling)`,
# `Div(cap)`, `Tanh`, `Mul(cap)`; a fusion may fold the scale into `FusedMatMul`'s `alpha`). Its
# Mul/Div factors before the tanh and after it give `scale` and `cap` exactly (a slope measured
# at 0 in float32 was off in the 8th digit), and the chain, copied into a model of its own, must
# then equal `cap * tanh(scale * x / cap)` in ONNX Runtime over `|scale * x / cap| <= 6` and at
# +-1e20, else the graph is not softcapped the way GroupQueryAttention softcaps and keeps its attention.
# ONNX Runtime 1.32's CPU GroupQueryAttention applies `scale` before the cap (measured: a
# GroupQueryAttention with scale 0.7 and softcap 2 equals `2 * tanh(0.7 x / 2)` within 2.4e-7,
# `0.7 * 2 * tanh(x / 2)` differs by 0.34).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["SoftcappedScores", "softcapped_scores"]

#: The elementwise ops the chain from the product to the capped scores may hold (each Mul/Div by a scalar).
_CHAIN_OPS = ("Mul", "Div", "Tanh")
_FUSED_MATMUL_FLAGS = ("transA", "transBatchA", "transBatchB")


@dataclasses.dataclass
class SoftcappedScores:
    """The softcapped scores `cap * tanh(scale * query @ key^T / cap)` of one attention."""

    product: Any  # the MatMul or FusedMatMul node computing query @ key^T
    query: Any  # [b, h, s, d]
    key: Any  # [b, h, t, d]: the product's right input before its transposition
    scale: float
    softcap: float


def softcapped_scores(value: Any) -> SoftcappedScores | str:
    """The softcapped scores `value` is (see the module docstring), or why it is not."""
    steps: list[tuple[str, np.ndarray | None, bool]] = []  # (op, scalar, scalar is the first operand), last first
    node = value.producer()
    while node is not None and node.op_type in _CHAIN_OPS and node.domain == "":
        if node.op_type == "Tanh":
            steps.append(("Tanh", None, False))
            node = node.inputs[0].producer()
            continue
        first, second = node.inputs
        scalar = _scalar(second)
        first_is_scalar = scalar is None
        scalar = _scalar(first) if first_is_scalar else scalar
        if scalar is None:
            return f"a {node.op_type} in the scores takes no float32 scalar constant"
        steps.append((node.op_type, scalar, first_is_scalar))
        node = (second if first_is_scalar else first).producer()
    if sum(op == "Tanh" for op, _, _ in steps) != 1:
        return "the scores before the mask hold no tanh (or several): not a softcap"
    product = _product(node)
    if isinstance(product, str):
        return product
    query, key, alpha = product
    if alpha != 1.0:
        steps.append(("Mul", np.array(alpha, dtype=np.float32), False))
    measured = _measure(list(reversed(steps)))
    if isinstance(measured, str):
        return measured
    return SoftcappedScores(node, query, key, *measured)


def _product(node: Any) -> tuple[Any, Any, float] | str:
    """`(query, key, alpha)` where `node` computes `alpha * query @ key^T`, else why not."""
    if node is not None and node.op_type == "FusedMatMul" and node.domain == "com.microsoft":
        flags = [node.attributes.get_int(flag, 0) for flag in _FUSED_MATMUL_FLAGS]
        if any(flags) or not node.attributes.get_int("transB", 0):
            return f"the scores' FusedMatMul transposes more than its key (transA, transBatchA, transBatchB: {flags})"
        return node.inputs[0], node.inputs[1], node.attributes.get_float("alpha", 1.0)
    if node is not None and node.op_type == "MatMul" and node.domain == "":
        transpose = node.inputs[1].producer()
        perm = transpose.attributes.get("perm") if transpose is not None and transpose.op_type == "Transpose" else None
        if perm is None or list(perm.value) != [0, 1, 3, 2]:
            return "the scores' MatMul does not take the key transposed ([0, 1, 3, 2])"
        return node.inputs[0], transpose.inputs[0], 1.0
    return "the scores are not the product of the query and the key through scalar arithmetic"


def _measure(steps: list[tuple[str, np.ndarray | None, bool]]) -> tuple[float, float] | str:
    """`(scale, cap)` where the chain `steps` (first applied first) is `cap * tanh(scale * x / cap)`:
    its factors before and after the tanh, checked by running it in ONNX Runtime; else why not."""
    inner, outer, seen_tanh = 1.0, 1.0, False
    for op, scalar, first_is_scalar in steps:
        if op == "Tanh":
            seen_tanh = True
            continue
        if op == "Div" and first_is_scalar:
            return "a constant divided by the scores: not a softcap"
        factor = float(scalar) if op == "Mul" else 1.0 / float(scalar)
        inner, outer = (inner, outer * factor) if seen_tanh else (inner * factor, outer)
    cap, scale = outer, inner * outer
    if not (np.isfinite(cap) and np.isfinite(scale) and cap > 0 and scale > 0):
        return f"the scores are {outer} * tanh({inner} * x): not a softcap (both factors must be positive)"
    grid = np.concatenate([np.linspace(-6, 6, 121) * cap / scale, [-1e20, 1e20]]).astype(np.float32)
    got, want = _run(steps, grid), cap * np.tanh(scale * grid.astype(np.float64) / cap)
    if not np.allclose(got, want, rtol=1e-5, atol=1e-6 * cap):
        return (f"the scores are not cap * tanh(scale * x / cap) with cap {cap} and scale {scale} in ONNX Runtime "
                f"(off by {float(np.abs(got - want).max()):.3g})")
    return scale, cap


def _run(steps: list[tuple[str, np.ndarray | None, bool]], x: np.ndarray) -> np.ndarray:
    """The elementwise chain `steps` applied to the 1-D float32 `x` in ONNX Runtime."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nodes, initializers, current = [], [], "x"
    for index, (op, scalar, first_is_scalar) in enumerate(steps):
        out = f"y{index}"
        if scalar is None:
            nodes.append(helper.make_node(op, [current], [out]))
        else:
            name = f"c{index}"
            initializers.append(numpy_helper.from_array(np.asarray(scalar).reshape(()), name))
            nodes.append(helper.make_node(op, [name, current] if first_is_scalar else [current, name], [out]))
        current = out
    graph = helper.make_graph(nodes, "softcap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT, [None])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 10)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run([current], {"x": x})[0], dtype=np.float64)


def _scalar(value: Any) -> np.ndarray | None:
    """The float32 scalar constant `value` holds (an initializer or a Constant node), else None."""
    if value is None:
        return None
    array = value.const_value.numpy() if value.const_value is not None else None
    node = value.producer()
    if array is None and node is not None and node.op_type == "Constant" and "value" in node.attributes:
        array = node.attributes["value"].value.numpy()
    return array if array is not None and array.size == 1 and array.dtype == np.float32 else None
