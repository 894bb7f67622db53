"""transformers' linear-attention cache layer (Mamba2, Bamba, LFM2, Qwen3-Next, ...) under `torch.export`.

# NOTE: at the prefill, `LinearAttentionLayer.update_conv_state` left-pads the prompt's conv
# states to the kernel width only `if full_conv_states.shape[-1] < conv_kernel_size`: a Python
# branch on the prompt length. Traced on a prompt of at least `conv_kernel_size` tokens, the program
# is guarded on that (`input_ids.size()[1] >= 4`: Dynamo refuses a shorter prompt) and the
# runtimes that drop guards run the unpadded branch on a short prompt: ONNX Runtime returned a
# conv state of the prompt's length instead of the kernel's, a wrong answer. Every caller convolves
# what the method returns and keeps its last `seq_len` positions, as it does after a decode step,
# where the method returns the cached state followed by the new tokens. The patch returns the
# prefill's states the same way, after a zero state (what an empty cache holds), for any prompt
# length: one formula, no branch, the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..workarounds import register_patch

__all__ = ["patch_transformers_linear_attention_conv_state"]


@register_patch(
    ("dynamo", "onnx", "openvino", "executorch"),
    "transformers.cache_utils.LinearAttentionLayer.update_conv_state",
    reason="the prefill pads the conv states to the kernel width behind a Python `if` on the prompt length: a "
    "program traced on a long prompt guards on it (Mamba2 refuses a prompt shorter than its conv kernel) or, "
    "where guards are dropped (ONNX Runtime), returns a conv state of the wrong length; prepend a zero state "
    "instead, as after a decode step",
    upstream="not filed upstream (searched huggingface/transformers issues for 'update_conv_state prefill pad "
    "conv states torch.export', none matches; huggingface/transformers#48256 is another prefill conv-state "
    "bug); transformers 5.24 cache_utils.LinearAttentionLayer.update_conv_state (prefill padding branch)",
    seen_with={"transformers": "5.24.0", "torch": "2.13.0"},
    remove_when="transformers>5.24.0",
)
def patch_transformers_linear_attention_conv_state(original: Callable[..., Any]) -> Callable[..., Any]:
    """`update_conv_state` whose prefill prepends a zero state instead of padding behind a branch."""
    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size: int | None = None,
                          **kwargs: Any) -> torch.Tensor:
        prefill = not (self.is_conv_states_initialized[state_idx] and self.has_previous_state[state_idx])
        if self.record_past or not prefill:
            return original(self, conv_states, state_idx, conv_kernel_size, **kwargs)
        if not self.is_conv_states_initialized[state_idx]:
            self.lazy_initialization(conv_states=conv_states, state_idx=state_idx, conv_kernel_size=conv_kernel_size)
        kernel = self.conv_kernel_size[state_idx]
        full = torch.cat([conv_states.new_zeros(*conv_states.shape[:-1], kernel), conv_states], dim=-1)
        self.has_previous_state[state_idx] = True
        self.conv_states[state_idx].copy_(full[..., -kernel:])
        return full

    return update_conv_state
