"""`NNCFQuantizer`: NNCF post-training quantization and weight compression on the OpenVINO or
ONNX model, or on the `torch.export` graph."""

from __future__ import annotations

from typing import Any

import torch

from .base import ExportQuantizer

__all__ = ["NNCFQuantizer"]

_WEIGHT_MODES = {"int8-weights": "INT8_ASYM", "int4-weights": "INT4_SYM"}
#: int4 on every target: symmetric groups of 32, every linear layer int4 (`ratio=1.0`), the embeddings
#: and the head int8 per channel (NNCF's backup precision) -- llama.cpp Q4_0's layout. On OpenVINO it
#: was optimum-intel's (asymmetric groups of 128, `ratio=0.8`: the 20% of the linear weights with the
#: largest int4 error int8) until measured against llama.cpp Q4_0 on SmolLM2-135M-Instruct
#: (`bench/llama_cpp.py --ov-layouts --gate`, bench/RESULTS.md "OpenVINO int4: NNCF layouts and CPU
#: properties"): this layout decoded faster in 15 of 15 interleaved rounds through `GenerationRunner`
#: (1.04-1.34x) and 12 of 15 through `LLMPipeline` (0.94-1.47x; run 5, the least loaded: 1.07-1.28x),
#: with Q4_0's free-running agreement (first difference at the same tokens, "Paris" kept), 7.5% fewer
#: bytes, and the export's accuracy gate passed (sample prompt: agreement 0.78, mean step cosine 0.851;
#: chat prompts 0.66-0.77, 0.857-0.876, against the old layout's 0.72-0.80, 0.901-0.916: less margin,
#: ONNX int4's level). Groups of 64 or 128 at `ratio=1.0` decode faster still but the gate refuses them
#: (mean step cosine 0.711, 0.673 on the sample prompt), as it refused asymmetric groups of 128 at
#: `ratio=1.0` (0.7486). ONNX Runtime 1.32 refused NNCF 3.4's asymmetric groups of 128 on ONNX
#: ("MatMulNBits PrePack: zero_points initializer shape {256,2} does not match attribute-derived
#: shape"). Any of them can be passed (`mode=INT4_ASYM, group_size=128, ratio=0.8`: the old layout).
_INT4_DEFAULTS = {"mode": "INT4_SYM", "group_size": 32, "ratio": 1.0, "backup_mode": "INT8_ASYM"}
#: the `nncf.CompressWeightsMode`s each weight scheme stands for (a `mode=` outside them is refused)
_SCHEME_MODES = {
    "int8-weights": ("INT8_ASYM", "INT8_SYM"),
    "int4-weights": ("INT4_SYM", "INT4_ASYM", "NF4", "MXFP4", "FP4", "NVFP4", "CB4"),
}
#: weight-compression options that run the model on data: they need `calibration`
_DATA_AWARE = ("awq", "scale_estimation", "gptq", "lora_correction")


