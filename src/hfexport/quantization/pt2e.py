"""`PT2EQuantizer`: int8 through torchao's PT2E flow with the XNNPACK quantizer (torch.export, ExecuTorch)."""

from __future__ import annotations

from typing import Any

import torch

from .base import ExportQuantizer

__all__ = ["PT2EQuantizer"]


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

    def quantize_program(self, module: torch.fx.GraphModule, samples: list[dict[str, Any]]) -> torch.nn.Module:
        """Quantize the `torch.export` module with PT2E (prepare, calibrate on `samples`, convert)."""
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        prepared = prepare_pt2e(module, self._pt2e_quantizer())
        with torch.no_grad():
            for sample in samples:  # observers record activation ranges (static); dynamic needs one pass
                prepared(**sample)
        return drop_unused_attributes(convert_pt2e(prepared))

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
