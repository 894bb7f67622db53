"""Quantization during export: a `quantizer=` on every config.

| quantizer       | stage                 | formats                  | schemes                                   |
|-----------------|-----------------------|--------------------------|-------------------------------------------|
| `PT2EQuantizer` | torch.export graph    | executorch, dynamo       | int8-dynamic, int8-static                 |
|                 |                       | executorch, dynamo, onnx | a user's torchao PT2E `Quantizer`         |
| `NNCFQuantizer` | OpenVINO / ONNX model | openvino, onnx           | int8-static, int8-weights, int4-weights   |
|                 | torch.export graph    | dynamo                   | int8-weights, int4-weights                |
| `OrtQuantizer`  | ONNX model            | onnx                     | int8-dynamic, int8-static, int4-weights,  |
|                 |                       |                          | int8-weights (`MatMulNBits`)              |
| `TorchaoQuantizer` | torch.export graph | executorch               | int8-dynamic-int4-weights                 |

The CLI's `--quantize int4-weights` and `int8-weights` on ONNX are `OrtQuantizer`'s
(`MatMulNBits`, a kernel that reads the packed weights). NNCF's weight compression on ONNX stays
available from Python, but ONNX Runtime runs its `DequantizeLinear -> MatMul` weights dequantized
to fp32 on every call: smaller, not faster (see `OrtQuantizer` for the measurements).
"""

from .base import Calibration, ExportQuantizer
from .choice import QuantizationChoice
from .nncf import NNCFQuantizer
from .ort import OrtQuantizer
from .pt2e import PT2EQuantizer
from .torchao import TorchaoQuantizer

__all__ = ["ExportQuantizer", "Calibration", "PT2EQuantizer", "NNCFQuantizer", "OrtQuantizer", "TorchaoQuantizer",
           "QuantizationChoice", "quantizer_for"]

#: CLI names -> (quantizer class, scheme) per format.
CLI_SCHEMES = {
    "dynamo": {"int8-dynamic": (PT2EQuantizer, "int8-dynamic"), "int8-static": (PT2EQuantizer, "int8-static"),
               "int8-weights": (NNCFQuantizer, "int8-weights"), "int4-weights": (NNCFQuantizer, "int4-weights")},
    "executorch": {"int8-dynamic": (PT2EQuantizer, "int8-dynamic"), "int8-static": (PT2EQuantizer, "int8-static"),
                   "int8-dynamic-int4-weights": (TorchaoQuantizer, "int8-dynamic-int4-weights")},
    "onnx": {"int8-dynamic": (OrtQuantizer, "int8-dynamic"), "int8-static": (OrtQuantizer, "int8-static"),
             "int8-weights": (OrtQuantizer, "int8-weights"), "int4-weights": (OrtQuantizer, "int4-weights")},
    "openvino": {"int8-static": (NNCFQuantizer, "int8-static"), "int8-weights": (NNCFQuantizer, "int8-weights"),
                 "int4-weights": (NNCFQuantizer, "int4-weights")},
}


def quantizer_for(export_format: str, scheme: str, calibration: Calibration | None = None) -> ExportQuantizer:
    """The quantizer the CLI's `--quantize SCHEME` means for `export_format`."""
    options = CLI_SCHEMES.get(export_format, {})
    if scheme not in options:
        raise ValueError(f"--quantize {scheme} is not available for {export_format}; "
                         f"choose one of: {', '.join(options) or 'none'}")
    cls, name = options[scheme]
    return cls(name, calibration=calibration)
