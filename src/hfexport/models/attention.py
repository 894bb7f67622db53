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

from ..workarounds import register_patch

__all__ = ["patch_sdpa_symbolic_is_causal", "patch_transformers_sdpa_with_mask"]


@register_patch(
    ("dynamo", "onnx", "openvino", "executorch"),
    "torch.nn.functional.scaled_dot_product_attention",
    reason="transformers' sdpa_attention_forward passes a SymBool is_causal when the query length is "
    "symbolic with sample 1 (e.g. Qwen2-VL's decode, which has no mask); decide it at trace time; remove once transformers computes is_causal as a Python bool under torch.export",
    upstream="huggingface/transformers#46196 (its review left a SymBool is_causal under torch.export to exporters: "
    "the TODO in 5.24 integrations/sdpa_attention.py); SDPA's schema takes no SymBool: pytorch/pytorch#154038 (closed)",
    seen_with={"transformers": "5.24.0", "torch": "2.13.0"},
    remove_when="transformers>5.24.0",
)
def patch_sdpa_symbolic_is_causal(original: Callable[..., Any]) -> Callable[..., Any]:
    """SDPA that decides a symbolic `is_causal` at trace time."""
    def scaled_dot_product_attention(*args: Any, is_causal: Any = False, **kwargs: Any) -> torch.Tensor:
        if isinstance(is_causal, torch.SymBool):
            is_causal = bool(is_causal)
        return original(*args, is_causal=is_causal, **kwargs)

    return scaled_dot_product_attention


#: Stands for "causal, no mask": queries and keys of one length, nothing masked but the future.
_CAUSAL = object()
#: Stands for "no mask, not causal": every query attends every key (cross-attention, an encoder).
_UNMASKED = object()


def _repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    """transformers' `repeat_kv` (each key/value head repeated `groups` times) as an explicit
    copy: its `reshape` of an expanded tensor guards on the sequence length being 1 (a program
    traced at 3 tokens then refuses 1); the copy it makes anyway is taken first."""
    batch, heads, length, size = states.shape
    repeated = states[:, :, None].expand(batch, heads, groups, length, size)
    return repeated.clone(memory_format=torch.contiguous_format).view(batch, heads * groups, length, size)


@register_patch(
    ("dynamo", "onnx", "openvino", "executorch"),
    "transformers.modeling_utils.AttentionInterface._global_mapping",
    reason="transformers' sdpa_attention_forward branches on the query length (`q_length == 1` to pack "
    "grouped heads, `q_length > 1` for is_causal) even when a mask is given or the attention is not causal: "
    "a decode graph traced at 2 query tokens then guards on more than one (the static-cache loop's single-token "
    "steps are refused), and a one-graph Whisper's decoder refuses a single token through its cross-attention",
    upstream="not filed upstream (searched huggingface/transformers issues for 'sdpa_attention_forward q_length "
    "pack_gqa guard torch.export decode', none matches); transformers 5.24 integrations/sdpa_attention.py "
    "(pack_gqa and is_causal preamble)",
    seen_with={"transformers": "5.24.0", "torch": "2.13.0"},
    remove_when="transformers>5.24.0",
)
def patch_transformers_sdpa_with_mask(original: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The `"sdpa"` attention without branching on the query length, when a tensor mask is given
    (`is_causal=False`, as transformers decides it then), when there is no mask and as many keys
    as queries (`is_causal=True`), or no mask on a non-causal attention (`is_causal=False`):
    grouped heads repeated (or SDPA's `enable_gqa` where
    transformers would use it), the mask (and a position bias) passed to SDPA. In any other case
    transformers' own function runs."""
    sdpa = original["sdpa"]

    def sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                               is_causal=None, position_bias=None, **kwargs):
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        # Without a mask, over exactly as many keys as queries (a prompt on an empty cache, a
        # one-graph export), transformers' `is_causal = q_length > 1 and ...` only decides what
        # a single query computes either way; decided here, it guards no query length.
        # Without a mask and not causal (cross-attention, an encoder), `q_length > 1` is evaluated
        # only to be and-ed with False: it guarded a one-graph Whisper's decoder on more than one token.
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        same_length = statically_known_true(query.shape[2] == key.shape[2])
        if attention_mask is None and position_bias is None and not causal:
            attention_mask = _UNMASKED
        elif attention_mask is None and position_bias is None and same_length and causal:
            attention_mask, is_causal = _CAUSAL, True
        if not isinstance(attention_mask, torch.Tensor) and attention_mask not in (_CAUSAL, _UNMASKED) \
                or kwargs.get("softcap") is not None:
            return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=is_causal, position_bias=position_bias, **kwargs)
        from transformers.integrations import sdpa_attention as upstream

        mask = attention_mask if isinstance(attention_mask, torch.Tensor) else None
        options = {}
        groups = getattr(module, "num_key_value_groups", 1)
        if groups > 1 and upstream.use_gqa_in_sdpa(mask, key, value):
            options["enable_gqa"] = True
        elif groups > 1:
            key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
        if position_bias is not None:
            mask = upstream.create_position_bias_mask(position_bias, mask, False, query, key)
        output = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
            is_causal=attention_mask is _CAUSAL, **options)
        return output.transpose(1, 2).contiguous(), None

    return {**original, "sdpa": sdpa_attention_forward}
