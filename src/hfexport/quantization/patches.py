"""Workarounds the FX-graph quantizers need: swapped in only while one runs (`stage="quantize"`),
so an export without quantization imports nothing of executorch's quantizer or torchao."""

from __future__ import annotations

import torch

from ..workarounds import register_patch


@register_patch(
    ("executorch", "dynamo", "onnx", "openvino"),
    "executorch.backends.xnnpack.quantizer.xnnpack_quantizer._convert_scalars_to_attrs",
    reason="XNNPACKQuantizer lifts every scalar of aten.add/mul into a float32 buffer, so the integer "
    "`arange(n) + 0` of transformers' mask and position code turns float and prepare_pt2e's module fails "
    "with 'tensors used as indices must be long'; lifted scalars of integer nodes are put back",
    upstream="pytorch/executorch#22062 (closed; fixed on main after 1.4.1 by pytorch/executorch#22065, merged: "
    "the lifted constant takes the node's dtype)",
    seen_with={"executorch": "1.4.1", "torchao": "0.18.0"},
    remove_when="executorch>1.4.1",
    stage="quantize",
)
def patch_xnnpack_quantizer_integer_scalars(original):
    """XNNPACKQuantizer's scalar lifting with the scalars of integer nodes put back."""
    def _convert_scalars_to_attrs(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        model = original(model)
        for node in model.graph.nodes:
            value = node.meta.get("val")
            if node.op != "call_function" or not isinstance(value, torch.Tensor) or value.dtype.is_floating_point:
                continue
            args = list(node.args)
            for i, arg in enumerate(args):
                if getattr(arg, "op", None) == "get_attr" and str(arg.target).startswith("_tensor_constant_"):
                    args[i] = int(getattr(model, arg.target).item())
            node.args = tuple(args)
        model.graph.eliminate_dead_code()
        model.recompile()
        return model

    return _convert_scalars_to_attrs



@register_patch(
    ("executorch", "dynamo", "onnx", "openvino"),
    "torch.export._unlift._ok_to_generate_guards_fn",
    reason="ExportedProgram.module() leaves the program's guards (its `_guards_fn`: a size the model fixes "
    "or ties with a Python check, as Whisper's encoder takes exactly 2 * max_source_positions frames) out of "
    "the module when a caller's file path holds 'executorch' or 'torchao', which hfexport's ExecuTorch "
    "exporter's does; the quantizer's re-export of that module then made those sizes free (Whisper's frames "
    "symbolic: XNNPACK refused the conv, 'reshape only supports 1 dynamic dimension'; BERT's mask and ids "
    "lengths two symbols). The guards are kept while the quantizer runs; the re-export traces them",
    upstream="pytorch/pytorch#162532 (merged: the file-path rule, because ExecuTorch's passes cannot take the "
    "`_guards_fn` call module; hfexport's re-export traces it away before ExecuTorch sees the graph); "
    "pytorch/ao#2969 (open); torch 2.13 export/_unlift.py",
    seen_with={"torch": "2.13.0", "executorch": "1.4.1"},
    remove_when="torch>2.13.0",
    stage="quantize",
)
def patch_torch_export_guards_fn(original):
    """The program's guards kept in `ExportedProgram.module()` whoever calls it."""
    def _ok_to_generate_guards_fn() -> bool:
        return True

    return _ok_to_generate_guards_fn
