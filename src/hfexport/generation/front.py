"""`ComponentFront`: a generation component as the exported interface calls it.

# NOTE: `decompose_for_generation` promises that `submodel(**kwargs)` reproduces what `generate`
# computed and that `exporter.export(submodel, kwargs)` gives a program taking the same kwargs
# (`exported.module()(**kwargs)`, the README's sanity check). Three things stand between them:
# - the interface names the cache `past_key_values` (the name documented in the README), which transformers 5.24
#   renamed `cache`: Llama still accepts the old name with a deprecation warning, Mamba's forward
#   drops it into `**kwargs` and runs without its cache;
# - `generate` passes constants (`use_cache=True`, `logits_to_keep=1`), which a program bakes in
#   rather than taking as inputs;
# - a static cache's decode takes one causal mask where the model was given masks per layer type
#   (`masks.py`).
# The front holds the constants and translates the rest, and the same front is what gets traced,
# so the eager check and the program take the same kwargs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["ComponentFront", "fronted", "unwrap", "traced_sample"]


class ComponentFront(torch.nn.Module):
    """`model` called with the exported interface's kwargs: the cache under `past_key_values`
    reaches it under its own name, `constants` (the non-tensor kwargs `generate` passed) are
    added, with a mask `layout` one boolean causal `attention_mask` becomes the masks the
    model takes (see `masks.masks_from_causal`), and with `attended` a static cache's attention
    reads only the slots that mask covers (`attended.attending`)."""

    def __init__(self, model: torch.nn.Module, layout: Any = None, constants: dict[str, Any] | None = None,
                 unused: tuple[str, ...] = (), attended: bool = False):
        super().__init__()
        self.model = model
        self.layout = layout
        self.constants = dict(constants or {})
        self.unused = tuple(unused)  # interface inputs the model has no use for (BLOOM's position_ids)
        self.attended = attended

    @property
    def config(self) -> Any:
        """The wrapped model's config (what exporters read bounds and masks from)."""
        return getattr(self.model, "config", None)

    def forward(self, **kwargs: Any) -> Any:
        """Call the model with the interface's kwargs (see the class docstring)."""
        from ..capture.interface import call_model
        from .attended import attending
        from .masks import masks_from_causal

        mask = kwargs.get("attention_mask")
        if self.layout is not None and isinstance(mask, torch.Tensor):
            kwargs["attention_mask"] = masks_from_causal(mask, self.layout)
        for name in self.unused:
            kwargs.pop(name, None)
        narrowing = self.attended and isinstance(mask, torch.Tensor)
        with attending(mask.shape[-1]) if narrowing else contextlib.nullcontext():
            return call_model(self.model, {**self.constants, **kwargs})


def fronted(module: torch.nn.Module, kwargs: dict[str, Any], layout: Any = None,
            unused: tuple[str, ...] = (), attended: bool = False) -> tuple[torch.nn.Module, dict[str, Any]]:
    """`(module, kwargs)` as `decompose_for_generation` hands a component back: the constants
    held by a `ComponentFront` around `module` when there are any, or the interface's names,
    mask, `unused` inputs or `attended` slots would not reach `module` as they are; the kwargs
    left are those the program takes."""
    from ..capture.interface import model_argument_names, split_constants

    traced, constants = split_constants(kwargs)
    if isinstance(module, ComponentFront):
        return ComponentFront(module.model, layout or module.layout, {**module.constants, **constants},
                              tuple(dict.fromkeys(module.unused + tuple(unused))),
                              attended or module.attended), traced
    if constants or layout is not None or unused or attended or model_argument_names(module.forward, list(kwargs)):
        return ComponentFront(module, layout, constants, unused, attended), traced
    return module, kwargs


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside a `ComponentFront` (else `module`)."""
    return module.model if isinstance(module, ComponentFront) else module


def traced_sample(model: torch.nn.Module, inputs: dict[str, Any], config: Any) -> dict[str, Any]:
    """The sample a capture traces `model` with: for a front whose attention follows its mask,
    under `dynamic=True` (every axis symbolic), the mask cut to the slots written after the call
    and one free slot (`attended.narrowed`), so the mask's last axis is traced as a size of its
    own (at the cache's length it would be traced as that length); else `inputs`."""
    from ..capture.names import INTERFACE_CACHE_NAME
    from .attended import narrowed

    if not (isinstance(model, ComponentFront) and model.attended and config.dynamic and config.dynamic_shapes is None):
        return inputs
    layers = getattr(inputs.get(INTERFACE_CACHE_NAME), "layers", None) or []
    written = max((int(layer.cumulative_length) for layer in layers), default=None)
    if written is None:
        return inputs
    return narrowed(inputs, written=written) or inputs
