"""`PT2EQuantizer`: int8 through torchao's PT2E flow with the XNNPACK quantizer (torch.export, ExecuTorch)."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

from .base import ExportQuantizer

__all__ = ["PT2EQuantizer"]

logger = logging.getLogger(__name__)


class PT2EQuantizer(ExportQuantizer):
    """int8 on the `torch.export` graph: `prepare_pt2e` → calibrate → `convert_pt2e`.

    Schemes: `"int8-dynamic"` (int8 per-channel weights, activations quantized at run time) and
    `"int8-static"` (activations calibrated on `calibration`). Linear and convolution layers are
    quantized, per channel and symmetric, as XNNPACK runs them; on ExecuTorch the XNNPACK delegate
    takes the quantized patterns, on `torch.export` the program carries int8 weights and
    quantize/dequantize ops.

    Any torchao PT2E `Quantizer` a user builds goes in place of a scheme name (its config is
    theirs: per-tensor or per-channel, static or dynamic, which layers):

    ```python
    config = ExecutorchConfig(dynamic=True, quantizer=PT2EQuantizer("int8-dynamic"))

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=False))
    config = OnnxConfig(dynamic=True, quantizer=PT2EQuantizer(quantizer, calibration=[inputs, ...]))
    ```

    A quantizer object runs on every format whose converter takes the quantized graph: `dynamo`,
    `executorch` (XNNPACK's quantizer; the delegate takes its patterns) and `onnx` (a QDQ graph:
    `QuantizeLinear`/`DequantizeLinear` around the MatMuls, which ONNX Runtime fuses).
    OpenVINO refuses it: OpenVINO 2026.4.1's PyTorch frontend feeds the int8 weight constant of a
    PT2E `linear` to its MatMul without the dequantize ("MatMul ... f32 x i8" at conversion,
    measured with XNNPACKQuantizer and X86InductorQuantizer); use `NNCFQuantizer` there. Without
    `calibration` a quantizer object observes the export sample only (one input), which the
    record says (`calibrated_on`); a static config wants representative inputs.
    """

    name = "pt2e"
    stage = "fx"
    formats = ("executorch", "dynamo")
    schemes = ("int8-dynamic", "int8-static")
    packages = ("torchao", "executorch")
    #: the formats a user's quantizer object can go to (their converters take the QDQ graph)
    object_formats = ("executorch", "dynamo", "onnx")

    def __init__(self, scheme: Any, calibration=None, **recorded: Any):
        self.quantizer = None
        if scheme == "custom" or recorded:
            raise ValueError(f"PT2EQuantizer({recorded.get('pt2e_quantizer', 'a quantizer object')}) cannot be rebuilt "
                             "from a config file (a quantizer object is code); pass PT2EQuantizer(your_quantizer) "
                             "as the config's quantizer=")
        if not isinstance(scheme, str):
            _check_is_pt2e_quantizer(scheme)
            self.quantizer, self.scheme, self.calibration = scheme, "custom", calibration
            self.formats = self.object_formats
            return
        super().__init__(scheme, calibration)

    @property
    def needs_calibration(self) -> bool:
        """A scheme name's static scheme needs calibration data; a quantizer object may take them."""
        return self.quantizer is None and super().needs_calibration

    def check(self, export_format: str) -> None:
        """As `ExportQuantizer.check`, naming NNCF for OpenVINO, which refuses PT2E's quantized linear."""
        if self.quantizer is not None and export_format == "openvino":
            from ..errors import QuantizationError

            raise QuantizationError(
                f"PT2EQuantizer({type(self.quantizer).__name__}) does not work with the openvino exporter: its "
                "PyTorch frontend (2026.4.1) feeds PT2E's int8 weights to MatMul without their dequantize",
                remedy="for OpenVINO use NNCFQuantizer (it takes nncf.compress_weights / nncf.quantize options)")
        super().check(export_format)

    def calibration_samples(self) -> list[dict[str, Any]]:
        """As `ExportQuantizer.calibration_samples`; a quantizer object without data observes the export sample."""
        if self.quantizer is not None and self.calibration is None:
            return []
        return super().calibration_samples()

    def _pt2e_quantizer(self):
        if self.quantizer is not None:
            return self.quantizer
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=self.scheme == "int8-dynamic")
        return XNNPACKQuantizer().set_global(config)

    @contextlib.contextmanager
    def annotating_only(self, targets: frozenset, why: str) -> Iterator[None]:
        """Inside the block, `quantize_program` keeps the quantizer's annotations on nodes calling
        `targets` only (the rest run in float); a run that drops any says so in `details()`, with `why`.

        An exporter uses it where its runtime cannot run what the quantizer annotates elsewhere
        (`ExecutorchExporter` on rotary decoders: `executorch/exporter.py`, `_xnnpack_static_safe`).
        """
        self._only = (targets, why)
        try:
            yield
        finally:
            self._only = None

    def quantize_program(self, module: torch.fx.GraphModule, samples: list[dict[str, Any]]) -> torch.nn.Module:
        """Quantize the `torch.export` module with PT2E (prepare, calibrate on `samples`, convert)."""
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        quantizer, self.notes = self._pt2e_quantizer(), {}
        only = getattr(self, "_only", None)
        if only is not None:
            quantizer = _annotating_only_class()(quantizer, only[0])
        prepared = prepare_pt2e(module, quantizer)
        if only is not None and quantizer.dropped:
            self.notes = {"float_ops": dict(sorted(quantizer.dropped.items())),
                          "float_ops_why": only[1],
                          "quantized_ops": sorted(str(target) for target in only[0]
                                                  if str(target) in quantizer.kept)}
            logger.warning("%r: annotations of %d node(s) dropped, which run in float (%s): %s", self,
                           sum(quantizer.dropped.values()), ", ".join(quantizer.dropped), only[1])
        with torch.no_grad():
            for sample in samples:  # observers record activation ranges (static); dynamic needs one pass
                prepared(**sample)
        return drop_unused_attributes(convert_pt2e(prepared))

    def details(self) -> dict[str, Any]:
        """What the last `quantize_program` left in float that the quantizer annotated, and why (see `annotating_only`)."""
        return dict(getattr(self, "notes", {}))

    def to_dict(self) -> dict[str, Any]:
        """As `ExportQuantizer.to_dict`; a quantizer object is named by its class (it cannot be rebuilt from JSON)."""
        if self.quantizer is None:
            return super().to_dict()
        return {"quantizer": self.name, "scheme": "custom", "pt2e_quantizer": type(self.quantizer).__name__,
                "calibrated_on": "the export sample (1 input)" if self.calibration is None else "calibration="}

    def __repr__(self) -> str:
        if self.quantizer is None:
            return super().__repr__()
        return f"PT2EQuantizer({type(self.quantizer).__name__})"


