"""`QuantizationChoice`: a quantization asked for in the ecosystem's words, mapped onto a quantizer.

Users come with optimum-intel's words (`--weight-format int4 --group-size 64 --ratio 0.8 --sym
--awq --scale-estimation`), optimum-executorch's (`--qlinear 8da4w --qembedding 8w`) or the
onnxruntime-genai builder's (`-p int4 --extra_options int4_block_size=32`). A choice names a
scheme (`scheme`, the CLI's `--quantize`) or a weight format (`weight_format`), and options; for
an export format it resolves to the quantizer that honours every option, each passed to that
quantizer's own parameter (`OrtQuantizer(block_size=, is_symmetric=)`, `NNCFQuantizer(group_size=,
ratio=, mode=INT4_SYM|INT4_ASYM, awq=, scale_estimation=)`, `TorchaoQuantizer(group_size=,
ratio=, embedding_bits=)`). An option the resolved quantizer cannot honour is a `ValueError`
naming the format or scheme that can; nothing is ignored.

# NOTE: options that no quantizer honours for a format are refused here, not passed on: the
# quantizers' constructors take NNCF's or ONNX Runtime's full parameter sets, so a misplaced
# option would otherwise reach the wrong function or be dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["QuantizationChoice", "WEIGHT_FORMATS", "EMBEDDING_WORDS"]

#: `--weight-format` word -> `--quantize` scheme per export format (`None`: no quantization; the
#: OpenVINO `fp16` word is the config's `compress_to_fp16`, weights stored as fp16)
WEIGHT_FORMATS: dict[str, dict[str, str | None]] = {
    "dynamo": {"fp32": None, "int8": "int8-weights", "int4": "int4-weights"},
    "onnx": {"fp32": None, "int8": "int8-weights", "int4": "int4-weights"},
    "openvino": {"fp32": None, "fp16": None, "int8": "int8-weights", "int4": "int4-weights"},
    "executorch": {"fp32": None, "8da4w": "int8-dynamic-int4-weights"},
}
#: `--qembedding` word (optimum-executorch's) -> bits of the token embedding's weights
EMBEDDING_WORDS = {"none": None, "8w": 8, "4w": 4}

#: option -> the (format, scheme) pairs whose quantizer honours it
_HONOURED: dict[str, tuple[tuple[str, str], ...]] = {
    "group_size": (("onnx", "int4-weights"), ("onnx", "int8-weights"), ("openvino", "int4-weights"),
                   ("dynamo", "int4-weights"), ("executorch", "int8-dynamic-int4-weights")),
    "ratio": (("openvino", "int4-weights"), ("dynamo", "int4-weights"), ("executorch", "int8-dynamic-int4-weights")),
    "sym": (("onnx", "int4-weights"), ("onnx", "int8-weights"), ("openvino", "int4-weights"),
            ("openvino", "int8-weights"), ("dynamo", "int4-weights"), ("dynamo", "int8-weights")),
    "embedding_bits": (("executorch", "int8-dynamic-int4-weights"),),
    "awq": (("openvino", "int4-weights"),),
    "scale_estimation": (("openvino", "int4-weights"),),
}
#: how each option is spelt on the command line, for the errors
_FLAGS = {"group_size": "--group-size", "ratio": "--ratio", "sym": "--sym/--asym", "embedding_bits": "--qembedding",
          "awq": "--awq", "scale_estimation": "--scale-estimation"}


@dataclasses.dataclass(frozen=True)
class QuantizationChoice:
    """A quantization in the ecosystem's words; `JobOptions(quantize=QuantizationChoice(...))`.

    Args:
        scheme: a `--quantize` scheme (`"int4-weights"`, `"int8-static"`, ...).
        weight_format: optimum's word instead (`"int4"`, `"int8"`, `"8da4w"`, `"fp32"`, `"fp16"` on
            OpenVINO; `WEIGHT_FORMATS`); with `scheme`, both must mean the same scheme.
        group_size: weights per int4 scale (ONNX Runtime's `block_size`, NNCF's and torchao's `group_size`).
        ratio: the share of linear weights at int4, the rest int8 (NNCF, and ExecuTorch's 8da4w).
        sym: symmetric (`True`) or asymmetric (`False`) weights; `None`: the quantizer's default.
        embedding_bits: quantize the token embedding to 8 or 4 bits (ExecuTorch's 8da4w).
        awq, scale_estimation: NNCF's data-aware int4 corrections (OpenVINO), run on the calibration prompts.
        calibration_data: a `.txt` (one prompt a line) or `.jsonl` (`"text"` or `"prompt"` per line)
            to calibrate on; default `calibration.DEFAULT_PROMPTS`.
        num_samples: the most prompts calibration takes.
    """

    scheme: str | None = None
    weight_format: str | None = None
    group_size: int | None = None
    ratio: float | None = None
    sym: bool | None = None
    embedding_bits: int | None = None
    awq: bool = False
    scale_estimation: bool = False
    calibration_data: str | None = None
    num_samples: int = 32

    def resolved_scheme(self, export_format: str) -> str | None:
        """The `--quantize` scheme this choice means on `export_format` (`None`: not quantized)."""
        if self.weight_format is None:
            return self.scheme
        words = WEIGHT_FORMATS.get(export_format, {})
        if self.weight_format not in words:
            able = [fmt for fmt, table in WEIGHT_FORMATS.items() if self.weight_format in table]
            raise ValueError(f"--weight-format {self.weight_format} is not available for --format {export_format} "
                             f"(it takes: {', '.join(words) or 'none'}); --weight-format {self.weight_format} is "
                             f"for --format {', '.join(able) or 'none'}")
        scheme = words[self.weight_format]
        if self.scheme is not None and self.scheme != scheme:
            raise ValueError(f"--quantize {self.scheme} and --weight-format {self.weight_format} mean different "
                             f"schemes on {export_format} ({self.weight_format} is {scheme or 'no quantization'}); "
                             "give one of them")
        return scheme

    def check(self, export_format: str) -> str | None:
        """Raise `ValueError` when an option cannot be honoured on `export_format`; return the scheme."""
        from . import CLI_SCHEMES

        scheme = self.resolved_scheme(export_format)
        if scheme is not None and scheme not in CLI_SCHEMES.get(export_format, {}):
            raise ValueError(f"--quantize {scheme} is not available for {export_format}; "
                             f"choose one of: {', '.join(CLI_SCHEMES.get(export_format, {})) or 'none'}")
        given = [_FLAGS[option] for option in _HONOURED if _is_set(option, getattr(self, option))]
        if scheme is None and given:
            raise ValueError(f"{', '.join(given)} say(s) how to quantize, but no quantization is asked; add "
                             "--weight-format or --quantize")
        for option in _HONOURED:
            if _is_set(option, getattr(self, option)) and (export_format, scheme) not in _HONOURED[option]:
                able = ", ".join(f"--format {f} with {_word(s)}" for f, s in _HONOURED[option])
                raise ValueError(f"{_FLAGS[option]} is not honoured by {_word(scheme)} on --format "
                                 f"{export_format}; it is by: {able}")
        if export_format == "executorch" and self.group_size is not None and self.group_size % 32:
            raise ValueError(f"--group-size {self.group_size}: XNNPACK delegates int4 groups of a multiple of 32 "
                             "(32, 64, 128)")
        if self.ratio is not None and not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"--ratio is the share of weights at int4, in [0, 1]; got {self.ratio}")
        if self.num_samples < 1:
            raise ValueError(f"--num-samples must be at least 1; got {self.num_samples}")
        if self.calibration_data is not None and not self._uses_data(scheme):
            raise ValueError(f"--calibration-data feeds static schemes (int8-static) and --awq/--scale-estimation; "
                             f"{_word(scheme) if scheme else 'no quantization'} runs on no data")
        return scheme

    def _uses_data(self, scheme: str | None) -> bool:
        return scheme == "int8-static" or self.awq or self.scale_estimation

    def quantizer(self, export_format: str) -> Any:
        """The quantizer for `export_format` with every option on its own parameter (no calibration
        data yet: the job gives them); `None` when the choice quantizes nothing."""
        from . import CLI_SCHEMES

        scheme = self.check(export_format)
        if scheme is None:
            return None
        cls, name = CLI_SCHEMES[export_format][scheme]
        return cls(name, **self._parameters(cls.__name__, scheme))

    def _parameters(self, quantizer: str, scheme: str) -> dict[str, Any]:
        """The options as `quantizer`'s keyword arguments (only those set)."""
        given: dict[str, Any] = {}
        if self.group_size is not None:
            given["block_size" if quantizer == "OrtQuantizer" else "group_size"] = self.group_size
        if self.ratio is not None:
            given["ratio"] = self.ratio
        if self.sym is not None:
            if quantizer == "OrtQuantizer":
                given["is_symmetric"] = self.sym
            else:
                given["mode"] = f"INT{4 if scheme == 'int4-weights' else 8}_{'SYM' if self.sym else 'ASYM'}"
        if self.embedding_bits is not None:
            given["embedding_bits"] = self.embedding_bits
        given.update({name: True for name in ("awq", "scale_estimation") if getattr(self, name)})
        return given

    def config_changes(self, export_format: str) -> dict[str, Any]:
        """What the format's config changes for this choice: OpenVINO's fp16 weights."""
        return {"compress_to_fp16": True} if export_format == "openvino" and self.weight_format == "fp16" else {}

    def to_dict(self, export_format: str) -> dict[str, Any]:
        """Every choice for the report: the scheme, the format word and each option (`None`: the default)."""
        return {"scheme": self.resolved_scheme(export_format), "weight_format": self.weight_format,
                "group_size": self.group_size, "ratio": self.ratio, "sym": self.sym,
                "embedding_bits": self.embedding_bits, "awq": self.awq, "scale_estimation": self.scale_estimation}


def _is_set(option: str, value: Any) -> bool:
    """Whether `option` was given (`sym=False` is: asymmetric; `awq=False` is the default)."""
    return value is not None and (value is not False or option == "sym")


def _word(scheme: str) -> str:
    return f"--quantize {scheme}"
