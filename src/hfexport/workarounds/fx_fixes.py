"""FX fixes shared by several backends, each written once and registered for those that need it.

A backend's `patches.py` imports this module, so a fix registers when its backend is used.
"""

from __future__ import annotations

import logging

import torch

from . import register_fx_node_fix

__all__ = ["fix_cat_empty_legacy_input"]

logger = logging.getLogger("hfexport")


def _is_legacy_empty(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 1 and value.shape[0] == 0


@register_fx_node_fix(
    ("openvino",),
    reason="transformers' DynamicLayer starts each cache as torch.tensor([]) and torch.cat's it with "
    "[b, h, s, d] states along dim -2; PyTorch skips such legacy empty 1-D inputs, OpenVINO's PyTorch "
    "frontend fails ('Axis -2 out of the tensor rank range [-1, 0]'). Drop the empty input.; remove once OpenVINO's aten.cat translation skips empty 1-D inputs",
    upstream="not filed upstream (searched openvinotoolkit/openvino issues for 'PyTorch frontend aten.cat empty "
    "tensor Axis -2 out of the tensor rank range', none matches); OpenVINO 2026.4.1 PyTorch FE aten.cat",
    seen_with={"openvino": "2026.4.1", "transformers": "5.24.0"},
    remove_when="openvino>2026.4.1",
)
def fix_cat_empty_legacy_input(node: torch.fx.Node) -> bool:
    """Match `aten.cat` → check an input is a 1-D empty tensor while the output has rank > 1 →
    rewrite the cat without it."""
    if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
        return False
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) or out.dim() <= 1:
        return False
    tensors = list(node.args[0])
    kept = [t for t in tensors if not (isinstance(t, torch.fx.Node) and _is_legacy_empty(t.meta.get("val")))]
    if len(kept) == len(tensors):
        return False
    if not kept:
        logger.debug("fix_cat_empty_legacy_input: %s has only empty inputs; left alone", node.name)
        return False
    node.args = (kept, *node.args[1:])
    return True
