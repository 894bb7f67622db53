"""`reshape` and `contiguous` under `torch.export` decide view-or-copy without a guard.

# NOTE: both ops return a view when the input's strides allow one and a copy otherwise, and
# torch 2.13 decides that on the symbolic sizes: ATen's `computeStride` (behind `reshape`) and
# `is_contiguous` (behind `contiguous`) compare strides such as `heads * head_dim` with
# `head_dim`, which holds only when the query length is 1, and the comparison becomes a guard.
# A multi-token decode traced at 2 tokens then refuses a single token (BLOOM's
# `query.reshape(batch * heads, -1, head_dim)` after a transpose; Gemma-2's eager attention,
# `attn_output.transpose(1, 2).contiguous()`, and its `query @ key^T` through `aten.matmul`'s
# decomposition), and a batch traced at 1 comes out bounded to 1..2 (Mamba2's scan). The values
# never depend on the choice: a copy is always a valid result of either op. So where the choice
# depends on a symbolic size (neither outcome is statically known), copy to a contiguous tensor
# first: the op then returns a view of the copy, with no guard. Where it is statically known, or
# the sizes are plain ints (eager PyTorch), the original op runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..workarounds import register_patch

__all__ = ["patch_torch_tensor_reshape", "patch_torch_tensor_flatten", "patch_torch_tensor_contiguous",
           "patch_torch_tensor_view_trailing_size", "view_is_possible"]

_ALL_BACKENDS = ("dynamo", "onnx", "openvino", "executorch")


class _Undecided(Exception):
    """A comparison that depends on the symbolic sizes' values."""


def _holds(condition: Any) -> bool:
    """`condition` decided without a guard: True or False when statically known, else `_Undecided`."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if isinstance(condition, bool):
        return condition
    if statically_known_true(condition):
        return True
    if statically_known_true(torch.sym_not(condition)):
        return False
    raise _Undecided


def view_is_possible(sizes: Sequence[Any], strides: Sequence[Any], shape: Sequence[Any]) -> bool | None:
    """Whether a tensor of `sizes`/`strides` can be viewed as `shape` (ATen's `computeStride`,
    `aten/src/ATen/TensorUtils.cpp`, read from torch 2.13), every comparison decided without a
    guard; `None` when the answer depends on the values of symbolic sizes."""
    try:
        if not sizes:
            return True
        view_d = len(shape) - 1
        chunk_base_stride = strides[-1]
        tensor_numel = view_numel = 1
        for tensor_d in range(len(sizes) - 1, -1, -1):
            tensor_numel = tensor_numel * sizes[tensor_d]
            chunk_ends = tensor_d == 0 or (
                _holds(sizes[tensor_d - 1] != 1)
                and _holds(strides[tensor_d - 1] != tensor_numel * chunk_base_stride))
            if not chunk_ends:
                continue
            while view_d >= 0 and (_holds(view_numel < tensor_numel) or _holds(shape[view_d] == 1)):
                view_numel = view_numel * shape[view_d]
                view_d -= 1
            if _holds(view_numel != tensor_numel):
                return False
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel = view_numel = 1
        return view_d == -1
    except _Undecided:
        return None


def _is_symbolic(tensor: torch.Tensor) -> bool:
    return any(isinstance(d, torch.SymInt) for d in (*tensor.shape, *tensor.stride()))


def _target_shape(tensor: torch.Tensor, shape: tuple[Any, ...]) -> list[Any] | None:
    """`reshape`'s shape argument with a `-1` resolved, or None when it cannot be read."""
    from torch._prims_common import infer_size

    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    try:
        return list(infer_size(shape, tensor.numel()))
    except Exception:  # noqa: BLE001 - a malformed shape: the original op raises its own error
        return None


def _reshape_without_guard(original: Callable[..., Any]) -> Callable[..., Any]:
    def reshape(self: torch.Tensor, *shape: Any) -> torch.Tensor:
        if isinstance(self, torch.Tensor) and _is_symbolic(self):
            target = _target_shape(self, shape)
            if target is not None and view_is_possible(list(self.shape), list(self.stride()), target) is None:
                self = self.clone(memory_format=torch.contiguous_format)
        return original(self, *shape)

    return reshape


@register_patch(
    _ALL_BACKENDS,
    "torch.Tensor.reshape", "torch.reshape",
    reason="reshape decides view-or-copy on the symbolic strides and guards the decision: a transposed "
    "query reshaped to (batch * heads, q, d) guards on q != 1 (BLOOM's attention, aten.matmul's decomposition "
    "of query @ key^T), so a multi-token decode refuses one token, and a batch traced at 1 comes out bounded "
    "to 1..2 (Mamba2); copy first where the choice depends on a symbolic size",
    upstream="not filed upstream (searched pytorch/pytorch issues for 'reshape guard symbolic strides "
    "computeStride view or copy' and 'backed_size_oblivious reshape transposed'; #124581 and #152972 cover "
    "unbacked sizes only); torch 2.13 aten/src/ATen/native/TensorShape.cpp reshape_symint -> computeStride "
    "(guards on symbolic strides)",
    seen_with={"torch": "2.13.0", "transformers": "5.24.0"},
    remove_when="torch>2.13.0",
)
def patch_torch_tensor_reshape(original: Callable[..., Any]) -> Callable[..., Any]:
    """`reshape` that copies first where view-or-copy depends on a symbolic size."""
    return _reshape_without_guard(original)


def _flattened(tensor: torch.Tensor, start_dim: int, end_dim: int) -> list[Any]:
    """`tensor`'s shape with dims `start_dim..end_dim` merged into one (what `flatten` views it as)."""
    rank = tensor.dim()
    start, end = start_dim % max(rank, 1), end_dim % max(rank, 1)
    sizes = list(tensor.shape)
    merged = 1
    for size in sizes[start:end + 1]:
        merged = merged * size
    return [*sizes[:start], merged, *sizes[end + 1:]]


