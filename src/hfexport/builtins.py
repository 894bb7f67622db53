"""The built-in extensions, registered in one place and in a stated order.

Importing this module (which `import hfexport` does) registers the four export formats and the
three quantizers by name: each entry says where its classes live, and nothing is imported until
one is used, so `import hfexport` stays free of torch and of every backend package.
`load_workarounds()` imports the modules that register the built-in patches and FX fixes, in
`WORKAROUND_MODULES` order; an export calls it before it applies them.
"""

from __future__ import annotations

import importlib

from .config import ExportFormat
from .extensions import FORMATS, QUANTIZERS, register_backend, register_quantizer

__all__ = ["WORKAROUND_MODULES", "load_workarounds"]

#: Each built-in format's class-name prefix (`OnnxConfig`, `OnnxExporter`, `OnnxRunner`) and the
#: `hfexport[extra]` that installs its packages.
_BUILTIN_FORMATS = {ExportFormat.DYNAMO: ("Dynamo", None), ExportFormat.ONNX: ("Onnx", "onnx"),
                    ExportFormat.EXECUTORCH: ("Executorch", "executorch"),
                    ExportFormat.OPENVINO: ("OpenVINO", "openvino")}

#: The modules whose import registers the built-in workarounds, in the order they load: FX fixes
#: shared by several formats, each format's own, then those of model families and of quantizers.
#: A workaround's place here never decides when it runs: an exporter applies its FX fixes in its
#: own `fix_order` and patches by name.
WORKAROUND_MODULES = (
    "hfexport.fx_fixes",
    "hfexport.backends.dynamo.patches",
    "hfexport.backends.onnx.patches",
    "hfexport.backends.executorch.patches",
    "hfexport.backends.openvino.patches",
    "hfexport.models.attention",
    "hfexport.models.batched_matmul",
    "hfexport.models.conv",
    "hfexport.models.view_or_copy",
    "hfexport.models.linear_attention",
    "hfexport.models.moe",
    "hfexport.models.qwen2_vl",
    "hfexport.models.static_cache",
    "hfexport.models.swin",
    "hfexport.quantization.patches",
)


def _register_formats() -> None:
    for fmt, (prefix, extra) in _BUILTIN_FORMATS.items():
        name = fmt.value
        if name in FORMATS:
            continue
        package = f"hfexport.backends.{name}"
        register_backend(name, f"{package}.config:{prefix}Config", f"{package}.exporter:{prefix}Exporter",
                         runner=f"{package}.runner:{prefix}Runner", extra=extra)


def _register_quantizers() -> None:
    for name, where in (("pt2e", "hfexport.quantization.pt2e:PT2EQuantizer"),
                        ("nncf", "hfexport.quantization.nncf:NNCFQuantizer"),
                        ("ort", "hfexport.quantization.ort:OrtQuantizer"),
                        ("onnxruntime", "hfexport.quantization.ort:OrtQuantizer"),  # its to_dict() name
                        ("torchao", "hfexport.quantization.torchao:TorchaoQuantizer")):
        if name not in QUANTIZERS:
            register_quantizer(name, where)


_loaded = False


def load_workarounds() -> None:
    """Import every module of `WORKAROUND_MODULES` (each registers its workarounds), once."""
    global _loaded
    if _loaded:
        return
    for module in WORKAROUND_MODULES:
        importlib.import_module(module)
    _loaded = True


_register_formats()
_register_quantizers()
