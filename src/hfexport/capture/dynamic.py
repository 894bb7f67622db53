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

__all__ = ["plan_dynamic_shapes", "size_oblivious_tracing", "grow_batch", "grown_sample", "has_fixed_batch",
           "shape_differences"]


#: `bounds(leaf name, axis, sample size, role) -> (min, max)` or None for an unbounded `Dim.AUTO`;
#: `role` is the axis's `names.role_of` (None where it has none), read from the leaf as traced.
Bounds = Callable[[str, int, int, "str | None"], "tuple[int, int] | None"]


#: Roles whose size-1 sample, in a decode step (a cache that holds tokens), means "one token per
#: step": kept static, so a decode step stays a single-token graph (without `multi_token_decode`). Anywhere else (a
#: one-token prompt) a size-1 sequence is as dynamic as any other size.
_STEP_ROLES = ("sequence", "decoder_sequence")

#: Roles whose size the model's weights fix (a flattened patch's `C*T*P*P` values, the 3 of a
#: `(t, h, w)` row, a recurrent state's channels and kernel/state width, a key/value cache's heads
#: and head size), and a 4-D mask's heads axis, 1 by construction and broadcast over the heads.
#: Left `Dim.AUTO` they can trace symbolic behind a `view(-1, ...)` or where their size is 1 (one
#: key/value head), and every size derived from them is then unbounded (ExecuTorch would plan
#: memory for the worst case); a resized check would widen them; a runner sizing a static cache
#: from the declared shapes took a symbolic heads axis for the cache length (the fuzzer's Phi-3
#: with one key/value head: refused on Dynamo, wrong logits on OpenVINO); a symbolic broadcast
#: axis fails to broadcast against the heads under size-oblivious tracing.
_MODEL_FIXED_ROLES = ("patch_features", "grid", "state", "broadcast", "heads", "head_dim")


def has_fixed_batch(inputs: dict[str, Any]) -> bool:
    """Whether `inputs` carry a preallocated fixed-size cache (`StaticCache`): it is allocated for
    one batch size, so the graph keeps that batch static and its symbolic axes are the query and
    cache lengths (examples/decode_loop_onnxruntime.py sizes every symbolic cache axis as the cache length)."""
    from .pytree import is_static_cache

    return any(is_static_cache(value) for value in inputs.values())


def is_decode_step(inputs: dict[str, Any]) -> bool:
    """Whether `inputs` carry a cache that already holds tokens (a decode step, not a prompt): a
    static cache whose write counter has moved, any other cache with non-empty tensors."""
    from .pytree import is_cache_object, is_static_cache

    def holds_tokens(cache: Any) -> bool:
        if is_static_cache(cache):  # allocated buffers hold zeros before the first token
            return any(int(getattr(layer, "cumulative_length", 0)) > 0 for layer in cache.layers)
        return any(isinstance(leaf, torch.Tensor) and leaf.numel() > 1 for leaf in pytree.tree_leaves(cache))

    return any(is_cache_object(value) and holds_tokens(value) for value in inputs.values())


def _auto_shape(tensor: torch.Tensor, name: str, bounds: Bounds | None, fixed_batch: bool,
                decode_step: bool = True) -> dict[int, Any] | None:
    from .names import role_of

    if tensor.dim() == 0:
        return None
    shape = {}
    for axis, size in enumerate(tensor.shape):
        role = role_of(name, tensor.dim(), axis)
        # an encoder-decoder's decoder always starts from one token (its prefill too): static at 1
        one_step = size == 1 and (role == "decoder_sequence" or decode_step and role in _STEP_ROLES)
        if one_step or fixed_batch and (role == "batch" or axis == 0) or role in _MODEL_FIXED_ROLES:
            shape[axis] = torch.export.Dim.STATIC
            continue
        limit = bounds(name, axis, int(size), role) if bounds else None
        shape[axis] = torch.export.Dim.AUTO(min=limit[0], max=limit[1]) if limit else torch.export.Dim.AUTO
    return shape


