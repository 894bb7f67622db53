"""`ExportQuantizer`: what every quantizer declares, and the calibration data it is given.

A quantizer runs at one of two stages of `HfExporter.export`:

- `"fx"`: on the captured `torch.export` program, before conversion (PT2E, NNCF on FX); the
  program is re-exported afterwards, so every backend the quantizer lists gets the result;
- `"model"`: on the converted artifact (an ONNX model, an `openvino.Model`).

It declares the formats it supports and the packages it needs; `check(format)` runs before any
tracing, so a bad combination (ONNX Runtime's quantizer on the OpenVINO exporter, a static scheme
without calibration data, a missing package) fails at once with what to do.

Calibration data are forward kwargs, as the model takes them: a list of input dicts (a
tokenizer's outputs), or a callable returning an iterable of them. The quantizer maps them to the
artifact's inputs itself (cache objects flattened, ONNX/OpenVINO names); nobody maps names by hand.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from ..errors import QuantizationError

__all__ = ["ExportQuantizer", "Calibration"]

#: A list of forward-kwargs dicts, or a callable returning an iterable of them.
Calibration = Iterable[dict[str, Any]] | Callable[[], Iterable[dict[str, Any]]]


class ExportQuantizer:
    """Base class of the quantizers a config's `quantizer=` takes.

    Args:
        scheme: one of the class's `schemes` (`"int8-dynamic"`, `"int8-static"`, `"int8-weights"`,
            `"int4-weights"`).
        calibration: forward kwargs to calibrate a static scheme on (see the module docstring).

    Subclasses set `name`, `stage`, `formats`, `schemes`, `static_schemes` and `packages`, and
    implement `quantize_program` (stage `"fx"`) or `quantize_model` (stage `"model"`).
    """

    name: ClassVar[str] = ""
    stage: ClassVar[str] = "fx"
    formats: ClassVar[tuple[str, ...]] = ()
    schemes: ClassVar[tuple[str, ...]] = ()
    static_schemes: ClassVar[tuple[str, ...]] = ("int8-static",)
    packages: ClassVar[tuple[str, ...]] = ()
    extra: ClassVar[str] = "quantization"

    def __init__(self, scheme: str, calibration: Calibration | None = None):
        if scheme not in self.schemes:
            raise ValueError(f"{type(self).__name__} has no scheme {scheme!r}; choose one of {', '.join(self.schemes)}")
        self.scheme = scheme
        self.calibration = calibration

    # -- checks, before any tracing -------------------------------------------------------------

    @property
    def needs_calibration(self) -> bool:
        """Whether the scheme is static: it needs calibration data."""
        return self.scheme in self.static_schemes

    def check(self, export_format: str) -> None:
        """Raise before any work when this quantizer cannot run for `export_format`."""
        owner = type(self).__name__
        if export_format not in self.formats:
            raise QuantizationError(
                f"{owner} does not work with the {export_format} exporter (it supports: {', '.join(self.formats)})",
                remedy=_suggestion(export_format),
            )
        missing = [p for p in self.packages if importlib.util.find_spec(p) is None]
        if missing:
            from .._versions import pip_line

            raise ImportError(f"{owner} needs {', '.join(missing)}, which is not installed. "
                              f"Install it with: {pip_line(self.extra)}")
        if self.needs_calibration and self.calibration is None:
            raise QuantizationError(
                f"{owner}(scheme={self.scheme!r}) is a static scheme: it needs calibration data",
                remedy="pass calibration=[inputs, ...] (forward kwargs, e.g. tokenizer outputs), "
                "or choose a dynamic or weight-only scheme",
            )

    def stage_for(self, export_format: str) -> str:
        """The stage this quantizer runs at for `export_format` (`"fx"` or `"model"`)."""
        return self.stage

    # -- calibration ----------------------------------------------------------------------------

    def calibration_samples(self) -> list[dict[str, Any]]:
        """The calibration data as a list of forward-kwargs dicts."""
        data = self.calibration() if callable(self.calibration) else self.calibration
        samples = [dict(sample) for sample in (data or [])]
        if self.needs_calibration and not samples:
            raise QuantizationError(f"{type(self).__name__}: the calibration data are empty",
                                    remedy="pass at least one input dict")
        return samples

    # -- the work -------------------------------------------------------------------------------

    def quantize_program(self, module: torch.fx.GraphModule, samples: list[dict[str, Any]]) -> torch.nn.Module:
        """Stage `"fx"`: return a quantized module from `program.module()` (it is re-exported)."""
        raise NotImplementedError

    def quantize_model(self, artifact: Any, samples: list[list[torch.Tensor]]) -> Any:
        """Stage `"model"`: return the quantized artifact; `samples` are flat input tensors in
        the artifact's input order."""
        raise NotImplementedError

    def with_calibration(self, calibration: Calibration | None) -> ExportQuantizer:
        """A copy of this quantizer calibrated on `calibration` instead."""
        import copy

        clone = copy.copy(self)
        clone.calibration = calibration
        return clone

    def details(self) -> dict[str, Any]:
        """What the last run decided that the user should see (the record's `details["quantization"]`
        carries it): layers given another granularity, and why. Empty by default."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """The quantizer as a config file holds it (`{"quantizer": name, "scheme": ...}`); calibration data are left out."""
        return {"quantizer": self.name, "scheme": self.scheme}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(scheme={self.scheme!r})"


def _suggestion(export_format: str) -> str:
    return {
        "onnx": "for ONNX use OrtQuantizer or NNCFQuantizer",
        "openvino": "for OpenVINO use NNCFQuantizer",
        "executorch": "for ExecuTorch use PT2EQuantizer or TorchaoQuantizer",
        "dynamo": "for torch.export use PT2EQuantizer",
    }.get(export_format, "see hfexport.quantization for the quantizers and their formats")
