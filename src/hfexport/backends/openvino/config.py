"""`OpenVINOConfig`: options of the OpenVINO backend."""

from __future__ import annotations

import dataclasses

from ...config import ExportConfig, _check_choice, _check_type

__all__ = ["OpenVINOConfig"]

INFERENCE_PRECISIONS = ("f32", "bf16", "f16", None)


@dataclasses.dataclass
class OpenVINOConfig(ExportConfig):
    """Export to an `openvino.Model` (save with `.save("model.xml")`, run with `compile_model`).

    Args:
        inference_precision: the precision the CPU plugin runs in, recorded in the model's
            `rt_info` so a plain `compile_model(model, "CPU")` honours it. `"f32"` (default) keeps
            eager's numbers on CPUs where the plugin would otherwise pick bf16; `None` leaves the
            plugin's default.
        compress_to_fp16: store weights as fp16 in the saved `.bin`.
    """

    export_format = "openvino"

    inference_precision: str | None = "f32"
    compress_to_fp16: bool = False

    def _validate(self) -> None:
        _check_choice("OpenVINOConfig", "inference_precision", self.inference_precision, INFERENCE_PRECISIONS)
        _check_type("OpenVINOConfig", "compress_to_fp16", self.compress_to_fp16, bool)
