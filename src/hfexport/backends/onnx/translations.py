"""Custom ATen → ONNX translations, passed to torch.onnx as its `custom_translation_table`."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["translation_table"]


def translation_table() -> dict[Callable, Callable]:
    """The table of translations for ops torch.onnx 2.13 does not convert."""
    import torch
    from onnxscript import BOOL, INT64
    from onnxscript import opset18 as op

    def is_all_true(self):
        # `torch._check_tensor_all(cond)` (transformers' `torch_compilable_check`, e.g. LLaVA's count
        # of image tokens) traces to `_is_all_true` feeding a runtime assert; torch.onnx has no
        # translation for it. ONNX has no asserts, so only the value is needed: all(cond).
        return op.Cast(op.ReduceMin(op.Cast(self, to=INT64.dtype), keepdims=0), to=BOOL.dtype)

    return {torch.ops.aten._is_all_true.default: is_all_true}
