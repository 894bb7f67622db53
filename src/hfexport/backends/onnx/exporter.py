"""`OnnxExporter`: the captured `torch.export` program converted by torch.onnx (onnxscript)."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...capture.dynamic import grown_sample
from ...capture.prepare import model_name
from ...capture.record import ExportRecord
from ...capture.trace import Capture
from ...errors import ExportError, summarize
from ...exporter import HfExporter
from ...folder.manifest import FileBytes
from ...model_config import text_config
from ...timing import phase
from . import package  # noqa: F401  (registers the format's runtime packages)
from .artifact import HfOnnxProgram, write_onnx
from .cache_writes import fix_index_copy_transposes
from .config import OnnxConfig
from .decomposition import decomposed_for_onnx, onnx_registry, to_onnx_program
from .dims import fix_scalar_outputs, rename_symbolic_dims
from .fusions import fuse_for_ort, load_error
from .graph_interface import GRAPH_INTERFACE, GraphInterface
from .layer_stamp import TRACED_LAYERS, stamp_graph
from .loaded import OnnxModelFiles
from .runner import in_place_writers

__all__ = ["OnnxExporter"]

logger = logging.getLogger("hfexport")


class OnnxExporter(HfExporter):
    """Export to a `torch.onnx.ONNXProgram`, optimized by default.

    ```python
    onnx_program = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True))
    onnx_program.save("model.onnx")
    session = onnxruntime.InferenceSession("model.onnx")
    outputs = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    ```
    Inputs are named after the forward kwargs, outputs after the `ModelOutput` fields; cache
    tensors pair up as `input.cache.<layer>.<tensor>` / `output.cache.<layer>.<tensor>`.
    """

    format = "onnx"
    config_class = OnnxConfig
    extra = "onnx"
    fix_order = ()

    def _capture_sample(self, inputs: dict[str, Any], config: OnnxConfig) -> dict[str, Any]:
        # A one-token prompt is traced at two tokens. At one, the conversion lost a broadcast: BLOOM's
        # padding mask indexes `mask[batch_idx, kv_idx]` (transformers' create_causal_mask), and with
        # every index of size 1 an index reached the ONNX Concat without the Expand that broadcasts
        # it (torchlib's aten_index emits one; the converted graph had none), so the model refused 3
        # tokens in ONNX Runtime ("Non concat axis dimensions must match", the long fuzz run, seed
        # 206) while the Dynamo program took them. A decode step's one token stays 1.
        return grown_sample(inputs, config, batch=False)

    def _functionalize(self, program: torch.export.ExportedProgram, size_oblivious: bool,
                       config: OnnxConfig) -> torch.export.ExportedProgram:
        """Functionalized with torch.onnx's own decomposition, which the conversion then does not
        repeat: one retrace instead of two (`decomposition.py`), size-1 dimensions kept symbolic
        whatever `size_oblivious` says, as torch.onnx's retrace keeps them. FX fixes registered for
        ONNX then see the decomposed program (the built-in ones: none). Under an FX-graph quantizer
        the program is functionalized only: the quantizer annotates the ops torch.export wrote."""
        quantizer = config.quantizer
        if quantizer is not None and quantizer.stage_for(self.format) == "fx":
            return super()._functionalize(program, size_oblivious, config)
        return decomposed_for_onnx(program, onnx_registry(config.opset))

    def _convert(self, captured: Capture, record: ExportRecord, model: torch.nn.Module, inputs: dict[str, Any],
                 config: OnnxConfig) -> HfOnnxProgram:
        onnx_program = self._stamped_graph(captured, record, model, inputs, config)
        if onnx_program is None:
            onnx_program = self._converted_program(captured.program, record, model, inputs, config)
        _check_attention_asked(onnx_program.model, record, config, model)
        return HfOnnxProgram.wrap(onnx_program, external_data=config.external_data)

    def _converted_program(self, program: torch.export.ExportedProgram, record: ExportRecord, model: torch.nn.Module,
                           inputs: dict[str, Any], config: OnnxConfig, load_check: bool = True) -> Any:
        onnx_program = to_onnx_program(program, onnx_registry(config.opset),
                                       input_names=record.named_inputs(), output_names=record.named_outputs(),
                                       opset=config.opset, optimize=config.optimize)
        with phase("optimise"):  # hfexport's rewrites of torch.onnx's model (`stage_seconds["optimise"]`)
            return self._rewritten(onnx_program, record, model, inputs, config, load_check)

    def _stamped_graph(self, captured: Capture, record: ExportRecord, model: torch.nn.Module, inputs: dict[str, Any],
                       config: OnnxConfig) -> Any:
        """The graph of a stamped capture's first three layers, converted and optimised, with its
        third layer stamped for the rest (`layer_stamp.py`); None where it cannot be (the record's
        `layer_stamping` says why), and the whole program is converted."""
        layers = captured.stamped_layers
        if layers is None or layers.count <= TRACED_LAYERS:
            return None
        from ...capture.stamp import NotStampable

        entry = record.details.setdefault("layer_stamping", {})
        try:
            # the fusions' load check waits for the stamped graph: the weights are written once, to one file
            onnx_program = self._converted_program(layers.program(TRACED_LAYERS), record, model, inputs, config,
                                                   load_check=False)
            with phase("optimise"):
                line = stamp_graph(onnx_program.model, layers.model, layers.stack.path, layers.count)
                refused = load_error(onnx_program.model) if config.ort_fusions else None
            if refused:
                raise NotStampable(f"ONNX Runtime refused the stamped graph: {refused}")
        except NotStampable as error:
            entry["onnx"] = f"not stamped, the whole program converted: {str(error).splitlines()[0]}"
            logger.info("%s: %s", type(self).__name__, entry["onnx"])
            return None
        except Exception as error:  # noqa: BLE001 - a stamp bug costs the whole conversion's time, not the export
            entry["onnx"] = (f"not stamped, the whole program converted: the stamp failed ({type(error).__name__}: "
                             f"{summarize(error, 200)}): please report it")
            logger.warning("%s: %s", type(self).__name__, entry["onnx"])
            return None
        entry["onnx"] = line
        fusions = record.details.get("ort_fusions")
        if fusions and fusions.get("fused"):  # counted again on every layer
            ops = Counter(node.op_type for node in onnx_program.model.graph if node.domain in ("", "com.microsoft"))
            fusions["fused"] = {op: ops[op] for op in fusions["fused"]}
        return torch.onnx.ONNXProgram(onnx_program.model, captured.program)

    def _rewritten(self, onnx_program: Any, record: ExportRecord, model: torch.nn.Module, inputs: dict[str, Any],
                   config: OnnxConfig, load_check: bool = True) -> Any:
        """`onnx_program` with its dims named as the record's, ONNX Runtime's fusions (when asked)
        and the fixes its graph needs."""
        rename_symbolic_dims(onnx_program.model, [v.name for v in onnx_program.model.graph.inputs], record.input_shapes)
        fix_index_copy_transposes(onnx_program.model)
        if config.ort_fusions:
            fused, entry = fuse_for_ort(onnx_program.model, max_positions=_rotary_positions(model, inputs),
                                        group_query_attention=config.rewrites_attention, load_check=load_check)
            record.details["ort_fusions"] = entry
            interface = entry.get("group_query_attention", {}).get("interface")
            if interface:  # the graph takes GroupQueryAttention's inputs; the runner translates the record's
                record.details[GRAPH_INTERFACE] = interface
            onnx_program = torch.onnx.ONNXProgram(fused, onnx_program.exported_program)
        fix_scalar_outputs(onnx_program.model)
        return onnx_program

    def _record(self, record: ExportRecord, captured: Capture, artifact: HfOnnxProgram, config: OnnxConfig) -> None:
        graph = artifact.model.graph
        record.details["onnx_inputs"] = {v.name: [str(d) for d in v.shape.dims] for v in graph.inputs
                                         if v.shape is not None}
        record.details["onnx_outputs"] = {v.name: [str(d) for d in v.shape.dims] for v in graph.outputs
                                          if v.shape is not None}
        record.details["opset"] = config.opset
        cache_inputs = {v.name for v in graph.inputs if v.name.startswith("input.")}
        outputs = {v.name for v in graph.outputs}
        pairs = {name: "output." + name[len("input."):] for name in cache_inputs
                 if "output." + name[len("input."):] in outputs}
        # the cache inputs whose paired output is written in place (the runner binds one buffer to both)
        record.details["in_place_cache"] = sorted(name for name, ok in in_place_writers(graph, pairs).items() if ok)

    def _artifact_inputs(self, artifact: HfOnnxProgram, record: ExportRecord, leaves: list[torch.Tensor]) -> list[Any]:
        """`leaves` as the graph's inputs in its order: a GroupQueryAttention graph takes a 2-D mask
        and no write counters (`graph_interface.GraphInterface`), which a calibration feed must match."""
        interface = GraphInterface.of(record)
        if interface is None:
            return leaves
        graph_names = dict(zip(record.input_names, record.named_inputs()))
        fed = {graph_names[name]: value
               for name, value in interface.feed(dict(zip(record.input_names, leaves))).items()}
        return [torch.as_tensor(np.ascontiguousarray(fed[value.name])) for value in artifact.model.graph.inputs]

    def _write(self, artifact: HfOnnxProgram, stem: Path) -> list[Path]:
        return write_onnx(artifact, stem.with_suffix(".onnx"))

    def _load(self, files: list[FileBytes]) -> OnnxModelFiles:
        return OnnxModelFiles(files[0], files[1:])  # each external-data location one of `files`


def _rotary_positions(model: torch.nn.Module, inputs: dict[str, Any]) -> int | None:
    """Rows of GroupQueryAttention's rotary caches (positions it can rotate): the text model's
    `max_position_embeddings`, and at least twice a static cache's length (eager rotates any
    position; a cache longer than the config's positions is still served, and validation grows it);
    None without a config, which keeps the rotary outside GQA."""
    config = getattr(model, "config", None)
    text = text_config(config)
    value = getattr(text, "max_position_embeddings", None)
    if not isinstance(value, int) or value <= 0:
        return None
    layers = getattr(inputs.get("past_key_values"), "layers", None) or []
    lengths = [int(layer.keys.shape[-2]) for layer in layers if isinstance(getattr(layer, "keys", None), torch.Tensor)]
    return max([value, *(2 * n for n in lengths)])


def _check_attention_asked(graph_model: Any, record: ExportRecord, config: OnnxConfig, model: torch.nn.Module) -> None:
    """`OnnxConfig(group_query_attention=True)` is met or refused: a graph that takes a cache and
    kept its attention (the record's `ort_fusions` says why) raises. A graph without a cache (an
    encoder, one forward) has nothing the option applies to.

    Raises:
        ExportError: naming why the attention stayed as it was, and what to ask instead.
    """
    if config.group_query_attention is not True or record.details.get(GRAPH_INTERFACE):
        return
    if not any(value.name.startswith("input.cache.") for value in graph_model.graph.inputs):
        return
    fusions = record.details.get("ort_fusions") or {}
    why = ((fusions.get("group_query_attention") or {}).get("kept") or fusions.get("refused")
           or fusions.get("skipped") or "ONNX Runtime's fusions did not run")
    raise ExportError(
        f"OnnxConfig(group_query_attention=True) asks for ONNX Runtime's GroupQueryAttention, and this graph's "
        f"attention over its cache stays as it was: {why}",
        model=model_name(model),
        remedy="leave group_query_attention at None (an export folder then rewrites the attention where "
        "GroupQueryAttention applies and says why not elsewhere) or set it False; GroupQueryAttention takes a "
        "static cache (`--static-cache N`, GenerationConfig(cache_implementation='static'))",
    )
