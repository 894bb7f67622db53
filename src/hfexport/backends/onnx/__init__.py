"""The ONNX backend: the captured program converted by torch.onnx, run in ONNX Runtime.

`config.py` (`OnnxConfig`), `exporter.py` (`OnnxExporter`), `artifact.py` (`HfOnnxProgram`),
`runner.py` (`OnnxRunner`), `session_options.py` (the runner's session options and their override),
`patches.py`, and `dims.py` (the dimensions the graph declares),
`translations.py` (ATen ops torch.onnx does not translate), `fusions.py` (ONNX Runtime's fused
kernels). Importing this package imports no
ONNX package; the exporter, artifact and runner modules do.
"""

from .config import OnnxConfig

__all__ = ["OnnxConfig"]
