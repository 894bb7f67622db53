"""`OnnxRunner`: the private name its cache session reads outputs through still exists (its session
options are `test_session_options.py`'s)."""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from hfexport.backends.onnx import runner as onnx_runner  # noqa: E402


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
