"""Patches and FX fixes for the OpenVINO backend.

Also registered for it: the shared `fix_cat_empty_legacy_input` (`hfexport/workarounds/fx_fixes.py`) and the
MoE experts switch (`hfexport/models/moe.py`).
"""

from ...workarounds import fx_fixes  # noqa: F401  (registers the shared FX fixes this backend needs)

import contextlib
import contextvars
from collections.abc import Iterator

import torch

from ...workarounds import register_patch


@register_patch(
    ("openvino",),
    "torch.nn.functional.scaled_dot_product_attention",
    reason="for a query row whose boolean mask is all False (a left-padded position) PyTorch's SDPA "
    "returns 0 while OpenVINO's translation returns NaN, and the NaN reaches every real token of "
    "that sequence through the next layer's attention (0 * NaN); make such rows attend to all keys "
    "and zero their output, which is exactly PyTorch's result; remove once OpenVINO's SDPA returns 0 for fully masked rows",
    upstream="openvinotoolkit/openvino#35959 (open: NaN for an all-False boolean SDPA mask; fix proposed in "
    "openvinotoolkit/openvino#36016, open)",
    seen_with={"openvino": "2026.4.1", "torch": "2.13.0"},
    remove_when="openvino>2026.4.1",
)
def patch_torch_sdpa_fully_masked_rows(original):
    """SDPA whose fully masked rows attend every key and come out zero, as PyTorch's do (only
    attend every key under `fully_masked_rows_left_unzeroed`)."""
    def scaled_dot_product_attention(query, key, value, attn_mask=None, *args, **kwargs):
        if attn_mask is None or attn_mask.dtype != torch.bool:
            return original(query, key, value, attn_mask, *args, **kwargs)
        has_key = attn_mask.any(dim=-1, keepdim=True)
        out = original(query, key, value, attn_mask | ~has_key, *args, **kwargs)
        if not _ZERO_FULLY_MASKED_ROWS.get():
            return out
        # NOTE: the row mask is expanded to the output's shape. Broadcast from [b, 1, q, 1], the
        # zeroing after the attention came out wrong in OpenVINO 2026.4.1's CPU plugin at head dim
        # 128 (and 256), right at 64 and below: every Llama with head dim 128 (Llama 2/3, Qwen,
        # Mistral) exported with wrong logits (max |diff| 1.2-3.9, cosine 0.3), while the same
        # graph without the zeroing, or with the mask expanded, matched eager to 1e-6
        # (`tests/backends/openvino/test_patches.py`).
        return out.masked_fill(~has_key.expand(out.shape), 0.0)

    return scaled_dot_product_attention


_ZERO_FULLY_MASKED_ROWS = contextvars.ContextVar("hfexport_openvino_zero_fully_masked_rows", default=True)


@contextlib.contextmanager
def fully_masked_rows_left_unzeroed() -> Iterator[None]:
    """While active, `patch_torch_sdpa_fully_masked_rows` leaves out its zeroing: a fully masked
    row (a left-padded position) attends every key and keeps that finite output.

    # NOTE: for the one stateful model OpenVINO GenAI runs (`genai.py`). Its paged-attention backend
    # (`ATTENTION_BACKEND=PA`) replaces each `ScaledDotProductAttention` and drops the model's
    # `attention_mask` input; the zeroing after SDPA reads that mask, so openvino-genai 2026.4.1
    # refused the model ("Model references undeclared parameters: attention_mask"). Without it, only
    # padded positions' outputs differ from PyTorch's (finite where PyTorch's are 0); no real token
    # attends a padded one, so real tokens' logits are unchanged (the vendor's IR behaves so too).
    """
    token = _ZERO_FULLY_MASKED_ROWS.set(False)
    try:
        yield
    finally:
        _ZERO_FULLY_MASKED_ROWS.reset(token)
