"""Qwen2-VL's vision tower under `torch.export`: the patch layout computed with tensor ops.

The tower takes a variable number of patches (`pixel_values` is `(N, C*T*P*P)`) and `grid_thw`,
one `(t, h, w)` row per image. In transformers 5.24 it derives two things from `grid_thw` on the
host: the rotary positions of each patch (`get_vision_position_ids`, a Python loop over
`grid_thw.tolist()`) and the attention segments (`cu_seqlens`, then `torch.split(...,
lengths.tolist())` with one SDPA call per frame). Both are data-dependent sizes, so `torch.export`
stops at the first `.tolist()`.

The same quantities have a closed form per patch index `i` (patches are laid out image by image,
frame by frame, in blocks of `merge x merge`), so the patches below compute them with comparisons,
integer division and gathers over `N` and the number of images, both ordinary dynamic dimensions:

- the tower's `forward` fills transformers' own precompute hooks (`position_ids` and `cu_seqlens`
  in `kwargs`, which `get_vision_position_ids` / `get_vision_attention_seqlens` pop) before calling
  the original;
- the attention runs once over all patches with a block-diagonal mask (patch `i` sees patch `j`
  iff they are in the same frame) instead of once per frame. Same result, one kernel.

The exported image encoder therefore takes what the eager one takes, `(pixel_values, grid_thw)`,
for any image size and any number of images.

# NOTE: the `cu_seqlens` the tower's patch hands on is "padded": `N + 1` entries, the real
# boundaries in patch order and `N` in place of every non-boundary. The patched attention reads
# boundaries by counting (`segment(i) = #{k >= 1 : cu_seqlens[k] <= i}`), which gives the same
# segments for the real (sorted, short) `cu_seqlens` and for the padded one; the original
# attention would not, so the two patches are registered together and only make sense together.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from ..workarounds import register_patch
from ..validation.inputs import register_resizer

__all__ = ["vision_patch_layout", "block_diagonal_mask"]

_MODULE = "transformers.models.qwen2_vl.modeling_qwen2_vl"
_SEEN_WITH = {"transformers": "5.24.0", "torch": "2.13.0"}


def vision_patch_layout(grid_thw: torch.Tensor, num_patches: int | torch.SymInt,
                        merge_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary positions and frame boundaries of every patch, as tensor ops over `grid_thw`.

    Args:
        grid_thw: `(num_images, 3)`: frames, patch rows, patch columns per image.
        num_patches: `N`, the patch count (`pixel_values.shape[0]`, i.e. `sum(t * h * w)`).
        merge_size: the tower's `spatial_merge_size`.

    Returns:
        `position_ids` `(N, 2)` (row, column of each patch, block-major as transformers lays them
        out) and the padded `cu_seqlens` `(N + 1,)` described in the module's note.
    """
    grid = grid_thw.to(torch.long)
    frames, rows, cols = grid[:, 0], grid[:, 1], grid[:, 2]
    per_image = frames * rows * cols
    image_end = per_image.cumsum(0)
    patch = torch.arange(num_patches, device=grid.device)
    image = (patch.unsqueeze(1) >= image_end.unsqueeze(0)).sum(1).clamp(max=grid.shape[0] - 1)
    local = patch - (image_end - per_image).gather(0, image)
    rows_i, cols_i = rows.gather(0, image), cols.gather(0, image)
    in_frame = local % (rows_i * cols_i)
    block, within = in_frame // (merge_size * merge_size), in_frame % (merge_size * merge_size)
    blocks_per_row = cols_i // merge_size
    row = (block // blocks_per_row) * merge_size + within // merge_size
    col = (block % blocks_per_row) * merge_size + within % merge_size
    position_ids = torch.stack([row, col], dim=-1)
    boundary = (in_frame == 0) & (patch > 0)
    ends = torch.where(boundary, patch, torch.full_like(patch, num_patches))
    cu_seqlens = torch.cat([torch.zeros_like(patch[:1]), ends])
    return position_ids, cu_seqlens


def block_diagonal_mask(cu_seqlens: torch.Tensor, num_patches: int | torch.SymInt,
                        dtype: torch.dtype) -> torch.Tensor:
    """An additive `(1, 1, N, N)` mask: 0 where two patches share a frame, the dtype's min elsewhere."""
    patch = torch.arange(num_patches, device=cu_seqlens.device)
    boundaries = cu_seqlens[1:].to(torch.long)
    segment = (patch.unsqueeze(1) >= boundaries.unsqueeze(0)).sum(1)
    same = segment.unsqueeze(0) == segment.unsqueeze(1)
    zero = torch.zeros((), dtype=dtype, device=cu_seqlens.device)
    return torch.where(same, zero, torch.finfo(dtype).min)[None, None]


@register_patch(
    ("dynamo", "onnx", "openvino", "executorch"),
    f"{_MODULE}.Qwen2VisionTransformerPretrainedModel.forward",
    reason="the vision tower computes rotary positions and attention segments from grid_thw.tolist() "
    "(data-dependent sizes under torch.export); compute them as tensor ops over the patch index and hand "
    "them to transformers' precompute hooks (kwargs position_ids / cu_seqlens); remove once transformers computes the Qwen2-VL vision layout without .tolist()",
    upstream="huggingface/transformers#45396 (merged) moved the layout into vision_utils helpers that loop over "
    "grid_thw.tolist() and take precomputed kwargs instead; no issue asks for a traceable layout (searched "
    "huggingface/transformers issues); the same export failure in 4.52's rot_pos_emb: pytorch/pytorch#158786 (closed)",
    seen_with=_SEEN_WITH,
    remove_when="transformers>5.24.0",
)
def patch_qwen2_vl_vision_layout(original: Callable[..., Any]) -> Callable[..., Any]:
    """Qwen2-VL's vision tower computing its patch layout from `grid_thw` in the graph (no `.tolist()`)."""
    def forward(self, hidden_states: torch.Tensor, grid_thw: torch.Tensor, **kwargs: Any) -> Any:
        if "position_ids" not in kwargs and "cu_seqlens" not in kwargs:
            kwargs["position_ids"], kwargs["cu_seqlens"] = vision_patch_layout(
                grid_thw, hidden_states.shape[0], self.spatial_merge_size)
        return original(self, hidden_states, grid_thw, **kwargs)

    return forward


@register_patch(
    ("dynamo", "onnx", "openvino", "executorch"),
    f"{_MODULE}.VisionAttention.forward",
    reason="the vision attention splits the patches per frame with torch.split(lengths.tolist()) "
    "(a data-dependent split under torch.export); attend once with a block-diagonal mask instead; remove once transformers' non-flash vision attention uses a mask instead of a Python-level split",
    upstream="not filed upstream (searched huggingface/transformers issues for 'Qwen2-VL VisionAttention "
    "torch.split lengths.tolist export', none matches); transformers 5.24 VisionAttention.forward splits by "
    "(cu_seqlens[1:] - cu_seqlens[:-1]).tolist() for non-flash attention",
    seen_with=_SEEN_WITH,
    remove_when="transformers>5.24.0",
)
def patch_qwen2_vl_vision_attention(original: Callable[..., Any]) -> Callable[..., Any]:
    """Qwen2-VL's vision attention with a block mask instead of a Python split per image."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.utils.generic import is_flash_attention_requested

    module = importlib.import_module(_MODULE)

    def forward(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                max_seqlen: int | None = None, **kwargs: Any) -> torch.Tensor:
        if is_flash_attention_requested(self.config):  # varlen kernels take cu_seqlens as they are
            return original(self, hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
        patches = hidden_states.shape[0]
        query, key, value = self.qkv(hidden_states).reshape(patches, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        cos, sin = position_embeddings
        query, key = module.apply_rotary_pos_emb_vision(query, key, cos, sin)
        query, key, value = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                          module.eager_attention_forward)
        output, _ = attention(self, query, key, value,
                              attention_mask=block_diagonal_mask(cu_seqlens, patches, query.dtype),
                              scaling=self.scaling, dropout=0.0, is_causal=False, **kwargs)
        return self.proj(output.reshape(patches, -1).contiguous())

    return forward


@register_patch(
    "executorch",
    f"{_MODULE}.PatchEmbed.forward",
    reason="the patch embedding is a Conv3d whose kernel equals its stride and its input (one patch "
    "each), which XNNPACK does not delegate and ExecuTorch's portable convolution (1D/2D only) cannot "
    "run; it is the same product as a Linear over the flattened patch; remove once ExecuTorch runs Conv3d (portable kernel or XNNPACK)",
    upstream="pytorch/executorch#11704 (open: the portable aten::convolution.out takes 3-D or 4-D input only; "
    "5-D support landed in pytorch/executorch#19977 and was reverted by #20888), seen 1.4.1",
    seen_with={"executorch": "1.4.1", "transformers": "5.24.0"},
    remove_when="executorch>1.4.1",
)
def patch_qwen2_vl_patch_embed(original: Callable[..., Any]) -> Callable[..., Any]:
    """Qwen2-VL's patch embedding as one linear layer over flattened patches (no Conv3d)."""
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight  # (embed, C, T, P, P), kernel == stride == one patch
        flat = hidden_states.reshape(-1, weight[0].numel()).to(weight.dtype)
        return torch.nn.functional.linear(flat, weight.reshape(weight.shape[0], -1), self.proj.bias)

    return forward



@register_resizer("Qwen2VisionTransformerPretrainedModel")
def resize_qwen2_vl_images(inputs: dict[str, Any], step: int) -> dict[str, Any]:
    """The tower's inputs with `step` more images, each a copy of the first image's patches and
    `(t, h, w)` row: the patch count must stay the sum of `t * h * w`, which a generic resize of
    every size cannot know."""
    grid, patches = inputs["grid_thw"], inputs["hidden_states"]
    first = int(grid[0].prod())
    return {**inputs, "grid_thw": torch.cat([grid, grid[:1].repeat(step, 1)]),
            "hidden_states": torch.cat([patches, patches[:first].repeat(step, 1)])}
