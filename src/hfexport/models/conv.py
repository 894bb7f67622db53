"""`conv2d` of a channels-last-strided input under `torch.export` with a dynamic batch.

# NOTE: ConvNext's blocks compute in `(N, H, W, C)` and permute back (`ConvNextLayerNorm` with
# `channels_first`, `ConvNextLayer`), so each depthwise conv is handed an `(N, C, H, W)` tensor
# with channels-last strides. torch 2.13's convolution decides the output's memory format from
# the input's strides (`suggest_memory_format`: `is_channels_last_strides_2d` skips the stride of a
# size-1 axis), which under `backed_size_oblivious` becomes a guard on the batch: `s0 <= 1`
# (TORCH_LOGS=+dynamic, `_subclasses/fake_impls.py` conv). Traced at batch 1 the program's batch
# came out bounded to 0..2; traced at 2 it refused batch 1. The values never depend on the memory
# format, so an input whose contiguity depends on a symbolic size is copied to a contiguous tensor
# first: the conv then decides nothing. Eager calls (plain int sizes) and contiguous inputs
# (every other vision model's) run the original op unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..workarounds import register_patch

__all__ = ["patch_conv2d_strided_input"]


@register_patch(
    ("dynamo", "onnx", "openvino"),
    "torch.nn.functional.conv2d",
    reason="a conv2d on a channels-last-strided input (ConvNext's permuted blocks) decides its output memory "
    "format on the strides, which guards on the batch being 1: a batch traced at 1 comes out bounded to 0..2, "
    "traced at 2 the program refuses batch 1; the input is copied to contiguous first where that is undecided. "
    "ExecuTorch traces at batch 2 and already takes batch 1 (coverage matrix), so its graph is left as it was",
    upstream="not filed upstream (searched the issues for 'torch.export conv2d channels_last guard batch size 1 "
    "backed_size_oblivious': none matches; pytorch/pytorch#63299 is channels-last with batch 0 in eager); torch 2.13 "
    "_subclasses/fake_impls.py conv -> aten convolution, its memory format decided on symbolic strides "
    "(guards s0 <= 1, TORCH_LOGS=+dynamic)",
    seen_with={"torch": "2.13.0", "transformers": "5.24.0"},
    remove_when="torch>2.13.0",
)
def patch_conv2d_strided_input(original: Callable[..., Any]) -> Callable[..., Any]:
    """`F.conv2d` that copies a symbolic input not known to be contiguous first."""
    # read from torch 2.13: `is_contiguous_or_false` decides without a guard (False when unsure)
    from torch._prims_common import is_contiguous_or_false

    def conv2d(input: Any, weight: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(input, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in input.shape) \
                and not is_contiguous_or_false(input):
            input = input.clone(memory_format=torch.contiguous_format)
        return original(input, weight, *args, **kwargs)

    return conv2d
