"""Every backend folder has the same files and names: knowing one backend means knowing all."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

import hfexport
from hfexport.config import BUILTIN_FORMATS
from hfexport.extensions import FORMATS

FILES = ("__init__.py", "config.py", "exporter.py", "artifact.py", "runner.py", "patches.py")
_PACKAGES = {"onnx": "onnxruntime", "openvino": "openvino", "executorch": "executorch"}


@pytest.mark.parametrize("fmt", BUILTIN_FORMATS)
def test_a_backend_folder_has_the_shared_files(fmt):
    folder = Path(hfexport.__file__).parent / "backends" / fmt
    assert sorted(f for f in FILES if not (folder / f).is_file()) == []
    package = importlib.import_module(f"hfexport.backends.{fmt}")
    assert package.__doc__ and package.__all__
    for name in package.__all__:
        assert getattr(package, name) is not None


@pytest.mark.parametrize("fmt", BUILTIN_FORMATS)
def test_a_backends_classes_are_where_its_names_say(fmt):
    if fmt in _PACKAGES:
        pytest.importorskip(_PACKAGES[fmt])
    from hfexport.exporter import HfExporter
    from hfexport.runner import Runner

    entry = FORMATS.get(fmt)
    exporter, config, runner = entry.exporter_class(), entry.config_class(), entry.runner_class()
    prefix = exporter.__name__.removesuffix("Exporter")
    assert (config.__name__, runner.__name__) == (f"{prefix}Config", f"{prefix}Runner")
    assert exporter.__module__ == f"hfexport.backends.{fmt}.exporter" and issubclass(exporter, HfExporter)
    assert config.__module__ == f"hfexport.backends.{fmt}.config" and issubclass(runner, Runner)
    assert exporter.format == config.export_format == fmt and exporter.config_class is config


@pytest.mark.parametrize("fmt", BUILTIN_FORMATS)
def test_every_fx_fix_of_a_backend_is_in_its_order_tuple(fmt):
    """The order FX fixes run in is the exporter's tuple, never the order modules were imported."""
    if fmt in _PACKAGES:
        pytest.importorskip(_PACKAGES[fmt])
    from hfexport.builtins import load_workarounds
    from hfexport.workarounds import FX_NODE_FIXES, FX_PROGRAM_FIXES

    load_workarounds()
    exporter = FORMATS.get(fmt).exporter_class()
    mine = sorted(f.name for f in [*FX_NODE_FIXES.values(), *FX_PROGRAM_FIXES.values()] if fmt in f.formats)
    assert sorted(exporter.fix_order) == mine


#: The formats whose runtime ships its own LLM runner, which their export folder is packaged for.
_LLM_RUNNERS = {"onnx": "onnxruntime-genai's og.Generator", "openvino": "OpenVINO GenAI's LLMPipeline",
                "executorch": "ExecuTorch's TextLLMRunner"}


@pytest.mark.parametrize("fmt", BUILTIN_FORMATS)
def test_a_backend_packages_its_generation_folder_through_the_shared_hooks(fmt):
    """Every backend's `RuntimePackage` keeps the base class's signatures, and one whose runtime
    has its own LLM runner overrides `write` (its folder is that runner's package), `run` (the
    export job runs the folder in it) and `open_engine` (`hfexport generate` drives it): the export
    job and `generation/` never ask which format they hold."""
    import inspect

    if fmt in _PACKAGES:
        pytest.importorskip(_PACKAGES[fmt])
    from hfexport.exporter import HfExporter
    from hfexport.folder.package import RuntimePackage

    exporter = FORMATS.get(fmt).exporter_class()
    package = exporter().runtime_package()
    assert isinstance(package, RuntimePackage) and package.exporter.format == fmt
    assert inspect.signature(exporter.plan_generation).parameters.keys() == \
        inspect.signature(HfExporter.plan_generation).parameters.keys(), fmt
    hooks = ("folder_config", "request", "plan", "components", "check_listed", "file_stem", "write", "run",
             "open_engine")
    for hook in hooks:
        assert inspect.signature(getattr(type(package), hook)).parameters.keys() == \
            inspect.signature(getattr(RuntimePackage, hook)).parameters.keys(), (fmt, hook)
    for hook in ("write", "run", "open_engine"):
        overrides = getattr(type(package), hook) is not getattr(RuntimePackage, hook)
        assert overrides == (fmt in _LLM_RUNNERS), f"{fmt}.{hook}: {_LLM_RUNNERS.get(fmt, 'no LLM runner')}"
    assert package.has_runner == (fmt in _LLM_RUNNERS), f"{fmt}: {_LLM_RUNNERS.get(fmt, 'no LLM runner')}"
