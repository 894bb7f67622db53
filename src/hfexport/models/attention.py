"""transformers' SDPA integration under `torch.export` with dynamic shapes.

`sdpa_attention_forward` computes `is_causal = q_length > 1 and attention_mask is None and
is_causal`. With a symbolic `q_length` whose sample is 1 (a decode step traced with size-1
dimensions kept dynamic) Python's `and` returns its first falsy operand, the `SymBool` itself, and
`scaled_dot_product_attention` refuses it ("argument 'is_causal' must be bool, not SymBool").
transformers leaves this to exporters (the TODO above that line). The patch decides the SymBool
at trace time, which guards the query length to the sample's case (one token for a decode step
without a mask: the only case in which that graph is right) and keeps every other dimension,
batch included, dynamic. Without it the capture falls back to fixing every size-1 dimension.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..registry import register_patch

__all__ = ["patch_sdpa_symbolic_is_causal"]


@register_patch(
    ("dynamo", "onnx", "openvino", "executorch"),
    "torch.nn.functional.scaled_dot_product_attention",
    reason="transformers' sdpa_attention_forward passes a SymBool is_causal when the query length is "
    "symbolic with sample 1 (e.g. Qwen2-VL's decode, which has no mask); decide it at trace time",
    upstream="transformers: TODO in integrations/sdpa_attention.py (huggingface/transformers#46196 discussion)",
    seen_with={"transformers": "5.24.0", "torch": "2.13.0"},
    remove_when="transformers computes is_causal as a Python bool under torch.export",
)
def patch_sdpa_symbolic_is_causal(original: Callable[..., Any]) -> Callable[..., Any]:
    def scaled_dot_product_attention(*args: Any, is_causal: Any = False, **kwargs: Any) -> torch.Tensor:
        if isinstance(is_causal, torch.SymBool):
            is_causal = bool(is_causal)
        return original(*args, is_causal=is_causal, **kwargs)

    return scaled_dot_product_attention
