"""`OpenVINOExporter`: the captured `torch.export` program converted by OpenVINO's converter.

# NOTE: we convert the `torch.export` program directly (`openvino.convert_model(program)`) rather
# than going through ONNX: it keeps one trace for all backends, avoids a second conversion, and
# names follow the same scheme as ONNX (`input.cache.*` / `output.cache.*`).

# NOTE: the program's input shapes are handed to the converter (`input=`). On its own, openvino
# 2026.4.1 (`TorchFXPythonDecoder.from_exported_program(..., dynamic_shapes=True)`) declares
# every input dimension `?`, the batch of a static cache and a cache's heads included, so a
# caller could not size buffers from the model, nor could the plugin use the fixed sizes.
# Symbolic dimensions stay fully dynamic: the program's ranges are no contract (a size-1
# sequence traces with a lower bound of 2 yet runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...capture.capture import Capture
from ...exporter import HfExporter
from ...record import ExportRecord, record_from_program
from ..onnx.io_names import onnx_io_names
from .config import OpenVINOConfig

__all__ = ["OpenVINOExporter", "declared_shapes"]


def declared_shapes(program: torch.export.ExportedProgram) -> list[Any]:
    """Per user input, in order, the `openvino.PartialShape` the program declares: a size it fixes
    is static, a symbolic one dynamic (`?`)."""
    import openvino as ov

    return [ov.PartialShape([d if isinstance(d, int) else -1 for d in shape])
            for shape in record_from_program(program).input_shapes]


class OpenVINOExporter(HfExporter):
    """Export to an `openvino.Model` (with `.save(path)`).

    ```python
    ov_model = OpenVINOExporter().export(model, inputs, config=OpenVINOConfig(dynamic=True))
    ov_model.save("model.xml")
    compiled = openvino.Core().compile_model(ov_model, "CPU")
    outputs = compiled({k: v.numpy() for k, v in inputs.items()})
    ```
    An fp32 export records `INFERENCE_PRECISION_HINT=f32` in its `rt_info` and, in a process that
    used this exporter, a plain `compile_model` honours it (see `precision.py` for why a hook is
    needed); the CPU plugin would otherwise pick bf16 on processors that support it.
    """

    format = "openvino"
    config_class = OpenVINOConfig
    extra = "openvino"
    fix_order = ("fix_cat_empty_legacy_input",)
    drop_none_outputs = True  # the PyTorch frontend fails on a None output ("Tensor name is not a number")

    def _convert(self, captured: Capture, model: torch.nn.Module, inputs: dict[str, Any], config: OpenVINOConfig):
        import openvino as ov

        from .model import HfOpenVINOModel
        from .precision import PRECISION_RT_INFO, install_precision_hook

        install_precision_hook()

        program = captured.program
        ov_model = ov.convert_model(program, input=declared_shapes(program))
        input_names, output_names = onnx_io_names(program)
        for port, name in zip(ov_model.inputs, input_names):
            port.get_tensor().set_names({name})
        for port, name in zip(ov_model.outputs, output_names):
            port.get_tensor().set_names({name})
        if config.inference_precision is not None:
            ov_model.set_rt_info(config.inference_precision, PRECISION_RT_INFO)
        return HfOpenVINOModel.wrap(ov_model, compress_to_fp16=config.compress_to_fp16)

    def _record(self, captured: Capture, model, artifact, config: OpenVINOConfig) -> ExportRecord:
        record = super()._record(captured, model, artifact, config)
        record.details["openvino_inputs"] = {p.get_any_name(): str(p.get_partial_shape()) for p in artifact.inputs}
        record.details["inference_precision"] = config.inference_precision or "plugin default"
        return record

    def _save(self, artifact, stem: Path) -> list[Path]:
        return artifact.save(stem.with_suffix(".xml"))

    def _load(self, files: list[Path]):
        import openvino as ov

        from .precision import install_precision_hook

        install_precision_hook()  # the saved rt_info precision applies to compile_model again
        xml = next((f for f in files if f.suffix == ".xml"), files[0])
        return ov.Core().read_model(str(xml))
