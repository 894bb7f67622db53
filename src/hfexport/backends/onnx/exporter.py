"""`OnnxExporter`: the captured `torch.export` program converted by torch.onnx (onnxscript)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ...capture.capture import Capture
from ...exporter import HfExporter
from ...record import ExportRecord, record_from_program
from .config import OnnxConfig
from .io_names import fix_scalar_outputs, onnx_io_names, rename_symbolic_dims
from .program import HfOnnxProgram

__all__ = ["OnnxExporter"]

logger = logging.getLogger("hfexport")


class OnnxExporter(HfExporter):
    """Export to a `torch.onnx.ONNXProgram`, optimized by default.

    ```python
    onnx_program = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True))
    onnx_program.save("model.onnx")
    session = onnxruntime.InferenceSession("model.onnx")
    outputs = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    ```
    Inputs are named after the forward kwargs, outputs after the `ModelOutput` fields; cache
    tensors pair up as `input.cache.<layer>.<tensor>` / `output.cache.<layer>.<tensor>`.
    """

    format = "onnx"
    config_class = OnnxConfig
    extra = "onnx"
    fix_order = ()

    def _convert(self, captured: Capture, model: torch.nn.Module, inputs: dict[str, Any],
                 config: OnnxConfig) -> HfOnnxProgram:
        from .translations import translation_table

        program = captured.program
        input_names, output_names = onnx_io_names(program)
        onnx_program = torch.onnx.export(
            program,
            (),
            kwargs=inputs,
            dynamo=True,
            input_names=input_names,
            output_names=output_names,
            opset_version=config.opset,
            optimize=config.optimize,
            custom_translation_table=translation_table(),
            verbose=False,
            report=False,
        )
        shapes = record_from_program(program).input_shapes
        rename_symbolic_dims(onnx_program.model, [v.name for v in onnx_program.model.graph.inputs], shapes)
        fix_scalar_outputs(onnx_program.model)
        return HfOnnxProgram.wrap(onnx_program, external_data=config.external_data)

    def _record(self, captured: Capture, model, artifact: HfOnnxProgram, config: OnnxConfig) -> ExportRecord:
        record = super()._record(captured, model, artifact, config)
        graph = artifact.model.graph
        record.details["onnx_inputs"] = {v.name: [str(d) for d in v.shape.dims] for v in graph.inputs
                                         if v.shape is not None}
        record.details["onnx_outputs"] = {v.name: [str(d) for d in v.shape.dims] for v in graph.outputs
                                          if v.shape is not None}
        record.details["opset"] = config.opset
        return record

    def _save(self, artifact: HfOnnxProgram, stem: Path) -> list[Path]:
        return artifact.save(stem.with_suffix(".onnx"))

    def _load(self, files: list[Path]) -> Path:
        return files[0]  # ONNX Runtime opens the file itself (external weights beside it)
