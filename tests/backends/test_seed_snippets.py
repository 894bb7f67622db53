"""The seed's "Dynamic shapes" and auto-class snippets, once for every backend that runs them as
written (ExecuTorch has its own variants: bounded Dims, a slower export)."""

from __future__ import annotations

import pytest

from hfexport import AutoExportConfig, AutoHfExporter, record_of, validate
from hfexport.presets import build_preset
from tests.harness import expected_cases, padded_batch, require_backend, seed_dynamic_shapes

#: ONNX's and OpenVINO's exports of these snippets take 10-15 s: the slow tier.
FORMATS = ["dynamo", *(pytest.param(fmt, marks=pytest.mark.slow, id=fmt) for fmt in ("onnx", "openvino"))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_seed_dynamic_shapes_snippet_with_padded_batch(fmt):
    require_backend(fmt)
    model, _ = build_preset("llama")
    inputs = padded_batch()
    config = AutoExportConfig.from_dict({"export_format": fmt})
    config = config.replace(dynamic_shapes=seed_dynamic_shapes(), prefer_deferred_runtime_asserts_over_guards=True)
    artifact = AutoHfExporter.from_config(config).export(model, inputs, config=config)
    report = validate(artifact, model, inputs, steps=(2, 5))
    assert report.passed and [c.label for c in report.cases] == expected_cases(inputs, True, steps=(2, 5)), report.to_table()
    assert sorted(record_of(artifact).symbol_ranges.values()) == [(1, 32), (1, 2048)]  # the Dims, as stated


@pytest.mark.parametrize("fmt", FORMATS)
def test_seed_auto_classes_snippet(fmt):
    require_backend(fmt)
    model, inputs = build_preset("qwen3")
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    exporter = AutoHfExporter.from_config(config)
    assert exporter.format == fmt
    artifact = exporter.export(model, inputs, config=config)
    report = validate(artifact, model, inputs)
    assert report.passed and [c.label for c in report.cases] == expected_cases(inputs, True), report.to_table()
