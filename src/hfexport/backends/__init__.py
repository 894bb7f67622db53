"""The built-in backends, registered by name; importing this loads no backend package."""

from ..registry import register_backend
from .dynamo.config import DynamoConfig
from .executorch.config import ExecutorchConfig
from .onnx.config import OnnxConfig
from .openvino.config import OpenVINOConfig

__all__ = ["DynamoConfig", "OnnxConfig", "ExecutorchConfig", "OpenVINOConfig"]


def _register(name: str, config_class: type, class_prefix: str, extra: str | None) -> None:
    module = f"hfexport.backends.{name}"
    register_backend(
        name,
        config_class,
        f"{module}.exporter:{class_prefix}Exporter",
        runner=f"{module}.runner:{class_prefix}Runner",
        extra=extra,
    )


_register("dynamo", DynamoConfig, "Dynamo", None)
_register("onnx", OnnxConfig, "Onnx", "onnx")
_register("executorch", ExecutorchConfig, "Executorch", "executorch")
_register("openvino", OpenVINOConfig, "OpenVINO", "openvino")
