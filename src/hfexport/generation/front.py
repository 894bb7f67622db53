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

from typing import Any

import torch

__all__ = ["ComponentFront", "fronted", "unwrap"]


class ComponentFront(torch.nn.Module):
    """`model` called with the exported interface's kwargs: the cache under `past_key_values`
    reaches it under its own name, `constants` (the non-tensor kwargs `generate` passed) are
    added, and with a mask `layout` one boolean causal `attention_mask` becomes the masks the
    model takes (see `masks.masks_from_causal`)."""

    def __init__(self, model: torch.nn.Module, layout: Any = None, constants: dict[str, Any] | None = None,
                 unused: tuple[str, ...] = ()):
        super().__init__()
        self.model = model
        self.layout = layout
        self.constants = dict(constants or {})
        self.unused = tuple(unused)  # interface inputs the model has no use for (BLOOM's position_ids)

    @property
    def config(self) -> Any:
        """The wrapped model's config (what exporters read bounds and masks from)."""
        return getattr(self.model, "config", None)

    def forward(self, **kwargs: Any) -> Any:
        """Call the model with the interface's kwargs (see the class docstring)."""
        from ..capture.interface import call_model
        from .masks import masks_from_causal

        if self.layout is not None and isinstance(kwargs.get("attention_mask"), torch.Tensor):
            kwargs["attention_mask"] = masks_from_causal(kwargs["attention_mask"], self.layout)
        for name in self.unused:
            kwargs.pop(name, None)
        return call_model(self.model, {**self.constants, **kwargs})


def fronted(module: torch.nn.Module, kwargs: dict[str, Any], layout: Any = None,
            unused: tuple[str, ...] = ()) -> tuple[torch.nn.Module, dict[str, Any]]:
    """`(module, kwargs)` as `decompose_for_generation` hands a component back: the constants
    held by a `ComponentFront` around `module` when there are any, or the interface's names,
    mask or `unused` inputs would not reach `module` as they are; the kwargs left are those the
    program takes."""
    from ..capture.interface import model_argument_names, split_constants

    traced, constants = split_constants(kwargs)
    if isinstance(module, ComponentFront):
        return ComponentFront(module.model, layout or module.layout, {**module.constants, **constants},
                              tuple(dict.fromkeys(module.unused + tuple(unused)))), traced
    if constants or layout is not None or unused or model_argument_names(module.forward, list(kwargs)):
        return ComponentFront(module, layout, constants, unused), traced
    return module, kwargs


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside a `ComponentFront` (else `module`)."""
    return module.model if isinstance(module, ComponentFront) else module