def _plan_for(value: Any, name: str, bounds: Bounds | None, fixed_batch: bool = False, decode_step: bool = True) -> Any:
    """Mirror `value`'s structure the way `torch.export` reads `dynamic_shapes` for it."""
    if isinstance(value, torch.Tensor):
        return _auto_shape(value, name, bounds, fixed_batch, decode_step)
    node_type = type(value)
    if node_type in (list, tuple):
        return node_type(_plan_for(v, f"{name}.{i}", bounds, fixed_batch, decode_step) for i, v in enumerate(value))
    if node_type is dict:
        return {k: _plan_for(v, f"{name}.{k}", bounds, fixed_batch, decode_step) for k, v in value.items()}
    if node_type in pytree.SUPPORTED_NODES:  # custom nodes (caches, ModelOutput): a list of children
        # torch.export reads the dynamic shapes of a custom pytree node as the list of its children.
        from .names import CACHE_PREFIX
        from .pytree import is_cache_object

        children, _ = pytree.SUPPORTED_NODES[node_type].flatten_fn(value)
        prefix = CACHE_PREFIX if is_cache_object(value) else name
        return [_plan_for(child, f"{prefix}.{i}", bounds, fixed_batch, decode_step) for i, child in enumerate(children)]
    return None


def plan_dynamic_shapes(inputs: dict[str, Any], *, dynamic: bool, dynamic_shapes: Any,
                        bounds: Bounds | None = None) -> Any:
    """Return the `dynamic_shapes` argument for `torch.export.export`.

    The capture traces a front whose signature is exactly the input names (see
    `capture.named_kwargs_forward`), so the plan is `{input name: shapes}`. Explicit
    `dynamic_shapes` keyed by input names (torch.export's form) get `None` for inputs they do not
    name, which stay static.

    Args:
        inputs: the forward kwargs, already normalised.
        dynamic: mark every dimension of every tensor leaf `Dim.AUTO`.
        dynamic_shapes: explicit shapes from the user; their values pass through untouched.
        bounds: `(min, max)` for each `Dim.AUTO` (backends whose memory planning needs them).

    With a static cache among the inputs, the batch axis (axis 0 of every leaf) stays static.
    """
    if dynamic_shapes is not None:
        if isinstance(dynamic_shapes, dict):
            check_dynamic_shapes_keys(dynamic_shapes, inputs)
            return {name: dynamic_shapes.get(name) for name in inputs}
        return dynamic_shapes
    if not dynamic:
        return None
    fixed_batch = has_fixed_batch(inputs)
    decode_step = is_decode_step(inputs)
    return {name: _plan_for(value, name, bounds, fixed_batch, decode_step) for name, value in inputs.items()}


def check_dynamic_shapes_keys(dynamic_shapes: dict[str, Any], inputs: dict[str, Any]) -> None:
    """Raise `PrepareError` naming every key of `dynamic_shapes` that is not an input (a typo, or
    an input of another model), with the inputs listed. Inputs it leaves out stay static."""
    from ..errors import PrepareError

    unknown = [key for key in dynamic_shapes if key not in inputs]
    if unknown:
        raise PrepareError(
            f"dynamic_shapes names {', '.join(map(repr, unknown))}, which {'is' if len(unknown) == 1 else 'are'} "
            f"not among the inputs: {', '.join(inputs)}",
            remedy="key dynamic_shapes by the input names above (inputs you leave out stay static)",
        )


@contextlib.contextmanager
def size_oblivious_tracing(enabled: bool):
    """Trace with size-1 dimensions treated like any other size (see the module note)."""
    if not enabled:
        yield
        return
    from torch.fx.experimental import _config as fx_config

    with fx_config.patch(backed_size_oblivious=True):
        yield