class NNCFQuantizer(ExportQuantizer):
    """NNCF on the converted model (OpenVINO, ONNX) or on the FX graph (`torch.export`).

    Schemes:
    - `"int8-static"`: `nncf.quantize` (int8 weights and activations, calibrated on `calibration`;
      `model_type="transformer"` keeps the attention softmax/layernorm paths in float and applies
      SmoothQuant, which moves activation outliers into the weights; `smooth_quant=False` turns it
      off: on a model without outliers it costs accuracy, measured on a random-init Llama: logits
      cosine 0.974 with it, 0.999 without);
    - `"int8-weights"`: `nncf.compress_weights`, int8 asymmetric per-channel weights;
    - `"int4-weights"`: int4 weights in llama.cpp Q4_0's layout: symmetric (`mode=INT4_SYM`),
      groups of 32 (`group_size`; a layer whose input size is not a multiple of it gets the largest
      group size that divides it), every linear layer int4 (`ratio=1.0`), the embeddings and the
      last layer int8 per channel (`backup_mode=INT8_ASYM`, NNCF's backup precision); on OpenVINO,
      ONNX and the torch.export graph alike (`_INT4_DEFAULTS` says why). Each is an option:
      `mode=INT4_ASYM`, `group_size=128`, `ratio=0.8` (optimum-intel's `--weight-format int4`,
      the 20% of the linear weights with the largest int4 error int8); `awq=True`/
      `scale_estimation=True` with `calibration` (or `dataset=`). The record's
      `quantization.nncf_settings` lists what NNCF was given.

    Any other keyword is one of NNCF's own parameters, passed to the function the scheme calls
    (`nncf.compress_weights` or `nncf.quantize`) as given; the valid names are that function's
    (`hfexport.quantization.nncf_options`), and an unknown one is an error naming them.

    On ONNX, NNCF writes the compressed weights as `DequantizeLinear -> MatMul`, which ONNX
    Runtime's CPU provider runs by dequantizing each weight to fp32 on every call: the model is
    smaller, not faster (int4 decode measured at 0.60x eager fp32 on a 134 MB Llama). For speed
    in ONNX Runtime use `OrtQuantizer("int4-weights")` (`MatMulNBits`), which the CLI's
    `--quantize int4-weights` is for ONNX.

    ```python
    config = OpenVINOConfig(dynamic=True, quantizer=NNCFQuantizer("int4-weights"))
    NNCFQuantizer("int4-weights", mode=nncf.CompressWeightsMode.INT4_ASYM, ratio=0.8, group_size=64)
    NNCFQuantizer(mode=nncf.CompressWeightsMode.INT8_SYM)              # the scheme follows the mode
    NNCFQuantizer("int4-weights", calibration=prompts, awq=True, scale_estimation=True)
    ```
    Options that run the model on data (`awq`, `scale_estimation`, `gptq`, `lora_correction`, a
    `sensitivity_metric` other than the weights' own error) need `calibration` (forward kwargs,
    mapped to the artifact's inputs as for `int8-static`); an `nncf.Dataset` passed as
    `dataset=` is handed to NNCF unchanged instead.
    """

    name = "nncf"
    stage = "model"
    formats = ("openvino", "onnx", "dynamo")
    schemes = ("int8-static", "int8-weights", "int4-weights")
    packages = ("nncf",)

    def __init__(self, scheme: str | None = None, calibration=None, *, group_size: int | None = None,
                 smooth_quant: bool = True, **nncf_options: Any):
        scheme = scheme if scheme is not None else _scheme_of(nncf_options.get("mode"))
        super().__init__(scheme, calibration)
        if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                       or (group_size <= 0 and group_size != -1)):
            raise ValueError(f"NNCFQuantizer: group_size={group_size!r} is not a group size; pass a positive int "
                             "(e.g. 32, 64, 128) or -1 for one group per channel")
        if scheme == "int8-weights" and group_size not in (None, -1):
            raise ValueError(f"NNCFQuantizer('int8-weights') is per-channel in NNCF (group_size={group_size} is "
                             "refused by nncf.compress_weights); drop group_size, or use 'int4-weights' for groups")
        from .nncf_options import check_options

        options = check_options(type(self).__name__, self.scheme, dict(nncf_options))
        if group_size is not None:
            options["group_size"] = group_size
        self._check_mode(options.get("mode"))
        dataset = options.get("dataset")
        if dataset is not None and not _is_nncf_dataset(dataset):
            if calibration is not None:
                raise ValueError("NNCFQuantizer: pass calibration= or dataset=, not both")
            self.calibration, options = dataset, {k: v for k, v in options.items() if k != "dataset"}
        self.options = options
        self.smooth_quant = smooth_quant

    @property
    def group_size(self) -> int | None:
        """The int4 group size set (else the default, `_INT4_DEFAULTS`), `None` for the other schemes."""
        return self.options.get("group_size")

    def _check_mode(self, mode: Any) -> None:
        if mode is None:
            return
        import nncf

        allowed = _SCHEME_MODES.get(self.scheme)
        if allowed is None:
            if not isinstance(mode, nncf.QuantizationMode):
                raise ValueError(f"NNCFQuantizer('int8-static'): mode= takes an nncf.QuantizationMode, got {mode!r}")
        elif not isinstance(mode, nncf.CompressWeightsMode) or mode.name not in allowed:
            raise ValueError(f"NNCFQuantizer({self.scheme!r}): mode={mode!r} is not one of this scheme's "
                             f"nncf.CompressWeightsMode: {', '.join(allowed)}; pick the scheme that matches the mode")

    @property
    def needs_calibration(self) -> bool:
        """A static scheme, or weight compression with an option that runs the model on data."""
        if self.scheme in self.static_schemes:
            return True
        if _is_nncf_dataset(self.options.get("dataset")):
            return False  # the caller's own dataset
        metric = self.options.get("sensitivity_metric")
        data_metric = metric is not None and getattr(metric, "name", metric) != "WEIGHT_QUANTIZATION_ERROR"
        return data_metric or any(self.options.get(name) for name in _DATA_AWARE)

    def check(self, export_format: str) -> None:
        """As `ExportQuantizer.check`, with the schemes NNCF supports on `export_format`."""
        super().check(export_format)
        from ..errors import QuantizationError

        if export_format == "dynamo" and self.scheme == "int8-static":
            raise QuantizationError("NNCFQuantizer('int8-static') on the torch.export graph is not wired yet",
                                    remedy="use PT2EQuantizer('int8-static') for torch.export, or NNCF's "
                                    "weight compression ('int8-weights', 'int4-weights')")
        if export_format == "dynamo" and (self.needs_calibration or "dataset" in self.options):
            raise QuantizationError("NNCFQuantizer: data-aware weight compression on the torch.export graph is not "
                                    "wired yet", remedy="export to openvino or onnx for awq/scale_estimation/gptq, "
                                    "or drop those options")

    def to_dict(self) -> dict[str, Any]:
        """As `ExportQuantizer.to_dict`, with NNCF's options as JSON holds them (enums by name)."""
        from .nncf_options import options_to_json

        out = {**super().to_dict(), "smooth_quant": self.smooth_quant, **options_to_json(self.options)}
        if self.group_size is not None:
            out["group_size"] = self.group_size
        return out

    def details(self) -> dict[str, Any]:
        """The weight-compression settings NNCF was last given, defaults included (`mode`,
        `group_size`, `ratio`, `backup_mode`), for the record."""
        return {"nncf_settings": self._settings} if getattr(self, "_settings", None) else {}

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.to_dict().items() if k not in ("quantizer", "scheme"))
        return f"{type(self).__name__}(scheme={self.scheme!r}{options})"

    def stage_for(self, export_format: str) -> str:
        """`"fx"` for the torch.export backend, `"model"` (the converted model) for ONNX and OpenVINO."""
        return "fx" if export_format == "dynamo" else "model"

    def _compress(self, model: Any, dataset: Any = None) -> Any:
        import nncf

        from .nncf_options import options_from_json, options_to_json

        options: dict[str, Any] = {"mode": getattr(nncf.CompressWeightsMode, _WEIGHT_MODES[self.scheme])}
        if self.scheme == "int4-weights":
            options.update({name: options_from_json(self.scheme, name, value) for name, value in _INT4_DEFAULTS.items()})
            if "advanced_parameters" not in self.options:
                options["advanced_parameters"] = nncf.AdvancedCompressionParameters(
                    group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST)
        options.update(self.options)
        self._settings = {k: v for k, v in options_to_json(options).items() if k != "advanced_parameters"}
        if dataset is not None and "dataset" not in options:
            options["dataset"] = dataset
        return nncf.compress_weights(model, **options)

    def quantize_program(self, module: torch.fx.GraphModule, samples: list[dict[str, Any]]) -> torch.nn.Module:
        """Compress the weights of the `torch.export` module with NNCF (weight-only schemes)."""
        return self._compress(module)

    def quantize_model(self, artifact: Any, samples: list[list[torch.Tensor]]) -> Any:
        """Compress or quantize the converted ONNX or OpenVINO model with NNCF."""
        import nncf

        from ..runner import to_numpy

        onnx_program = hasattr(artifact, "model_proto")
        model = artifact.model_proto if onnx_program else artifact
        if onnx_program:
            names = [i.name for i in model.graph.input]
            feeds = [{n: to_numpy(t) for n, t in zip(names, sample)} for sample in samples]
        else:
            feeds = [[to_numpy(t) for t in sample] for sample in samples]
        if self.scheme in _WEIGHT_MODES:
            quantized = self._compress(model, nncf.Dataset(feeds) if self.needs_calibration else None)
        else:
            options: dict[str, Any] = {"model_type": nncf.ModelType.TRANSFORMER, "subset_size": len(feeds)}
            if not self.smooth_quant:
                options["advanced_parameters"] = nncf.AdvancedQuantizationParameters(smooth_quant_alpha=-1)
            options.update(self.options)
            quantized = nncf.quantize(model, nncf.Dataset(feeds), **options)
        # the artifact's own class makes the quantized copy: quantization sits below the backends
        if onnx_program:
            return type(artifact).from_proto(quantized, artifact)
        return type(artifact).wrap(quantized, compress_to_fp16=getattr(artifact, "compress_to_fp16", False))


def _scheme_of(mode: Any) -> str:
    """The scheme an NNCF `mode` (enum or name) belongs to, when no scheme is named."""
    if mode is None:
        raise ValueError("NNCFQuantizer needs a scheme ('int8-static', 'int8-weights', 'int4-weights') or an NNCF mode=")
    name = getattr(mode, "name", mode)
    for scheme, modes in _SCHEME_MODES.items():
        if name in modes:
            return scheme
    if type(mode).__name__ == "QuantizationMode":
        return "int8-static"
    raise ValueError(f"NNCFQuantizer: mode={mode!r} belongs to no scheme; weight modes: "
                     f"{', '.join(m for modes in _SCHEME_MODES.values() for m in modes)}")


def _is_nncf_dataset(value: Any) -> bool:
    return type(value).__name__ == "Dataset" and type(value).__module__.startswith("nncf")
