"""Configs: field checks, dict/JSON round trips, and the auto classes."""

from __future__ import annotations

import json

import pytest
import torch

from hfexport import (
    AutoExportConfig,
    AutoHfExporter,
    DynamoConfig,
    DynamoExporter,
    ExecutorchConfig,
    ExportFormat,
    OnnxConfig,
    OpenVINOConfig,
)


@pytest.mark.parametrize(
    "config",
    [
        DynamoConfig(dynamic=True),
        OnnxConfig(dynamic=True, opset=20, optimize=False),
        ExecutorchConfig(delegate="xnnpack", alloc_graph_input=False, alloc_graph_output=False,
                         alloc_mutable_buffers=False),
        OpenVINOConfig(inference_precision=None, compress_to_fp16=True),
    ],
    ids=lambda c: type(c).__name__,
)
def test_config_round_trips_through_dict_and_json(config):
    data = config.to_dict()
    assert data["export_format"] == config.export_format
    assert AutoExportConfig.from_dict(data) == config
    assert AutoExportConfig.from_json(json.dumps(data)) == config
    assert type(config).from_json(config.to_json()) == config


def test_dynamic_shapes_with_dims_round_trip():
    batch = torch.export.Dim("batch", min=1, max=32)
    seq = torch.export.Dim("seq", min=1, max=2048)
    config = DynamoConfig(dynamic_shapes={"input_ids": {0: batch, 1: seq}, "mask": {0: torch.export.Dim.AUTO}},
                          prefer_deferred_runtime_asserts_over_guards=True)
    back = AutoExportConfig.from_json(config.to_json())
    dims = back.dynamic_shapes["input_ids"]
    assert (dims[0].__name__, dims[0].min, dims[0].max) == ("batch", 1, 32)
    assert (dims[1].__name__, dims[1].min, dims[1].max) == ("seq", 1, 2048)
    assert back.dynamic_shapes["mask"][0] is torch.export.Dim.AUTO
    assert back.prefer_deferred_runtime_asserts_over_guards is True


@pytest.mark.parametrize(
    ("factory", "field", "allowed"),
    [
        (lambda: ExecutorchConfig(delegate="vulkan"), "ExecutorchConfig.delegate", "'xnnpack', 'cuda', 'mlx'"),
        (lambda: OnnxConfig(opset=7), "OnnxConfig.opset", "18"),
        (lambda: OpenVINOConfig(inference_precision="f64"), "OpenVINOConfig.inference_precision", "'f32'"),
        (lambda: DynamoConfig(dynamic="yes"), "DynamoConfig.dynamic", "bool"),
        (lambda: ExecutorchConfig(alloc_graph_input=1), "ExecutorchConfig.alloc_graph_input", "bool"),
    ],
)
def test_bad_field_values_name_the_field_and_allowed_values(factory, field, allowed):
    with pytest.raises(ValueError) as info:
        factory()
    assert field in str(info.value) and allowed in str(info.value)


def test_unknown_format_lists_registered_ones():
    with pytest.raises(ValueError, match="unknown export_format 'tflite'.*dynamo.*onnx.*executorch.*openvino"):
        AutoExportConfig.from_dict({"export_format": "tflite"})


def test_unknown_field_is_refused():
    with pytest.raises(ValueError, match="no field.*opset"):
        AutoExportConfig.from_dict({"export_format": "dynamo", "opset": 18})


def test_auto_exporter_accepts_config_or_dict():
    assert isinstance(AutoHfExporter.from_config(DynamoConfig()), DynamoExporter)
    assert isinstance(AutoHfExporter.from_config({"export_format": "dynamo", "dynamic": True}), DynamoExporter)
    assert AutoExportConfig.from_dict({"export_format": ExportFormat.DYNAMO}) == DynamoConfig()


def test_exporter_refuses_another_backends_config():
    from hfexport.presets import build_preset

    model, inputs = build_preset("bert")
    with pytest.raises(TypeError, match="DynamoExporter takes a DynamoConfig.*AutoHfExporter"):
        DynamoExporter().export(model, inputs, config=OnnxConfig())


def test_the_seeds_backend_spelling_is_a_deprecated_alias_of_delegate():
    with pytest.warns(DeprecationWarning, match="use delegate"):
        config = ExecutorchConfig(backend="mlx")
    assert config.delegate == "mlx" and config.backend == "mlx"
    assert "backend" not in config.to_dict() and ExecutorchConfig.from_dict(config.to_dict()) == config
    assert ExecutorchConfig.from_dict({"export_format": "executorch", "backend": "cuda"}).delegate == "cuda"
    with pytest.raises(ValueError, match="pass delegate only"):
        ExecutorchConfig(delegate="cuda", backend="mlx")
