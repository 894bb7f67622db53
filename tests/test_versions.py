"""Environment checks: a missing backend package names its pip line; drift names each package once;
pyproject.toml's ranges, constraints.txt and TESTED_VERSIONS agree."""

from __future__ import annotations

import itertools
import logging
import pathlib
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hfexport import _versions
from hfexport.presets import build_preset

ROOT = pathlib.Path(__file__).parents[1]


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


def test_drift_warns_once_naming_each_package(monkeypatch, caplog):
    from hfexport import DynamoConfig, DynamoExporter

    monkeypatch.setitem(_versions.TESTED_VERSIONS, "torch", "1.0.0")
    monkeypatch.setattr(_versions, "_warned", set())
    model, inputs = build_preset("bert")
    with caplog.at_level(logging.WARNING, logger="hfexport"):
        DynamoExporter().export(model, inputs, config=DynamoConfig())
        DynamoExporter().export(model, inputs, config=DynamoConfig())
    drift = [r for r in caplog.records if "validated with another version" in r.getMessage()]
    assert len(drift) == 1
    installed = _versions.installed_version("torch")
    assert f"torch {installed} (tested 1.0.0)" in drift[0].getMessage()
    assert '"torch==1.0.0"' in drift[0].getMessage()


def test_drift_warning_names_each_differing_package_once_across_exporters(monkeypatch, caplog):
    installed = {"torch": "2.13.1", "transformers": "5.24.0", "onnx": "1.23.3", "onnxscript": "0.7.2",
                 "onnxruntime": "1.32.0", "onnxruntime-genai": "0.18.0", "openvino": "2026.4.2"}
    monkeypatch.setattr(_versions, "installed_version", installed.get)
    monkeypatch.setattr(_versions, "_warned", set())

    def messages(extra, owner):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hfexport"):
            drifted = _versions.warn_on_drift(extra, owner=owner)
        return [s.name for s in drifted], [r.getMessage() for r in caplog.records]

    drifted, [message] = messages("onnx", "OnnxExporter")
    assert drifted == ["torch", "onnx"]
    assert "torch 2.13.1 (tested 2.13.0), onnx 1.23.3 (tested 1.23.2)." in message
    assert 'pip install "torch==2.13.0" "onnx==1.23.2"' in message
    assert "transformers" not in message and "onnxscript" not in message
    # torch and onnx are named already: another exporter needing them says nothing more
    assert messages("genai", "GenAIRunner") == (["torch", "onnx"], [])
    # a newly met package is named, and only it
    drifted, [message] = messages("openvino", "OpenVINOExporter")
    assert drifted == ["torch", "openvino"] and "openvino 2026.4.2 (tested 2026.4.1)" in message
    assert "torch" not in message


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pyproject_requirements() -> list[Requirement]:
    """Every requirement of the core and of every extra in `pyproject.toml`."""
    project = _pyproject()["project"]
    lines = [*project["dependencies"], *itertools.chain(*project["optional-dependencies"].values())]
    return [Requirement(line) for line in lines]


def _constraints() -> dict[str, str]:
    """`constraints.txt` as {name: pinned version}; a line that is not an `==` pin fails."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        [specifier] = requirement.specifier
        assert specifier.operator == "==" and not requirement.marker, f"constraints.txt: {line!r} is not a plain pin"
        assert requirement.name not in pins, f"constraints.txt pins {requirement.name} twice"
        pins[requirement.name] = specifier.version
    return pins


def test_constraints_pin_exactly_the_tested_versions():
    pins = _constraints()
    for name, version in _versions.TESTED_VERSIONS.items():
        assert pins.get(name) == version, f"{name}: constraints.txt pins {pins.get(name)}, TESTED_VERSIONS says {version}"


def test_pyproject_declares_ranges_holding_the_tested_and_pinned_versions():
    """Each requirement is a range (no `==`: an exact pin replaces the user's package), holds the
    tested version, and holds every version constraints.txt pins, test tools included."""
    requirements = _pyproject_requirements()
    named = {canonicalize_name(r.name) for r in requirements}
    for name in _versions.TESTED_VERSIONS:
        assert name in named, f"{name} is in TESTED_VERSIONS but no pyproject.toml requirement names it"
    pins = _constraints()
    for requirement in requirements:
        for specifier in requirement.specifier:
            assert specifier.operator not in ("==", "==="), f"pyproject.toml pins {requirement}; declare a range"
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is not None:
            assert requirement.specifier.contains(pin), f"pyproject.toml's {requirement} excludes the pinned {pin}"
