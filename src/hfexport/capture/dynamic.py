"""The dynamic-shapes plan handed to `torch.export.export`.

# NOTE: `dynamic=True` marks every dimension of every tensor leaf (cache leaves included) as
# `Dim.AUTO`. On its own that is not enough: `torch.export` specialises any dimension whose sample
# size is 0 or 1, so the usual batch-1 sample would give a program that rejects batch 3. We trace
# under `backed_size_oblivious`, which makes the tracer reason about size-1 dimensions as it does
# about any other size (a guard `s == 1` becomes a guard that holds for every size), rather than
# enlarging the sample inputs: there is no generic way to enlarge inputs whose sizes are tied to
# each other (a decode step's mask is one longer than its cache). When a model really branches
# on a size being 1, the capture falls back to a plain trace and says which dimension it fixed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["plan_dynamic_shapes", "size_oblivious_tracing", "grow_batch", "has_fixed_batch"]


#: `bounds(leaf name, axis, sample size) -> (min, max)` or None for an unbounded `Dim.AUTO`.
Bounds = Callable[[str, int, int], "tuple[int, int] | None"]


#: Roles whose size-1 sample means "one token per step": kept static, so a decode step stays a
#: single-token graph (SPEC R7) and attention code that branches on `q_len > 1` traces.
_STEP_ROLES = ("sequence", "decoder_sequence")

#: Roles whose size the model's weights fix (a flattened patch's `C*T*P*P` values, the 3 of a
#: `(t, h, w)` row, a recurrent state's channels and kernel/state width). Left `Dim.AUTO` they can
#: trace symbolic behind a `view(-1, ...)`, and every size derived from them is then unbounded
#: (ExecuTorch would plan memory for the worst case); a resized check would widen them.
_MODEL_FIXED_ROLES = ("patch_features", "grid", "state")


def has_fixed_batch(inputs: dict[str, Any]) -> bool:
    """Whether `inputs` carry a preallocated fixed-size cache (`StaticCache`): it is allocated for
    one batch size, so the graph keeps that batch static and its symbolic axes are the query and
    cache lengths (SPEC R8; the seed's ONNX loop sizes every symbolic cache axis as the cache length)."""
    from .pytree import is_static_cache

    return any(is_static_cache(value) for value in inputs.values())


def _auto_shape(tensor: torch.Tensor, name: str, bounds: Bounds | None, fixed_batch: bool) -> dict[int, Any] | None:
    from .names import role_of

    if tensor.dim() == 0:
        return None
    shape = {}
    for axis, size in enumerate(tensor.shape):
        role = role_of(name, tensor.dim(), axis)
        if (size == 1 and role in _STEP_ROLES or fixed_batch and (role == "batch" or axis == 0)
                or role in _MODEL_FIXED_ROLES):
            shape[axis] = torch.export.Dim.STATIC
            continue
        limit = bounds(name, axis, int(size)) if bounds else None
        shape[axis] = torch.export.Dim.AUTO(min=limit[0], max=limit[1]) if limit else torch.export.Dim.AUTO
    return shape


def _plan_for(value: Any, name: str, bounds: Bounds | None, fixed_batch: bool = False) -> Any:
    """Mirror `value`'s structure the way `torch.export` reads `dynamic_shapes` for it."""
    if isinstance(value, torch.Tensor):
        return _auto_shape(value, name, bounds, fixed_batch)
    node_type = type(value)
    if node_type in (list, tuple):
        return node_type(_plan_for(v, f"{name}.{i}", bounds, fixed_batch) for i, v in enumerate(value))
    if node_type is dict:
        return {k: _plan_for(v, f"{name}.{k}", bounds, fixed_batch) for k, v in value.items()}
    if node_type in pytree.SUPPORTED_NODES:  # custom nodes (caches, ModelOutput): a list of children
        # torch.export reads the dynamic shapes of a custom pytree node as the list of its children.
        from .names import CACHE_PREFIX
        from .pytree import _is_cache

        children, _ = pytree.SUPPORTED_NODES[node_type].flatten_fn(value)
        prefix = CACHE_PREFIX if _is_cache(value) else name
        return [_plan_for(child, f"{prefix}.{i}", bounds, fixed_batch) for i, child in enumerate(children)]
    return None


def plan_dynamic_shapes(inputs: dict[str, Any], *, dynamic: bool, dynamic_shapes: Any,
                        bounds: Bounds | None = None) -> Any:
    """Return the `dynamic_shapes` argument for `torch.export.export`.

    The capture traces a front whose signature is exactly the input names (see
    `capture.named_kwargs_forward`), so the plan is `{input name: shapes}`. Explicit
    `dynamic_shapes` keyed by input names (the seed's form) get `None` for inputs they do not
    name, which stay static.

    Args:
        inputs: the forward kwargs, already normalised.
        dynamic: mark every dimension of every tensor leaf `Dim.AUTO`.
        dynamic_shapes: explicit shapes from the user; their values pass through untouched.
        bounds: `(min, max)` for each `Dim.AUTO` (backends whose memory planning needs them).

    With a static cache among the inputs, the batch axis (axis 0 of every leaf) stays static.
    """
    if dynamic_shapes is not None:
        if isinstance(dynamic_shapes, dict) and set(dynamic_shapes) <= set(inputs):
            return {name: dynamic_shapes.get(name) for name in inputs}
        return dynamic_shapes
    if not dynamic:
        return None
    fixed_batch = has_fixed_batch(inputs)
    return {name: _plan_for(value, name, bounds, fixed_batch) for name, value in inputs.items()}


@contextlib.contextmanager
def size_oblivious_tracing(enabled: bool):
    """Trace with size-1 dimensions treated like any other size (see the module note)."""
    if not enabled:
        yield
        return
    from torch.fx.experimental import _config as fx_config

    with fx_config.patch(backed_size_oblivious=True):
        yield


def grow_batch(inputs: dict[str, Any], size: int = 2) -> dict[str, Any]:
    """Return `inputs` with every batch axis of sample size 1 repeated to `size`.

    Only leaves whose axis 0 is known to be the batch (`input_ids`, `attention_mask`,
    `pixel_values`, cache tensors, ...; see `names.role_of`) grow, together, so the relations
    between inputs hold. Used where size-oblivious tracing is not enough (ExecuTorch's edge passes
    bound a symbol whose sample size is 1 to at most 2).
    """
    from .names import role_of
    from .pytree import register_cache_pytree_nodes

    register_cache_pytree_nodes(inputs)  # a cache is grown through its pytree children

    def grow(name: str, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.dim() and value.shape[0] == 1 and role_of(name, value.dim(), 0) == "batch":
                return value.repeat(size, *([1] * (value.dim() - 1)))
            return value
        node_type = type(value)
        if node_type in pytree.SUPPORTED_NODES and node_type not in (list, tuple, dict):
            from .names import CACHE_PREFIX
            from .pytree import _is_cache

            children, context = pytree.SUPPORTED_NODES[node_type].flatten_fn(value)
            if _is_cache(value):
                names = [f"{CACHE_PREFIX}.{i}" for i in range(len(children))]
            else:  # a ModelOutput (`encoder_outputs`): its children by field name (`last_hidden_state`)
                keys = context if isinstance(context, (list, tuple)) and len(context) == len(children) else None
                names = [f"{name}.{keys[i] if keys else i}" for i in range(len(children))]
            grown = [grow(child_name, child) for child_name, child in zip(names, children)]
            return pytree.SUPPORTED_NODES[node_type].unflatten_fn(grown, context)
        return value

    return {name: grow(name, value) for name, value in inputs.items()}
