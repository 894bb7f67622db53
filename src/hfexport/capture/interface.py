"""The exported interface: which forward kwargs a program takes, under which names.

A program takes the tensors of the forward kwargs (`input_ids`, the cache) by the caller's names;
constants (`use_cache=True`, `logits_to_keep=1`) are baked into the graph, and the cache argument
is `past_key_values` whatever the model's forward calls it (transformers 5.24: `cache`).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
import torch.utils._pytree as pytree

from .names import INTERFACE_CACHE_NAME
from .pytree import is_cache_object

__all__ = ["split_constants", "named_kwargs_forward", "call_model", "model_argument_names"]


def split_constants(inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split forward kwargs into traced inputs (anything holding a tensor) and constants (`None`,
    bools, numbers, strings: `use_cache=True`, `logits_to_keep=1`), which are baked into the graph
    rather than becoming inputs of the artifact."""
    traced, constants = {}, {}
    for name, value in inputs.items():
        holds_tensor = any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(value)) or is_cache_object(value)
        (traced if holds_tensor else constants)[name] = value
    return traced, constants


@contextlib.contextmanager
def named_kwargs_forward(model: torch.nn.Module, names: list[str], constants: dict[str, Any] | None = None,
                         *, drop_none: bool = False):
    """Trace `model` through a front whose signature is exactly `names` (keyword-only), passing
    `constants` along unchanged; restored afterwards (the front is what `torch.export` binds to).

    # NOTE: torch.export binds inputs to the forward's signature. transformers models take extra
    # inputs through `**kwargs` (5.24 renamed `past_key_values` to `cache` and keeps the old name
    # in `**kwargs`), and torch 2.13 mis-builds range constraints for dynamic shapes of inputs
    # that arrive through `**kwargs` ("Must provide a tree_name when there might be a mismatch",
    # pytorch/pytorch#164313, fixed upstream by pytorch/pytorch#186879). A front that names every
    # input keeps the exported interface exactly the caller's names (`past_key_values=` works on
    # the program, as the README shows) and never goes through `**kwargs`. Same module: parameter
    # names do not change.
    """
    original = model.forward
    had_own = "forward" in vars(model)
    renames = model_argument_names(original, names)

    def forward(**kwargs):
        kwargs = {renames.get(k, k): v for k, v in kwargs.items()}
        outputs = original(**kwargs, **(constants or {}))
        return _distinct_outputs(_without_none(outputs) if drop_none else outputs)

    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in names]
    )
    model.forward = forward
    try:
        yield model
    finally:
        if had_own:
            model.forward = original
        else:
            del model.forward


def _without_none(value: Any) -> Any:
    """`value` with `None` items left out of its tuples and lists (`hidden_states=(None, None, h)`
    when a model keeps one layer): OpenVINO's PyTorch frontend cannot convert a `None` output
    ("Tensor name is not a number")."""
    if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
        return type(value)(_without_none(v) for v in value if v is not None)
    if hasattr(value, "keys") and hasattr(value, "__setitem__") and not is_cache_object(value):
        for key in list(value.keys()):
            value[key] = _without_none(value[key])
        return value
    return value


def _distinct_outputs(outputs: Any) -> Any:
    """`outputs` with a tensor returned twice (CLIP's `hidden_states[-1]` is `last_hidden_state`)
    copied the second time: an ONNX graph cannot list one value as two outputs, and torch.onnx
    then drops one, shifting every later output name."""
    seen: set[int] = set()

    def distinct(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor):
            if id(leaf) in seen:
                # `* 1` rather than `.clone()`: ExecuTorch's edge passes drop a clone, and its
                # XNNPACK delegate refuses a value that leaves it twice ("already in the inputs")
                return leaf * 1 if leaf.is_floating_point() else leaf.clone()
            seen.add(id(leaf))
        return leaf

    return pytree.tree_map(distinct, outputs)


def model_argument_names(forward: Any, names: Any) -> dict[str, str]:
    """Interface name -> the model's name for it: `past_key_values` reaches a 5.24 forward as
    `cache` (its own name), so the documented interface works for every model (Mamba's old name was
    `cache_params`) and costs no deprecation warning."""
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return {}
    if INTERFACE_CACHE_NAME in names and INTERFACE_CACHE_NAME not in parameters and "cache" in parameters:
        return {INTERFACE_CACHE_NAME: "cache"}
    return {}


def call_model(model: torch.nn.Module, kwargs: dict[str, Any]) -> Any:
    """`model(**kwargs)` with interface names turned into the model's own (see `model_argument_names`)."""
    renames = model_argument_names(model.forward, kwargs)
    return model(**{renames.get(k, k): v for k, v in kwargs.items()})
