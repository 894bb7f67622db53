"""`torch.matmul` of two batched 3-D tensors under `torch.export` with a dynamic batch.

# NOTE: torch 2.13's decomposition of `aten.matmul` (`torch/_decomp/decompositions.py`, `matmul`)
# reshapes each operand to `(batch, n, m)`. When an operand is an `expand` over the batch (every
# rotary embedding in transformers: `inv_freq[None, :, None].expand(batch, -1, 1) @ positions`)
# or a strided slice (Mamba's `dt_proj.weight @ time_step.transpose(1, 2)` after its x_proj
# split), whether that reshape is a view depends on the batch being 1, so the trace guards on it:
# traced at batch 1 the program's batch comes out bounded to 1..2, traced at 2 it refuses batch 1.
# The values never depend on that choice. `torch.bmm` takes the operands as they are, with no
# reshape to decide, so a 3-D @ 3-D (or 2-D @ 3-D) product of one batch traces without the guard.
# Every other case goes to `torch.matmul` unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..workarounds import register_patch

__all__ = ["patch_torch_matmul_batched", "patch_torch_linear_strided_input"]


def _same_size(a: Any, b: Any) -> bool:
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(a == b))


@register_patch(
    ("dynamo", "onnx", "openvino", "executorch"),
    "torch.matmul", "torch.Tensor.__matmul__",
    reason="the decomposition of aten.matmul guards on the batch being 1 when it reshapes an expanded or "
    "strided 3-D operand (every rotary embedding): a batch traced at 1 comes out bounded to 1..2; "
    "patch_torch_tensor_reshape also avoids that guard, by copying both operands (measured with torch 2.13), "
    "so this patch now saves those copies (bmm takes the operands as they are)",
    upstream="not filed upstream (searched pytorch/pytorch issues for 'matmul decomposition reshape expanded "
    "operand guard batch size 1', none matches); torch 2.13 _decomp/decompositions.py matmul (reshape of a "
    "batch-expanded operand)",
    seen_with={"torch": "2.13.0", "transformers": "5.24.0"},
    remove_when="torch>2.13.0",
)
def patch_torch_matmul_batched(original: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.matmul` / `@` that multiplies one batch of 3-D operands with `torch.bmm` (no reshape to decide)."""
    def matmul(input: Any, other: Any, *, out: Any = None) -> Any:
        if out is None and isinstance(input, torch.Tensor) and isinstance(other, torch.Tensor):
            if input.dim() == 3 and other.dim() == 3 and _same_size(input.shape[0], other.shape[0]):
                return torch.bmm(input, other)
            if input.dim() == 2 and other.dim() == 3:  # a weight times a batch of matrices
                return torch.bmm(input.expand(other.shape[0], *input.shape), other)
        return original(input, other) if out is None else original(input, other, out=out)  # `@` has no out

    return matmul


@register_patch(
    ("dynamo", "onnx", "openvino", "executorch"),
    "torch.nn.functional.linear",
    reason="a Linear with a bias on a strided slice (the LM head on `hidden_states[:, -1:]`, generate's "
    "logits_to_keep=1; Phi, GPT-J) has ATen's linear check the input's contiguity, which guards on the batch "
    "being 1: a prefill traced at batch 1 comes out bounded to 1..2 (without a bias the matmul path is "
    "patch_torch_tensor_reshape's)",
    upstream="not filed upstream (searched pytorch/pytorch issues for 'torch.export linear slice batch 1 guard' "
    "and 'is_contiguous_or_false guard backed size 1', none matches; related, for the Python contiguity check "
    "only: pytorch/pytorch#185084, which fixes #165032); torch 2.13 at::native::linear -> is_contiguous_or_false -> "
    "SymbolicShapeMeta::init_is_contiguous guards Eq(batch, 1) (TORCH_LOGS=+dynamic)",
    seen_with={"torch": "2.13.0", "transformers": "5.24.0"},
    remove_when="torch>2.13.0",
)
def patch_torch_linear_strided_input(original: Callable[..., Any]) -> Callable[..., Any]:
    """`F.linear` that copies a strided 3-D input first, so no contiguity check is guarded."""
    # read from torch 2.13: `is_contiguous_or_false` decides without a guard (False when unsure)
    from torch._prims_common import is_contiguous_or_false

    def linear(input: Any, weight: Any, bias: Any = None) -> Any:
        if isinstance(input, torch.Tensor) and input.dim() >= 3 and not is_contiguous_or_false(input):
            # a copy of the slice; `.contiguous()` would be elided here (size-oblivious, it looks contiguous)
            input = input.clone(memory_format=torch.contiguous_format)
        return original(input, weight, bias)

    return linear
