"""The built-in backends, one folder each with the same files: `config.py`, `exporter.py`,
`artifact.py`, `runner.py`, `patches.py`, plus modules named for what they own.

`hfexport.builtins` registers them by name; importing this package imports no backend package.
"""

from .dynamo.config import DynamoConfig
from .executorch.config import ExecutorchConfig
from .onnx.config import OnnxConfig
from .openvino.config import OpenVINOConfig

__all__ = ["DynamoConfig", "OnnxConfig", "ExecutorchConfig", "OpenVINOConfig"]