@register_patch(
    _ALL_BACKENDS,
    "torch.Tensor.flatten", "torch.flatten",
    reason="flatten is a reshape inside ATen, so it guards the same view-or-copy decision: Falcon's "
    "`x.flatten(2, 3)` of its split heads guarded a one-graph export on more than one token; copy first where "
    "the choice depends on a symbolic size",
    upstream="not filed upstream (the same guard as patch_torch_tensor_reshape's, see there); torch 2.13 "
    "aten/src/ATen/native/TensorShape.cpp flatten -> reshape_symint -> computeStride",
    seen_with={"torch": "2.13.0", "transformers": "5.24.0"},
    remove_when="torch>2.13.0",
)
def patch_torch_tensor_flatten(original: Callable[..., Any]) -> Callable[..., Any]:
    """`flatten` that copies first where view-or-copy depends on a symbolic size."""
    def flatten(self: torch.Tensor, start_dim: int = 0, end_dim: int = -1, *args: Any) -> torch.Tensor:
        if isinstance(self, torch.Tensor) and not args and isinstance(start_dim, int) and isinstance(end_dim, int) \
                and self.dim() > 0 and _is_symbolic(self):
            if view_is_possible(list(self.shape), list(self.stride()), _flattened(self, start_dim, end_dim)) is None:
                self = self.clone(memory_format=torch.contiguous_format)
        return original(self, start_dim, end_dim, *args)

    return flatten


@register_patch(
    _ALL_BACKENDS,
    "torch.Tensor.contiguous",
    reason="contiguous() checks is_contiguous on the symbolic strides and guards it: transformers' "
    "attn_output.transpose(1, 2).contiguous() after an eager attention guards on the query length "
    "not being 1 (Gemma-2's multi-token decode refuses one token); copy where the check depends on a size",
    upstream="not filed upstream (searched pytorch/pytorch issues for 'contiguous is_contiguous guard symbolic "
    "size export'; pytorch/pytorch#185084, fixing #165032, changed the Python check_contiguous_sizes_strides "
    "only); torch 2.13 TensorImpl::is_contiguous on symbolic sizes (guards; the Python "
    "torch._prims_common.is_contiguous_or_false does not)",
    seen_with={"torch": "2.13.0", "transformers": "5.24.0"},
    remove_when="torch>2.13.0",
)
def patch_torch_tensor_contiguous(original: Callable[..., Any]) -> Callable[..., Any]:
    """`contiguous` that copies where contiguity depends on a symbolic size."""
    # read from torch 2.13: `is_contiguous_or_false` decides without a guard (False when unsure)
    from torch._prims_common import is_contiguous_or_false

    def contiguous(self: torch.Tensor, memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
        if memory_format is torch.contiguous_format and _is_symbolic(self) and not is_contiguous_or_false(self):
            return self.clone(memory_format=torch.contiguous_format)
        return original(self, memory_format=memory_format)

    return contiguous


def _trailing_size(tensor: torch.Tensor, shape: Sequence[Any]) -> list[Any] | None:
    """`shape` with a trailing `-1` replaced by the product of `tensor`'s trailing sizes, where
    the sizes before it are statically the product of `tensor`'s leading ones (`view(b, h, q, -1)`
    of a `(b * h, q, kv)` tensor: `kv`); None when no such split is known."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if len(shape) < 2 or not all(isinstance(d, (int, torch.SymInt)) for d in shape) or shape[-1] != -1 \
            or any(isinstance(d, int) and d < 0 for d in shape[:-1]):
        return None
    leading = 1
    for d in shape[:-1]:
        leading = leading * d
    sizes = list(tensor.shape)
    prefix = 1
    for split in range(len(sizes) + 1):
        if statically_known_true(prefix == leading):
            trailing = 1
            for d in sizes[split:]:
                trailing = trailing * d
            return [*shape[:-1], trailing]
        if split < len(sizes):
            prefix = prefix * sizes[split]
    return None


@register_patch(
    "executorch",
    "torch.Tensor.view",
    reason="a view's -1 is traced as numel // (product of the other sizes), which sympy leaves unsimplified "
    "((s**2)//s for BLOOM's attention view(batch, heads, q, -1)); ExecuTorch plans memory at the interval "
    "bound of that expression, 4096 x 4096 for 4096, so BLOOM's scores planned 8 TB. Where the sizes before "
    "the -1 are statically the tensor's leading ones, the -1 is given as the product of its trailing sizes",
    upstream="not filed upstream (searched the issues for 'executorch memory planning upper bound symbolic floordiv "
    "view -1': none matches; pytorch/executorch#264 introduced the range-analysis bound); torch 2.13 infer_size "
    "(numel // known) and executorch 1.4.1 memory planning "
    "(the upper bound of each size expression, evaluated by interval)",
    seen_with={"torch": "2.13.0", "executorch": "1.4.1", "transformers": "5.24.0"},
    remove_when="torch>2.13.0",
)
def patch_torch_tensor_view_trailing_size(original: Callable[..., Any]) -> Callable[..., Any]:
    """`view` whose trailing `-1` is the tensor's own trailing sizes where that is statically known."""
    def view(self: torch.Tensor, *shape: Any) -> torch.Tensor:
        if isinstance(self, torch.Tensor) and _is_symbolic(self):
            sizes = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
            resolved = _trailing_size(self, sizes)
            if resolved is not None:
                return original(self, resolved)
        return original(self, *shape)

    return view
