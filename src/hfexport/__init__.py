"""hfexport: export any Hugging Face transformers model to torch.export, ONNX, ExecuTorch and OpenVINO.

```python
from hfexport import DynamoExporter, DynamoConfig

exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
outputs = exported.module()(**inputs)
```

Importing `hfexport` loads no backend package (onnx, executorch, openvino, nncf), nor torch; each
is imported when its exporter is first used.
"""

from __future__ import annotations

# Registers the built-in export formats and quantizers by name (where their classes live;
# nothing is imported until one is used), so every registry is filled before anything asks it.
from . import builtins as _builtins  # noqa: F401
from .registry import lazy_names as _lazy_names

__version__ = "0.4.0"

_LAZY = {
    "HfExporter": "hfexport.exporter",
    "DynamoExporter": "hfexport.backends.dynamo.exporter",
    "OnnxExporter": "hfexport.backends.onnx.exporter",
    "ExecutorchExporter": "hfexport.backends.executorch.exporter",
    "OpenVINOExporter": "hfexport.backends.openvino.exporter",
    "ExportConfig": "hfexport.config",
    "ExportFormat": "hfexport.config",
    "DynamoConfig": "hfexport.backends.dynamo.config",
    "OnnxConfig": "hfexport.backends.onnx.config",
    "ExecutorchConfig": "hfexport.backends.executorch.config",
    "OpenVINOConfig": "hfexport.backends.openvino.config",
    "AutoExportConfig": "hfexport.auto",
    "AutoHfExporter": "hfexport.auto",
    "register_backend": "hfexport.extensions",
    "register_quantizer": "hfexport.extensions",
    "register_patch": "hfexport.workarounds",
    "register_fx_node_fix": "hfexport.workarounds",
    "register_fx_program_fix": "hfexport.workarounds",
    "export_to_folder": "hfexport.job",
    "ExportJobResult": "hfexport.job",
    "save_folder": "hfexport.folder.bundle",
    "FolderContents": "hfexport.folder.contents",
    "save_export": "hfexport.folder.bundle",
    "register_pytree_node": "hfexport.capture.pytree",
    "validate": "hfexport.validation.driver",
    "validate_components": "hfexport.validation.driver",
    "ValidationReport": "hfexport.validation.report",
    "record_of": "hfexport.capture.record",
    "ExportRecord": "hfexport.capture.record",
    "ExportError": "hfexport.errors",
    "PrepareError": "hfexport.errors",
    "TaskError": "hfexport.errors",
    "CaptureError": "hfexport.errors",
    "ConversionError": "hfexport.errors",
    "SerializationError": "hfexport.errors",
    "OutputFolderError": "hfexport.errors",
    "DtypeRefusedError": "hfexport.errors",
    "ExportFolderError": "hfexport.errors",
    "RuntimeLoadError": "hfexport.errors",
    "ValidationError": "hfexport.errors",
    "TESTED_VERSIONS": "hfexport._versions",
    "GenerationRunner": "hfexport.generation.loop",
    "GenerationResult": "hfexport.generation.result",
    "GenerationExport": "hfexport.folder.generation_export",
    "save_generation_export": "hfexport.folder.generation_export",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = _lazy_names(__name__, _LAZY)