def grow_batch(inputs: dict[str, Any], size: int = 2, roles: tuple[str, ...] = ("batch",)) -> dict[str, Any]:
    """Return `inputs` with every axis of sample size 1 whose role is in `roles` repeated to `size`.

    Only leaves whose axes' roles are known (`input_ids`, `attention_mask`, `pixel_values`, cache
    tensors, ...; see `names.role_of`) grow, together, so the relations between inputs hold. Used
    where size-oblivious tracing is not enough (ExecuTorch's edge passes bound a symbol whose
    sample size is 1 to at most 2).
    """
    from .names import role_of
    from .pytree import register_cache_pytree_nodes

    register_cache_pytree_nodes(inputs)  # a cache is grown through its pytree children

    def grow(name: str, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            repeats = [size if value.shape[axis] == 1 and role_of(name, value.dim(), axis) in roles else 1
                       for axis in range(value.dim())]
            return value.repeat(*repeats) if size in repeats else value
        node_type = type(value)
        if node_type in pytree.SUPPORTED_NODES and node_type not in (list, tuple, dict):
            from .names import CACHE_PREFIX
            from .pytree import is_cache_object

            children, context = pytree.SUPPORTED_NODES[node_type].flatten_fn(value)
            if is_cache_object(value):
                names = [f"{CACHE_PREFIX}.{i}" for i in range(len(children))]
            else:  # a ModelOutput (`encoder_outputs`): its children by field name (`last_hidden_state`)
                keys = context if isinstance(context, (list, tuple)) and len(context) == len(children) else None
                names = [f"{name}.{keys[i] if keys else i}" for i in range(len(children))]
            grown = [grow(child_name, child) for child_name, child in zip(names, children)]
            return pytree.SUPPORTED_NODES[node_type].unflatten_fn(grown, context)
        return value

    return {name: grow(name, value) for name, value in inputs.items()}


def grown_sample(inputs: dict[str, Any], config: Any, *, batch: bool) -> dict[str, Any]:
    """The sample a backend traces with `dynamic=True`: a one-token prompt at two tokens (a decode
    step's one token stays 1) and, with `batch`, a batch of 1 at 2 (a static cache's batch stays).
    Explicit `dynamic_shapes` or a static export trace the sample as given."""
    if not config.dynamic or config.dynamic_shapes is not None:
        return inputs
    roles = ("batch",) if batch and not has_fixed_batch(inputs) else ()
    if not is_decode_step(inputs):
        roles += ("sequence",)
    return grow_batch(inputs, roles=roles) if roles else inputs


# -- step 3, check: the program keeps every axis the caller asked to be dynamic -------------------

#: Roles that a program must keep dynamic whenever they were asked to be: how many sequences, how
#: many tokens. Other axes (channels, heads, an image's side, mel bins) may be fixed by what the
#: weights and config fix (a ViT's position table fixes its image size); those are listed in the
#: record (`fixed_axes`), never silently dropped from it.
TOKEN_ROLES = ("batch", "sequence", "decoder_sequence", "cache_length", "encoder_sequence", "patches", "images")


def _is_requested(spec: Any) -> bool:
    """Whether a `dynamic_shapes` entry for one axis asks for a dynamic size."""
    if spec is None or isinstance(spec, int) or spec is torch.export.Dim.STATIC:
        return False
    return True


def _axis_specs(spec: Any, rank: int) -> dict[int, Any]:
    """One tensor's `dynamic_shapes` entry as `{axis: spec}` (a dict or a per-axis list/tuple)."""
    if isinstance(spec, dict):
        return {int(axis): value for axis, value in spec.items()}
    if isinstance(spec, (list, tuple)):
        return dict(enumerate(spec[:rank]))
    return {}


def paired_specs(inputs: Any, plan: Any) -> list[tuple[torch.Tensor, dict[int, Any]]]:
    """`(tensor leaf, {axis: spec})` for every tensor leaf of `inputs`, in pytree order (the
    program's input order), with the part of `plan` that `torch.export` reads for it."""
    if isinstance(inputs, torch.Tensor):
        return [(inputs, _axis_specs(plan, inputs.dim()))]
    node_type = type(inputs)
    if node_type is dict:
        plan = plan if isinstance(plan, dict) else {}
        return [pair for key, value in inputs.items() for pair in paired_specs(value, plan.get(key))]
    if node_type in (list, tuple) or node_type in pytree.SUPPORTED_NODES:
        children = inputs if node_type in (list, tuple) else pytree.SUPPORTED_NODES[node_type].flatten_fn(inputs)[0]
        plans = plan if isinstance(plan, (list, tuple)) and len(plan) == len(children) else [None] * len(children)
        return [pair for child, sub in zip(children, plans) for pair in paired_specs(child, sub)]
    return []


def lost_axes(program: torch.export.ExportedProgram, inputs: dict[str, Any], plan: Any,
              names: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Axes the plan asked to be dynamic that the program fixed: `(lost, fixed_by_model)`.

    `lost` holds those with a token role (`TOKEN_ROLES`), which must stay dynamic, and those whose
    range the program narrowed so far that no other size fits; `fixed_by_model` the rest. Each is
    `{"input", "axis", "role", "size"}` (+ `"range"` for a narrowed one).
    """
    from .record import record_from_program
    from .names import role_of

    record = record_from_program(program)
    pairs = paired_specs(inputs, plan)
    lost, fixed = [], []
    if len(pairs) != len(record.input_shapes):
        return lost, fixed
    for index, (name, (tensor, specs), shape) in enumerate(zip(names, pairs, record.input_shapes)):
        for axis, spec in specs.items():
            if not _is_requested(spec) or axis >= len(shape):
                continue
            clean = name.removeprefix("input.")
            entry = {"input": name, "axis": axis, "role": role_of(clean, tensor.dim(), axis),
                     "size": int(tensor.shape[axis]), "leaf": index}
            dim = shape[axis]
            if isinstance(dim, int):
                (lost if entry["role"] in TOKEN_ROLES else fixed).append(entry)
            elif dim in record.symbol_ranges and _narrowed(record.symbol_ranges[dim], entry["size"], spec):
                narrowed = {**entry, "range": list(record.symbol_ranges[dim])}
                (lost if entry["role"] in TOKEN_ROLES else fixed).append(narrowed)
    return lost, fixed


def _narrowed(bounds: tuple[int, int | None], size: int, spec: Any) -> bool:
    """Whether a symbol's range leaves no size but about the sample's (it must reach `size + 2`,
    or start below `size - 1`), unless it reaches the upper bound `spec` asked for (a batch
    bounded at 2 or 3, traced at 2, kept whole). A range narrower than a requested bound but wider than
    that (an ExecuTorch batch bounded at 8 that the program takes up to 4) is the record's to state
    (`symbol_ranges`); the resized check runs inside it."""
    low, high = bounds
    asked = getattr(spec, "max", None)
    if high is not None and isinstance(asked, int) and high >= asked >= size and high > low:
        return False
    return high is not None and high < size + 2 and low >= size - 1


def mark_dynamic(inputs: Any, plan: Any, leaf: int, axis: int) -> Any:
    """`plan` with `axis` of the `leaf`-th tensor (pytree order) a `Dim.DYNAMIC`, or None when the
    plan does not reach that leaf."""
    counter = iter(range(10**9))
    found = False

    def rebuilt(value: Any, spec: Any) -> Any:
        nonlocal found
        if isinstance(value, torch.Tensor):
            if next(counter) != leaf:
                return spec
            found = True
            specs = _axis_specs(spec, value.dim())
            specs[axis] = torch.export.Dim.DYNAMIC
            return specs
        if type(value) is dict:
            spec = spec if isinstance(spec, dict) else {}
            return {k: rebuilt(v, spec.get(k)) for k, v in value.items()}
        if type(value) in (list, tuple) or type(value) in pytree.SUPPORTED_NODES:
            children = value if type(value) in (list, tuple) else pytree.SUPPORTED_NODES[type(value)].flatten_fn(value)[0]
            subs = spec if isinstance(spec, (list, tuple)) and len(spec) == len(children) else [None] * len(children)
            out = [rebuilt(c, sub) for c, sub in zip(children, subs)]
            return type(spec)(out) if isinstance(spec, tuple) else out
        return spec

    result = {k: rebuilt(v, (plan or {}).get(k) if isinstance(plan, dict) else None) for k, v in inputs.items()}
    return result if found else None


def shape_differences(names: list[str], before: list[tuple[int | str, ...]],
                      after: list[tuple[int | str, ...]]) -> list[str]:
    """Where the input shapes `after` (a re-export's) differ from `before` (the capture's) other
    than by the names of their symbols: a size fixed on one side only or to another number, or
    axes sharing one size on one side and not on the other. Empty where they agree."""
    if len(before) != len(after) or any(len(b) != len(a) for b, a in zip(before, after)):
        return [f"the inputs' ranks differ: {before} against {after}"]
    out: list[str] = []
    groups: dict[tuple[str, str], list[str]] = {}
    for name, old, new in zip(names, before, after):
        for axis, (was, now) in enumerate(zip(old, new)):
            where = f"{name}, axis {axis}"
            if isinstance(was, int) or isinstance(now, int):
                if was != now:
                    out.append(f"{where}: {was} in the capture, {now} now")
                continue
            groups.setdefault(("before", was), []).append(where)
            groups.setdefault(("after", now), []).append(where)
    shared_before = sorted(sorted(axes) for (side, _), axes in groups.items() if side == "before")
    shared_after = sorted(sorted(axes) for (side, _), axes in groups.items() if side == "after")
    if shared_before != shared_after:
        out.append(f"axes sharing a size: {shared_before} in the capture, {shared_after} now")
    return out


def describe_axes(axes: list[dict[str, Any]]) -> str:
    """`attention_mask, axis 2 (sequence; traced at 1)` for each axis, joined."""
    parts = []
    for entry in axes:
        where = f"{entry['input']}, axis {entry['axis']} ({entry['role'] or 'no role'}; traced at {entry['size']}"
        parts.append(where + (f"; allowed {entry['range'][0]}..{entry['range'][1]})" if "range" in entry else ")"))
    return "; ".join(parts)
