"""`softcapped_scores`: the scalar chain between an attention's `q k^T` and its mask bias read as
GroupQueryAttention's `scale` and `softcap`, and checked in ONNX Runtime. No export: small hand-built
graphs (the Gemma-2 export is in test_genai.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
ir = pytest.importorskip("onnx_ir")
pytest.importorskip("onnxruntime")

from hfexport.backends.onnx.softcap import softcapped_scores  # noqa: E402


def _scores(chain: list[tuple[str, float | None, bool]], fused_alpha: float | None = None):
    """The last value of `product -> chain` in an IR graph: the product is `FusedMatMul(q, k, transB=1,
    alpha)` where `fused_alpha` is given, else `MatMul(q, Transpose(k, [0, 1, 3, 2]))`; each chain step
    is `(op, scalar or None, scalar is the first operand)`."""
    from onnx import TensorProto, helper, numpy_helper

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 3, 4]) for n in ("q", "k")]
    if fused_alpha is None:
        nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), helper.make_node("MatMul", ["q", "kt"], ["s"])]
    else:
        nodes = [helper.make_node("FusedMatMul", ["q", "k"], ["s"], domain="com.microsoft", transB=1, alpha=fused_alpha)]
    initializers, current = [], "s"
    for index, (op, scalar, first) in enumerate(chain):
        out = f"y{index}"
        if scalar is None:
            operands = [current] if op == "Tanh" else [current, "q_scores"]
        else:
            initializers.append(numpy_helper.from_array(np.array(scalar, dtype=np.float32), f"c{index}"))
            operands = [f"c{index}", current] if first else [current, f"c{index}"]
        nodes.append(helper.make_node(op, operands, [out]))
        current = out
    nodes.insert(0, helper.make_node("MatMul", ["q", "q"], ["q_scores"]))  # a non-constant operand, where asked
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(current, TensorProto.FLOAT, None)],
                              initializers)
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                                  helper.make_opsetid("com.microsoft", 1)]))
    return model.graph.outputs[0]


def test_gemma2s_softcap_gives_its_scale_and_cap():
    """transformers 5.24's Gemma-2 after onnxscript 0.7.2: `Mul(scaling)`, `Div(cap)`, `Tanh`, `Mul(cap)`."""
    capped = softcapped_scores(_scores([("Mul", 0.0625, False), ("Div", 3.0, False), ("Tanh", None, False),
                                        ("Mul", 3.0, True)]))
    assert not isinstance(capped, str), capped
    assert (capped.scale, capped.softcap) == (0.0625, 3.0)
    assert capped.query.name == "q" and capped.key.name == "k"


def test_a_scale_folded_into_fusedmatmul_counts():
    capped = softcapped_scores(_scores([("Div", 2.0, False), ("Tanh", None, False), ("Mul", 2.0, False)],
                                       fused_alpha=0.5))
    assert not isinstance(capped, str), capped
    assert (capped.scale, capped.softcap) == pytest.approx((0.5, 2.0))  # 2 * tanh(0.5 * x / 2)


@pytest.mark.parametrize("chain, why", [
    ([("Mul", 0.25, False)], "no tanh"),
    ([("Tanh", None, False), ("Tanh", None, False)], "several"),
    ([("Div", 3.0, False), ("Tanh", None, False), ("Mul", -3.0, False)], "positive"),
    ([("Div", 3.0, True), ("Tanh", None, False), ("Mul", 3.0, False)], "constant divided by the scores"),
    ([("Mul", None, False), ("Tanh", None, False)], "no float32 scalar constant"),
])
def test_scores_capped_another_way_say_why(chain, why):
    reason = softcapped_scores(_scores(chain))
    assert isinstance(reason, str) and why in reason
