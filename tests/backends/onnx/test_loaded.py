"""`backends/onnx/loaded.py`: the external-data locations an ONNX model names, read off its wire
format, against the `onnx` package's own parse, on every place a tensor can sit."""

from __future__ import annotations

import numpy as np
import pytest

from hfexport.backends.onnx.loaded import external_locations
from hfexport.errors import ExportFolderError

onnx = pytest.importorskip("onnx")
TensorProto, helper, numpy_helper = onnx.TensorProto, onnx.helper, onnx.numpy_helper


def _external(name: str, location: str, values=(1.0, 2.0)):
    tensor = numpy_helper.from_array(np.array(values, dtype=np.float32), name)
    onnx.external_data_helper.set_external_data(tensor, location, offset=0, length=len(tensor.raw_data))
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    return tensor


def _by_onnx(model) -> set[str]:
    """The locations as the `onnx` package finds them (onnx 1.23's walker over every tensor)."""
    found = set()
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        found.update(e.value for e in tensor.external_data if e.key == "location")
    return found


def _model(where: str):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    inits, nodes, functions = [], [], []
    if where == "initializer":
        inits.append(_external("w", "a.bin"))
        nodes.append(helper.make_node("Add", ["x", "w"], ["y"]))
    elif where == "attribute":
        nodes.append(helper.make_node("Constant", [], ["w"], value=_external("c", "b.bin")))
        nodes.append(helper.make_node("Add", ["x", "w"], ["y"]))
    elif where == "subgraph":
        then = helper.make_graph([helper.make_node("Identity", ["t"], ["out"])], "then", [],
                                 [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])],
                                 [_external("t", "c.bin")])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["out2"])], "else", [],
                                  [helper.make_tensor_value_info("out2", TensorProto.FLOAT, [2])])
        cond = numpy_helper.from_array(np.array(True), "cond")
        inits.append(cond)
        nodes.append(helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other))
    elif where == "sparse":
        values, indices = _external("v", "d.bin", (1.0,)), numpy_helper.from_array(np.array([1], np.int64), "i")
        sparse = helper.make_sparse_tensor(values, indices, [2])
        nodes.append(helper.make_node("Constant", [], ["w"], sparse_value=sparse))
        nodes.append(helper.make_node("Add", ["x", "w"], ["y"]))
    elif where == "function":
        body = [helper.make_node("Constant", [], ["c"], value=_external("c", "e.bin")),
                helper.make_node("Add", ["a", "c"], ["b"])]
        functions.append(helper.make_function("local", "F", ["a"], ["b"], body, [helper.make_opsetid("", 17)]))
        nodes.append(helper.make_node("F", ["x"], ["y"], domain="local"))
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                             functions=functions)


@pytest.mark.parametrize(("where", "location"), [("initializer", "a.bin"), ("attribute", "b.bin"),
                                                  ("subgraph", "c.bin"), ("sparse", "d.bin"), ("function", "e.bin")])
def test_every_location_a_tensor_can_name_is_found(where, location):
    """Each place a tensor can sit; where the `onnx` package's own walker looks (not in sparse
    attributes nor in functions, onnx 1.23), it finds the same."""
    model = _model(where)
    assert external_locations(model.SerializeToString()) == {location}
    if where not in ("sparse", "function"):
        assert _by_onnx(model) == {location}


def test_a_model_without_external_data_names_none_and_damage_is_one_error():
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                                                [numpy_helper.from_array(np.ones(4, np.float32), "w")]))
    data = model.SerializeToString()
    assert external_locations(data) == set()
    with pytest.raises(ExportFolderError, match="not a valid protobuf"):
        external_locations(data[:-3] + b"\xff\xff\xff")
