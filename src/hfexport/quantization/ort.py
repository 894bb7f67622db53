"""`OrtQuantizer`: ONNX Runtime's own dynamic and static int8 quantization of the ONNX model."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from .base import ExportQuantizer

__all__ = ["OrtQuantizer"]


class OrtQuantizer(ExportQuantizer):
    """int8 with `onnxruntime.quantization` on the exported ONNX model.

    Schemes: `"int8-dynamic"` (`quantize_dynamic`: int8 weights, activations at run time;
    MatMul/Gemm become `MatMulInteger`) and `"int8-static"` (`quantize_static`, QDQ format,
    per-channel weights, activations calibrated on `calibration`).

    ```python
    config = OnnxConfig(dynamic=True, quantizer=OrtQuantizer("int8-dynamic"))
    ```
    """

    name = "onnxruntime"
    stage = "model"
    formats = ("onnx",)
    schemes = ("int8-dynamic", "int8-static")
    packages = ("onnxruntime",)
    extra = "onnx"

    def quantize_model(self, artifact: Any, samples: list[list[torch.Tensor]]) -> Any:
        """Quantize the ONNX model with ONNX Runtime's quantization tools (dynamic or static, calibrated on `samples`)."""
        import onnx
        from onnxruntime import quantization as q

        from ..backends.onnx.artifact import HfOnnxProgram

        with tempfile.TemporaryDirectory(prefix="hfexport-ort-") as tmp:
            source, target = Path(tmp) / "model.onnx", Path(tmp) / "model.int8.onnx"
            onnx.save_model(artifact.model_proto, source)
            if self.scheme == "int8-dynamic":
                q.quantize_dynamic(source, target, weight_type=q.QuantType.QInt8, per_channel=True)
            else:
                names = [i.name for i in artifact.model_proto.graph.input]
                q.quantize_static(source, target, _reader(names, samples), quant_format=q.QuantFormat.QDQ,
                                  per_channel=True, weight_type=q.QuantType.QInt8,
                                  activation_type=q.QuantType.QInt8,
                                  extra_options={"ActivationSymmetric": True})
            quantized = onnx.load_model(target)
        return HfOnnxProgram.from_proto(quantized, artifact)


def _reader(names: list[str], samples: list[list[torch.Tensor]]):
    """An ORT `CalibrationDataReader` over flat samples, fed by the model's own input names."""
    from onnxruntime.quantization import CalibrationDataReader

    from ..runner import to_numpy

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{n: to_numpy(t) for n, t in zip(names, sample)} for sample in samples])

        def get_next(self):
            return next(self.feeds, None)

    return Reader()
