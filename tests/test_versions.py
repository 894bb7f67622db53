"""Environment checks: a missing backend package names its pip line; drift warns once per exporter."""

from __future__ import annotations

import logging

import pytest

from hfexport import _versions
from hfexport.presets import build_preset


def test_missing_package_raises_import_error_with_pip_line(monkeypatch):
    monkeypatch.setattr(_versions, "is_importable", lambda name: name != "onnxruntime")
    with pytest.raises(ImportError) as info:
        _versions.require_extra("onnx", purpose="OnnxExporter")
    message = str(info.value)
    assert 'pip install "hfexport[onnx]"' in message
    assert "onnxruntime" in message and "onnxscript" not in message.split("(or")[0].split("needs")[1]


def test_missing_backend_fails_before_tracing(monkeypatch):
    from hfexport import DynamoConfig, DynamoExporter

    class NeedsNothingThere(DynamoExporter):
        extra = "openvino"

    monkeypatch.setattr(_versions, "is_importable", lambda name: name != "openvino")
    traced = []
    monkeypatch.setattr("hfexport.exporter.capture", lambda *a, **k: traced.append(1))
    model, inputs = build_preset("bert")
    with pytest.raises(ImportError, match=r'pip install "hfexport\[openvino\]"'):
        NeedsNothingThere().export(model, inputs, config=DynamoConfig())
    assert traced == []


def test_drift_warns_once_per_exporter_naming_each_package(monkeypatch, caplog):
    from hfexport import DynamoConfig, DynamoExporter

    monkeypatch.setitem(_versions.TESTED_VERSIONS, "torch", "1.0.0")
    monkeypatch.setattr(_versions, "_warned", set())
    model, inputs = build_preset("bert")
    with caplog.at_level(logging.WARNING, logger="hfexport"):
        DynamoExporter().export(model, inputs, config=DynamoConfig())
        DynamoExporter().export(model, inputs, config=DynamoConfig())
    drift = [r for r in caplog.records if "validated with another version" in r.getMessage()]
    assert len(drift) == 1
    assert "torch" in drift[0].getMessage() and "tested 1.0.0" in drift[0].getMessage()


def test_tested_versions_match_pyproject_pins():
    import pathlib
    import re

    pyproject = (pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text()
    pins = dict(re.findall(r'"([a-z0-9_-]+)==([0-9.]+)"', pyproject))
    for name, version in _versions.TESTED_VERSIONS.items():
        assert pins.get(name) == version, f"{name}: pyproject pins {pins.get(name)}, TESTED_VERSIONS says {version}"
