"""`OrtQuantizer`'s weight-only schemes quantize one weight at a time on the ONNX IR model
(`_matmul_nbits_in_place`) and give what ONNX Runtime's `MatMulNBitsQuantizer` gives on the whole
`ModelProto`: the same nodes, the same initializer bytes, the same outputs in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ir = pytest.importorskip("onnx_ir")
ort = pytest.importorskip("onnxruntime")

from hfexport import OnnxConfig, OnnxExporter  # noqa: E402
from hfexport.presets import build_preset  # noqa: E402
from hfexport.quantization.ort import OrtQuantizer, _weights_one_at_a_time  # noqa: E402

@pytest.fixture(scope="module")
def exports():
    cache = {}

    def export(preset):
        if preset not in cache:
            model, inputs = build_preset(preset)
            cache[preset] = (OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True)), inputs)
        return cache[preset]

    return export


def _initializers(proto) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}


def _nbits_nodes(proto) -> dict[str, dict]:
    return {n.name: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} | {"inputs": list(n.input)}
            for n in proto.graph.node if n.op_type == "MatMulNBits"}


# the configuration that broke (the 1 GB checkpoint: 2.1x) and drawn variations: bits, block
# sizes, zero points, accuracy levels, and models with other head dims, kv heads and MLPs
@pytest.mark.slow  # each case exports a preset to ONNX
@pytest.mark.parametrize(("preset", "scheme", "options"), [
    ("llama", "int8-weights", {}),
    ("llama", "int4-weights", {}),
    ("llama", "int4-weights", {"block_size": 16, "is_symmetric": True}),
    ("qwen3", "int4-weights", {"block_size": 128, "accuracy_level": 0}),
    ("gpt2", "int8-weights", {"block_size": 64, "is_symmetric": True, "accuracy_level": 1}),
])
def test_one_weight_at_a_time_equals_onnx_runtimes_quantizer(exports, preset, scheme, options, monkeypatch):
    program, inputs = exports(preset)
    assert _weights_one_at_a_time(program.model)
    quantizer = OrtQuantizer(scheme, **options)
    expected = quantizer._matmul_nbits(program.model_proto)

    def whole_model(self, proto):
        raise AssertionError("took ONNX Runtime's whole-model quantizer")

    monkeypatch.setattr(OrtQuantizer, "_matmul_nbits", whole_model)
    quantized = quantizer.quantize_model(program, [])
    actual = ir.to_proto(quantized.model)
    assert _nbits_nodes(actual) == _nbits_nodes(expected) and _nbits_nodes(actual)
    want, got = _initializers(expected), _initializers(actual)
    assert sorted(got) == sorted(want)
    assert all(np.array_equal(got[name], want[name]) for name in want)
    feeds = {i.name: v.numpy() for i, v in zip(expected.graph.input, inputs.values())}
    run = lambda proto: ort.InferenceSession(proto.SerializeToString()).run(None, feeds)  # noqa: E731
    for a, b in zip(run(expected), run(actual)):
        np.testing.assert_array_equal(a, b)
    # the fp32 program it was made from is untouched (quantized on a clone sharing its tensors)
    assert not any(node.op_type == "MatMulNBits" for node in program.model.graph)


def _model_with(*, subgraph: bool) -> ir.Model:
    weight = ir.Value(name="w", const_value=ir.tensor(np.ones((4, 4), np.float32), name="w"))
    x = ir.Value(name="x", shape=ir.Shape([1, 4]), type=ir.TensorType(ir.DataType.FLOAT))
    matmul = ir.node("MatMul", [x, weight])
    nodes = [matmul]
    if subgraph:
        condition = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(True))})
        branches = {name: ir.Graph([], [], nodes=[], name=name) for name in ("then_branch", "else_branch")}
        nodes += [condition, ir.node("If", [condition.outputs[0]], attributes=branches, num_outputs=0)]
    return ir.Model(ir.Graph([x], [matmul.outputs[0]], nodes=nodes, initializers=[weight]), ir_version=10)


def test_a_model_with_a_subgraph_goes_through_onnx_runtimes_quantizer():
    """An If or Loop body may hold MatMuls (ORT's quantizer walks into subgraphs); one-at-a-time
    quantizes the main graph only, so such a model takes ORT's whole-model path."""
    assert not _weights_one_at_a_time(_model_with(subgraph=True))
    assert _weights_one_at_a_time(_model_with(subgraph=False))


@pytest.mark.parametrize(("vocab", "hidden", "scheme", "tied"), [
    (300, 64, "int4-weights", True), (97, 48, "int4-weights", True), (256, 32, "int8-weights", True),
    (300, 64, "int4-weights", False),
])
def test_a_head_read_through_fused_matmul_is_quantized_at_8_bits_where_tied(vocab, hidden, scheme, tied):
    """An LM head reading the embedding's table `[vocab, hidden]` through `FusedMatMul(x, table,
    transB=1)` (onnxscript's fusion where the table is too large to fold its transpose: SmolLM2's
    49152 x 576). Tied (the Gather reads the same table): MatMulNBits at 8 bits, the Gather keeping
    the float table; untied (the embedding has a table of its own): the scheme's bits, like any
    linear. The logits stay within the bits' error of the float graph's in ONNX Runtime."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(vocab)
    table = rng.standard_normal((vocab, hidden)).astype(np.float32)
    embedding = "table" if tied else "embedding"
    graph = helper.make_graph(
        [helper.make_node("Gather", [embedding, "ids"], ["x"]),
         helper.make_node("FusedMatMul", ["x", "table"], ["logits"], domain="com.microsoft", transB=1, alpha=1.0)],
        "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5, vocab])],
        [onnx.numpy_helper.from_array(table, "table")]
        + ([] if tied else [onnx.numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32),
                                                         "embedding")]))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    quantizer = OrtQuantizer(scheme)
    model = quantizer._matmul_nbits_in_place(ir.from_proto(proto))
    nbits = [node for node in model.graph if node.op_type == "MatMulNBits"]
    bits = 8 if tied else int(scheme[3])
    assert [node.op_type for node in model.graph] == ["Gather", "MatMulNBits"]
    attributes = {name: nbits[0].attributes[name].value for name in ("K", "N", "bits")}
    assert attributes == {"K": hidden, "N": vocab, "bits": bits}
    assert model.graph.node(0).inputs[0].name == embedding and embedding in model.graph.initializers
    assert ("table" in model.graph.initializers) == tied  # an untied head's float weight is gone
    assert quantizer.details() == ({"tied_head": {"weights": ["table"], "bits": 8}} if tied else {})
    ids = {"ids": rng.integers(0, vocab, (1, 5))}
    want = ort.InferenceSession(proto.SerializeToString()).run(None, ids)[0]
    got = ort.InferenceSession(ir.to_proto(model).SerializeToString()).run(None, ids)[0]
    cosine = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cosine > (0.999 if bits == 8 else 0.99), cosine