@functools.cache
def _annotating_only_class() -> type:
    """`AnnotatingOnly`, a torchao `Quantizer` (made on first use: torchao is an optional package)."""
    from torchao.quantization.pt2e.quantizer import Quantizer

    class AnnotatingOnly(Quantizer):
        """`quantizer`'s annotations kept on nodes calling `targets` only; `dropped` counts the rest by op."""

        def __init__(self, quantizer: Any, targets: frozenset):
            super().__init__()
            self.quantizer, self.targets = quantizer, targets
            self.dropped: Counter = Counter()
            self.kept: set[str] = set()

        def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            return self.quantizer.transform_for_annotation(model)

        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

            model = self.quantizer.annotate(model)
            for node in model.graph.nodes:
                if node.op != "call_function" or Q_ANNOTATION_KEY not in node.meta:
                    continue  # a weight's or an input's own annotation belongs to the op reading it
                if node.target in self.targets:
                    self.kept.add(str(node.target))
                    continue
                # A kept node's specs are its own (a linear's input, weight and output), never a
                # SharedQuantizationSpec of a dropped node, so no kept annotation points at these.
                del node.meta[Q_ANNOTATION_KEY]
                self.dropped[str(node.target)] += 1
            return model

        def validate(self, model: torch.fx.GraphModule) -> None:
            self.quantizer.validate(model)

    return AnnotatingOnly


def _check_is_pt2e_quantizer(quantizer: Any) -> None:
    try:
        from torchao.quantization.pt2e.quantizer import Quantizer
    except ImportError as error:
        raise ImportError("PT2EQuantizer needs torchao; install it with: pip install 'hfexport[quantization]'") from error
    if not isinstance(quantizer, Quantizer):
        raise TypeError(f"PT2EQuantizer takes a scheme name ({', '.join(PT2EQuantizer.schemes)}) or a torchao PT2E "
                        f"Quantizer (torchao.quantization.pt2e.quantizer.Quantizer), got {type(quantizer).__name__}")


def drop_unused_attributes(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Delete parameters and buffers no graph node reads.

    # NOTE: `convert_pt2e` folds each quantized weight into a new int8 constant but leaves the
    # float parameter on the module; re-exporting would then carry both (measured: a .pt2 at 1.24x
    # the fp32 size instead of ~0.3x). Only what the graph reads is kept.
    """
    used = {str(node.target) for node in module.graph.nodes if node.op == "get_attr"}
    for name, _ in list(module.named_parameters()) + list(module.named_buffers()):
        if name in used:
            continue
        owner_path, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        if attr in owner._parameters:
            del owner._parameters[attr]
        elif attr in owner._buffers:
            del owner._buffers[attr]
    module.delete_all_unused_submodules()
    return module
