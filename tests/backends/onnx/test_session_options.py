"""`OnnxRunner`'s session options: what it sets over ONNX Runtime's defaults is explicit, and its
override (`$HFEXPORT_ORT_SESSION_CONFIG`) is typed: a JSON object of session config entries and of
the `SessionOptions` attributes it lists, anything else refused with what to write."""

from __future__ import annotations

import json

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from hfexport.backends.onnx import session_options  # noqa: E402
from hfexport.backends.onnx.session_options import (  # noqa: E402
    SESSION_ATTRIBUTES, SESSION_CONFIG_ENV, apply_session_config, session_config)
from hfexport.errors import RuntimeLoadError  # noqa: E402


def _with(monkeypatch, overrides) -> dict:
    monkeypatch.setenv(SESSION_CONFIG_ENV, overrides if isinstance(overrides, str) else json.dumps(overrides))
    return session_config()


def test_the_session_does_not_spin_unless_asked(monkeypatch):
    monkeypatch.delenv(SESSION_CONFIG_ENV, raising=False)
    assert session_config() == {"session.intra_op.allow_spinning": "0"}
    config = _with(monkeypatch, {"session.intra_op.allow_spinning": None, "intra_op_num_threads": 1})
    assert config == {"intra_op_num_threads": 1}
    options = apply_session_config(ort.SessionOptions(), {**config, "session.intra_op.allow_spinning": "1"})
    assert options.intra_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_config_entries_take_numbers_and_booleans_in_onnx_runtimes_string_form(monkeypatch):
    config = _with(monkeypatch, {"session.intra_op.allow_spinning": True, "session.disable_prepacking": 0,
                                 "session.x.ratio": 0.5})
    assert config == {"session.intra_op.allow_spinning": "1", "session.disable_prepacking": "0",
                      "session.x.ratio": "0.5"}


def test_each_listed_attribute_is_set_with_its_type_and_a_session_opens_with_it(monkeypatch):
    """Every attribute of the table is one `SessionOptions` has, of the type the table says; a
    session opens with them all set."""
    overrides = {"intra_op_num_threads": 1, "inter_op_num_threads": 1, "execution_mode": "ORT_PARALLEL",
                 "graph_optimization_level": "ORT_ENABLE_BASIC", "enable_cpu_mem_arena": False,
                 "enable_mem_pattern": False, "enable_mem_reuse": False, "use_deterministic_compute": True,
                 "log_severity_level": 3, "log_verbosity_level": 0}
    assert set(overrides) == set(SESSION_ATTRIBUTES)
    config = _with(monkeypatch, overrides)
    json.dumps(config)  # what the record stores
    options = apply_session_config(ort.SessionOptions(), config)
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.enable_cpu_mem_arena is False and options.use_deterministic_compute is True
    session = ort.InferenceSession(_neg_model(), options, providers=["CPUExecutionProvider"])
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], -x)
    assert session.get_session_options().intra_op_num_threads == 1


@pytest.mark.parametrize(("text", "message"), [
    ("not json", "is not JSON"),
    ("[1]", "is a JSON list .*not an object"),
    ('"x"', "is a JSON str .*not an object"),
    ("3", "is a JSON int .*not an object"),
    ('{"no_such_option": 1}', "'no_such_option' = 1 is refused: .*intra_op_num_threads \\(int\\)"),
    ('{"optimized_model_filepath": "/tmp/x.onnx"}', "'optimized_model_filepath' .* is refused"),
    ('{"intra_op_num_threads": "2"}', "intra_op_num_threads is an integer"),
    ('{"intra_op_num_threads": true}', "intra_op_num_threads is an integer"),
    ('{"inter_op_num_threads": -1}', "inter_op_num_threads is an integer, at least 0"),
    ('{"enable_mem_pattern": 1}', "enable_mem_pattern is true or false"),
    ('{"execution_mode": "parallel"}', "execution_mode is the name of an onnxruntime.ExecutionMode: ORT_SEQUENTIAL"),
    ('{"graph_optimization_level": 99}', "GraphOptimizationLevel: ORT_DISABLE_ALL"),
    ('{"session.intra_op.allow_spinning": [1]}', "a session config entry's value is a string"),
])
def test_a_bad_override_names_the_variable_the_key_and_what_is_accepted(monkeypatch, text, message):
    monkeypatch.setenv(SESSION_CONFIG_ENV, text)
    with pytest.raises(RuntimeLoadError, match=message) as error:
        session_config()
    assert SESSION_CONFIG_ENV in str(error.value) and "What to do:" in str(error.value)


def test_a_config_given_in_code_is_checked_as_the_variables(monkeypatch):
    with pytest.raises(RuntimeLoadError, match="'intra_op_threads' = 1 is refused"):
        apply_session_config(ort.SessionOptions(), {"intra_op_threads": 1})


def test_the_runner_module_still_offers_the_names_it_had():
    from hfexport.backends.onnx import runner

    assert runner.session_config is session_options.session_config
    assert runner.SESSION_CONFIG is session_options.SESSION_CONFIG


def _neg_model() -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()
