"""The built-in extensions, registered in one place and in a stated order.

Importing this module (which `import hfexport` does) registers the four export formats and the
three quantizers by name: each entry says where its classes live, and nothing is imported until
one is used, so `import hfexport` stays free of torch and of every backend package.
`load_workarounds(fmt)` imports the modules that register the built-in patches and FX fixes of a
format, in `WORKAROUND_MODULES` order; an export calls it before it applies them.
"""

from __future__ import annotations

import importlib

from .config import ExportFormat
from .extensions import FORMATS, QUANTIZERS, register_backend, register_quantizer

__all__ = ["WORKAROUND_MODULES", "load_workarounds", "workaround_modules"]

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
    "hfexport.workarounds.fx_fixes",
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


#: the modules of `WORKAROUND_MODULES` imported so far
_loaded: set[str] = set()


def workaround_modules(fmt: str | None = None) -> tuple[str, ...]:
    """The modules of `WORKAROUND_MODULES` that register `fmt`'s workarounds: the shared ones and
    `fmt`'s own backend's (each backend's `patches` registers for that backend only); every one
    when `fmt` is None."""
    return tuple(module for module in WORKAROUND_MODULES
                 if fmt is None or not module.startswith("hfexport.backends.") or module.split(".")[2] == fmt)


def load_workarounds(fmt: str | None = None) -> None:
    """Import the modules that register `fmt`'s workarounds (`workaround_modules`; every format's
    when None, for a listing), each once.

    # NOTE: why per format: a backend's patches resolve their targets in its runtime's package
    # when registered, and importing ExecuTorch's `exir` alone took ~2 s of an ONNX export of a
    # tiny Llama (`bench/RESULTS.md`, "Where export time goes") for patches it never applies.
    """
    for module in workaround_modules(fmt):
        if module not in _loaded:
            importlib.import_module(module)
            _loaded.add(module)


_register_formats()
_register_quantizers()
