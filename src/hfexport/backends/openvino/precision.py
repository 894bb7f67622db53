"""Keep an fp32 export in fp32 under a plain `openvino.Core().compile_model(model, "CPU")`.

# NOTE: on processors with bf16 support the OpenVINO CPU plugin computes in bf16 unless the
# caller passes `INFERENCE_PRECISION_HINT` (measured: 2e-3 max abs difference on a tiny Llama,
# 0.39 on a real BERT). We record the precision the export wants in the model's
# `rt_info["runtime_options"]["INFERENCE_PRECISION_HINT"]`, but OpenVINO 2026.4.1's CPU plugin
# reads only KV-cache and dynamic-quantization options from there (`Config::applyRtInfo`), and
# the node attribute that would pin fp32 (`DisablePrecisionConversion`) cannot be set from Python.
# So when `OpenVINOExporter` is first used it wraps `openvino.Core.compile_model` once: a model
# carrying that rt_info entry, compiled without an explicit precision, gets the recorded one.
# Nothing changes for other models or when the caller passes a precision. A process that never
# imports hfexport must pass `{"INFERENCE_PRECISION_HINT": "f32"}` itself (`compile_config(model)`
# returns it).
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["PRECISION_RT_INFO", "KV_CACHE_RT_INFO", "recorded_precision", "recorded_options", "compile_config", "install_precision_hook"]

PRECISION_RT_INFO = ["runtime_options", "INFERENCE_PRECISION_HINT"]
#: read by the CPU plugin itself at compile time (`Config::applyRtInfo`, 2026.4.1)
KV_CACHE_RT_INFO = ["runtime_options", "KV_CACHE_PRECISION"]
_HINT = "INFERENCE_PRECISION_HINT"


def recorded_precision(model: Any) -> str | None:
    """The precision recorded in `model`'s rt_info by `OpenVINOExporter`, if any."""
    try:
        if model.has_rt_info(PRECISION_RT_INFO):
            return str(model.get_rt_info(PRECISION_RT_INFO).astype(str))
    except (AttributeError, RuntimeError, TypeError):
        return None
    return None


def recorded_options(model: Any) -> dict[str, str]:
    """The compile properties `model`'s rt_info records (`runtime_options`), by name."""
    out = {}
    for name in (PRECISION_RT_INFO[1], KV_CACHE_RT_INFO[1]):
        key = [PRECISION_RT_INFO[0], name]
        try:
            if model.has_rt_info(key):
                out[name] = str(model.get_rt_info(key).astype(str))
        except (AttributeError, RuntimeError, TypeError):
            continue
    return out


def compile_config(model: Any, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """`config` plus the recorded precision, unless `config` already sets one."""
    out = dict(config or {})
    precision = recorded_precision(model)
    if precision and _HINT not in out and not any(str(k) == _HINT for k in out):
        out[_HINT] = precision
    return out


def install_precision_hook() -> None:
    """Wrap `openvino.Core.compile_model` once so recorded precisions apply (see the module note)."""
    import openvino as ov

    original = ov.Core.compile_model
    if getattr(original, "_hfexport_precision_hook", False):
        return

    @functools.wraps(original)
    def compile_model(self, model, device_name=None, config=None, *args, **kwargs):
        if isinstance(model, ov.Model):
            config = compile_config(model, config) or None
        return original(self, model, device_name, config, *args, **kwargs)

    compile_model._hfexport_precision_hook = True
    ov.Core.compile_model = compile_model
