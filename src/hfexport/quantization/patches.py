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

