"""Swin under `torch.export`: the patch embedding's padding, independent of the sample's size.

Swin's patch embedding pads the image to a multiple of the patch size only `if width % patch != 0`,
a branch `torch.export` decides at the sample's size. With a 32 x 32 sample the program knows no
padding: torch.export guards `width % 4 == 0`, and ONNX Runtime, which cannot carry the guard,
gives silently wrong logits for a 34 x 34 image (the stride-4 convolution floors the patch grid to
the sample's 8 x 8 where eager pads to 9 x 9) and refuses a 30 x 30 one.

The patch pads by `patch - 1` on the right and bottom, always. The stride-`patch` convolution then
yields `ceil(side / patch)` patches and reads exactly the windows transformers' padding gives (the
extra zero columns lie past the last window), with no SymInt arithmetic, so every backend takes it.
Any image with the sample's patch grid now runs, whatever its sides.

# NOTE: what is left is shaped by the stage resolutions, i.e. by the patch grid: each layer crops
# its window padding only if it padded, patch merging pads odd sides only if one is odd, and the
# window clamp (`set_shift_and_window_size`) changes the computation for a stage no larger than the
# window. Making those branch-free too was tried (always pad/crop, crop into a fresh copy): the
# windows' `view(-1, ...)` over the padded, clamped sizes then left torch.export guards it could not
# simplify, and it narrowed the batch to 1 with ONNX giving wrong values at batch 2, so it is not
# done. A patch grid other than the sample's therefore fails loudly (a torch.export guard, a
# Reshape error in ONNX Runtime); it no longer runs with wrong numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..workarounds import register_patch

__all__: list[str] = []


@register_patch(
    ("dynamo", "onnx", "openvino", "executorch"),
    "transformers.models.swin.modeling_swin.SwinPatchEmbeddings.maybe_pad",
    reason="the image is padded to a multiple of the patch size only if a side is not one already, a branch "
    "decided at the sample size (ONNX then floors other sizes' patch grid: wrong logits); pad by patch - 1 "
    "always, which gives the convolution the same windows; remove once transformers pads Swin's patch embedding without a Python branch on the image size",
    upstream="not filed upstream (searched huggingface/transformers issues for 'Swin maybe_pad torch.export "
    "dynamic image size', none matches); transformers 5.24 SwinPatchEmbeddings.maybe_pad branches on "
    "width % patch_size",
    seen_with={"transformers": "5.24.0", "torch": "2.13.0"},
    remove_when="transformers>5.24.0",
)
def patch_swin_patch_embedding_pad(original: Callable[..., Any]) -> Callable[..., Any]:
    """Swin's patch embedding padding by `patch - 1` always, so no branch on the image size."""
    def maybe_pad(self, pixel_values: torch.Tensor, height: Any, width: Any) -> torch.Tensor:
        patch_h, patch_w = self.patch_size
        return F.pad(pixel_values, (0, patch_w - 1, 0, patch_h - 1))

    return maybe_pad


