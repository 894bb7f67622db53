"""`OpenVINOExporter`: the captured `torch.export` program converted by OpenVINO's converter.

# NOTE: we convert the `torch.export` program directly (`openvino.convert_model(program)`) rather
# than going through ONNX: it keeps one trace for all backends, avoids a second conversion, and
# names follow the same scheme as ONNX (`input.cache.*` / `output.cache.*`).

# NOTE: the program's input shapes are handed to the converter (`input=`). On its own, openvino
# 2026.4.1 (`TorchFXPythonDecoder.from_exported_program(..., dynamic_shapes=True)`) declares
# every input dimension `?`, the batch of a static cache and a cache's heads included, so a
# caller could not size buffers from the model, nor could the plugin use the fixed sizes.
# Symbolic dimensions stay fully dynamic: the program's ranges are no contract (a size-1
# sequence traces with a lower bound of 2 yet runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...capture.record import ExportRecord
from ...capture.trace import Capture
from ...exporter import HfExporter, checked_config
from ...folder.manifest import FileBytes
from . import package  # noqa: F401  (registers the format's runtime packages)
from .config import OpenVINOConfig

__all__ = ["OpenVINOExporter", "declared_shapes"]


def declared_shapes(record: ExportRecord) -> list[Any]:
    """Per input, in order, the `openvino.PartialShape` the program declares: a size it fixes is
    static, a symbolic one dynamic (`?`)."""
    import openvino as ov

    return [ov.PartialShape([d if isinstance(d, int) else -1 for d in shape]) for shape in record.input_shapes]


class OpenVINOExporter(HfExporter):
    """Export to an `openvino.Model` (with `.save(path)`).

    ```python
    ov_model = OpenVINOExporter().export(model, inputs, config=OpenVINOConfig(dynamic=True))
    ov_model.save("model.xml")
    compiled = openvino.Core().compile_model(ov_model, "CPU")
    outputs = compiled({k: v.numpy() for k, v in inputs.items()})
    ```
    An fp32 export records `INFERENCE_PRECISION_HINT=f32` in its `rt_info` and, in a process that
    used this exporter, a plain `compile_model` honours it (see `precision.py` for why a hook is
    needed); the CPU plugin would otherwise pick bf16 on processors that support it.
    """

    format = "openvino"
    config_class = OpenVINOConfig
    extra = "openvino"
    fix_order = ("fix_cat_empty_legacy_input",)
    drop_none_outputs = True  # the PyTorch frontend fails on a None output ("Tensor name is not a number")

    def export(self, model, inputs, config=None):
        """As every exporter exports (`HfExporter.export`); the one stateful model of OpenVINO
        GenAI's layout (`config.genai_layout`) is traced with fully masked attention rows left
        unzeroed (`patches.fully_masked_rows_left_unzeroed`)."""
        import contextlib

        from .patches import fully_masked_rows_left_unzeroed

        config = checked_config(self, config)
        with fully_masked_rows_left_unzeroed() if config.genai_layout else contextlib.nullcontext():
            return super().export(model, inputs, config)

    def _convert(self, captured: Capture, record: ExportRecord, model: torch.nn.Module, inputs: dict[str, Any],
                 config: OpenVINOConfig):
        import openvino as ov

        from .artifact import HfOpenVINOModel
        from .precision import KV_CACHE_RT_INFO, PRECISION_RT_INFO, install_precision_hook

        install_precision_hook()

        ov_model = ov.convert_model(captured.program, input=declared_shapes(record))
        for port, name in zip(ov_model.inputs, record.named_inputs()):
            port.get_tensor().set_names({name})
        for port, name in zip(ov_model.outputs, record.named_outputs()):
            port.get_tensor().set_names({name})
        if config.inference_precision is not None:
            ov_model.set_rt_info(config.inference_precision, PRECISION_RT_INFO)
        kv_cache = config.kv_cache_precision or config.inference_precision
        if kv_cache is not None:  # the CPU plugin reads this one from rt_info itself
            ov_model.set_rt_info(kv_cache, KV_CACHE_RT_INFO)
        return HfOpenVINOModel.wrap(ov_model, compress_to_fp16=config.compress_to_fp16)

    def _finish(self, artifact, record: ExportRecord, sample: dict[str, Any], config: OpenVINOConfig):
        """The cache as state (`stateful.py`), after quantization so that calibration feeds the cache;
        the one model of OpenVINO GenAI's layout returns float32 logits (`genai.float32_logits`)."""
        if config.genai_layout:
            from .genai import float32_logits

            widened = float32_logits(artifact)
            if widened:
                record.details["logits_widened"] = widened
        if config.stateful:
            import torch.utils._pytree as pytree

            from .stateful import make_stateful

            leaves = [leaf for leaf in pytree.tree_leaves(record.artifact_inputs(sample)) if isinstance(leaf, torch.Tensor)]
            # a static cache is written in place: a reset state is its zeros at the traced length
            written = bool(record.details.get("input_mutations"))
            sizes = {name: list(leaf.shape) for name, leaf in zip(record.input_names, leaves)} if written else {}
            state = make_stateful(artifact, sizes)
            if state is not None:
                # growing: each call appends its tokens to every variable (a dynamic cache's
                # key/value layers), which a reset empties
                grows = state.pop("grows")
                layout = "written in place" if written else "growing" if grows else "replaced"
                record.details["state"] = {"stateful": True, "layout": layout, **state}
                if config.max_cache_len is not None and layout == "growing":
                    record.details["state"]["max_cache_len"] = config.max_cache_len
        return artifact

    def plan_generation(self, model, inputs, config, generation_config=None, multi_token_decode=False):
        """One stateful model for prefill and decode, as OpenVINO GenAI runs it (`genai.py`), where
        `genai_layout` asks for it (an export folder plans it through `OpenVINORuntimePackage`);
        otherwise the seed's components."""
        from .genai import plan_genai_generation

        config = checked_config(self, config)
        if not config.genai_layout:
            return super().plan_generation(model, inputs, config, generation_config, multi_token_decode)
        return plan_genai_generation(model, inputs, config, generation_config, multi_token_decode)

    def _record(self, record: ExportRecord, captured: Capture, artifact, config: OpenVINOConfig) -> None:
        from .precision import recorded_options

        record.details["openvino_inputs"] = {p.get_any_name(): str(p.get_partial_shape()) for p in artifact.inputs}
        record.details["inference_precision"] = config.inference_precision or "plugin default"
        record.details["kv_cache_precision"] = config.kv_cache_precision or config.inference_precision or "plugin default"
        # what `compile_model(model, "CPU")` is given from the model's rt_info; a process without
        # hfexport passes them itself (the plugin's other defaults, measured best for batch-1
        # decode on 2 cores: PERFORMANCE_HINT=LATENCY, one stream, DYNAMIC_QUANTIZATION_GROUP_SIZE=32)
        record.details["compile_properties"] = recorded_options(artifact)

    def _write(self, artifact, stem: Path) -> list[Path]:
        from .artifact import write_openvino

        return write_openvino(artifact, stem.with_suffix(".xml"))

    def _load(self, files: list[FileBytes]):
        from .artifact import read_openvino
        from .precision import install_precision_hook

        install_precision_hook()  # the saved rt_info precision applies to compile_model again
        return read_openvino(files)
