"""What a generation component is (`Component`), which parts of a model `generate` runs as
components (`watched_modules`, `is_text_decoder`), and the interface a component's program takes
(`interface_kwargs`) and starts from (`starting_component`, `note_initial_cache`).
`decompose_for_generation` (`decompose.py`) splits a model into them."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..capture.names import with_interface_cache_name
from .caches import CACHE_KEYS, initial_cache

__all__ = ["Component", "PROJECTOR_NAMES", "PACKAGE_TASKS", "watched_modules", "is_text_decoder", "package_task",
           "interface_kwargs", "starting_component", "note_initial_cache"]

#: What a generation folder is a runtime's package for, by what the model reads (transformers'
#: pipeline task names): text, an image and text, speech. Each format registers a package per task
#: it has a runner for (`folder.package.register_package`).
PACKAGE_TASKS = ("text-generation", "image-text-to-text", "automatic-speech-recognition")

#: Attribute names under which a multimodal model exposes its projector (the names the README documents).
PROJECTOR_NAMES = ("multi_modal_projector", "connector", "embed_vision", "embed_audio")


class Component(NamedTuple):
    """One generation component: the module to export and the kwargs `generate` called it with
    (a tuple, so `for name, (submodel, subinputs) in components.items()` reads it)."""

    module: torch.nn.Module
    kwargs: dict[str, Any]


def is_text_decoder(model: torch.nn.Module) -> bool:
    """Whether `generate` runs `model` as one text decoder (no encoder, no image/audio tower)."""
    return not getattr(model.config, "is_encoder_decoder", False) and not watched_modules(model)


def watched_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The submodules whose calls name components: towers, projector, language model, head, and
    the text encoder of an encoder-decoder model."""
    watched: dict[str, torch.nn.Module] = {}
    base = getattr(model, "base_model", model)
    for modality in ("image", "audio"):
        tower = model.get_encoder(modality=modality)
        if tower is not model and tower is not base:
            watched[f"{modality}_encoder"] = tower
    if watched:
        for name in PROJECTOR_NAMES:
            owner = next((m for m in (model, base) if isinstance(getattr(m, name, None), torch.nn.Module)), None)
            if owner is not None:
                watched[name] = getattr(owner, name)
        watched["language_model"] = model.get_decoder()
        watched["lm_head"] = model.get_output_embeddings()
    elif getattr(model.config, "is_encoder_decoder", False):
        watched["encoder"] = model.get_encoder()
    return watched


def package_task(model: torch.nn.Module | None, component_names: Any = ()) -> str:
    """`model`'s task among `PACKAGE_TASKS`: image-text where it has an image tower, speech where it
    has an audio tower or reads audio features (Whisper's `input_features`), else text. Without
    the model (artifacts saved alone), what its `component_names` show: an `image_encoder`, an
    `audio_encoder`."""
    if model is None:
        names = set(component_names)
        return ("image-text-to-text" if "image_encoder" in names else
                "automatic-speech-recognition" if "audio_encoder" in names else "text-generation")
    if not hasattr(model, "get_encoder"):  # a plain module (`export_to_folder((module, sample), ...)`): one graph
        return "text-generation"
    towers = watched_modules(model)
    if "image_encoder" in towers:
        return "image-text-to-text"
    if "audio_encoder" in towers or getattr(model, "main_input_name", None) in ("input_features", "input_values"):
        return "automatic-speech-recognition"
    return "text-generation"


def interface_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with the cache under its long-standing name, `past_key_values`: the exported
    interface is the documented one (`decode(input_ids=..., past_key_values=...)`) while transformers 5.24
    calls the argument `cache`. The capture front hands it to the model under the model's own name
    (`capture.named_kwargs_forward`), so models whose old name differs (Mamba's `cache_params`)
    still get their cache.

    The order is the documented one too: `input_ids, attention_mask, position_ids`, the rest, the cache
    last. Runtimes that take inputs by position (ExecuTorch's `method.execute`, the C++
    `set_input(.., i)`) see `[input_ids, attention_mask, position_ids, cache x N]`."""
    kwargs = with_interface_cache_name(kwargs)
    first = [k for k in _LEADING if k in kwargs]
    last = [k for k in ("past_key_values", *CACHE_KEYS) if k in kwargs]
    middle = [k for k in kwargs if k not in first and k not in last]
    return {k: kwargs[k] for k in (*first, *middle, *dict.fromkeys(last))}


_LEADING = ("input_ids", "decoder_input_ids", "attention_mask", "decoder_attention_mask", "position_ids",
            "decoder_position_ids")


def starting_component(components: dict[str, Any]) -> str:
    """The component that takes the prompt: `prefill`, else the static-cache `decode`."""
    return "prefill" if "prefill" in components else "decode"


def note_initial_cache(components: dict[str, Component], artifacts: dict[str, Any]) -> None:
    """Record on the starting component's artifact the scalars of the cache it starts from
    (`record.details["initial_cache"]`), for a runner that has no model to build one."""
    from ..capture.record import record_of

    name = starting_component(components)
    if name in artifacts:
        values = initial_cache(components[name][1])
        if values:
            record_of(artifacts[name]).details["initial_cache"] = values
