"""`OnnxRunner`'s session options: what it sets over ONNX Runtime's defaults is explicit, recorded
and overridable; the private name its cache session reads outputs through still exists."""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from hfexport.backends.onnx import runner as onnx_runner  # noqa: E402
from hfexport.errors import ExportError  # noqa: E402


def test_the_session_does_not_spin_unless_asked(monkeypatch):
    monkeypatch.delenv(onnx_runner.SESSION_CONFIG_ENV, raising=False)
    assert onnx_runner.session_config() == {"session.intra_op.allow_spinning": "0"}
    monkeypatch.setenv(onnx_runner.SESSION_CONFIG_ENV,
                       '{"session.intra_op.allow_spinning": null, "intra_op_num_threads": 1}')
    config = onnx_runner.session_config()
    assert config == {"intra_op_num_threads": 1}
    options = onnx_runner._apply(ort.SessionOptions(), {**config, "session.intra_op.allow_spinning": "1"})
    assert options.intra_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"


@pytest.mark.parametrize("text", ["not json", '{"no_such_option": 1}'])
def test_a_bad_override_says_how_to_write_it(monkeypatch, text):
    monkeypatch.setenv(onnx_runner.SESSION_CONFIG_ENV, text)
    with pytest.raises(ExportError, match="SessionOptions|JSON"):
        onnx_runner._apply(ort.SessionOptions(), onnx_runner.session_config())


def test_bound_outputs_are_read_by_name_through_the_c_binding():
    """`IOBinding._iobinding` (onnxruntime 1.32.0) is what `_BoundOutputs` indexes: this fails the
    day it disappears (the public, slower `get_outputs()` is then used)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"]), helper.make_node("Neg", ["x"], ["z"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    assert hasattr(binding, "_iobinding")
    x = np.array([1.0, 2.0], np.float32)
    binding.bind_cpu_input("x", x)
    binding.bind_output("y", "cpu")
    binding.bind_output("z", "cpu")
    session.run_with_iobinding(binding)
    outputs = onnx_runner._BoundOutputs(binding, {"y": 0, "z": 1})
    np.testing.assert_array_equal(outputs["z"].numpy(), -x)
    np.testing.assert_array_equal(outputs["y"].numpy(), 2 * x)
