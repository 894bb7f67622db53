"""`decompose_for_generation`: run `generate()` once and record the real kwargs of each forward.

# NOTE: no per-architecture glue. Hooks on `forward` of the top-level model (and of the encoder of
# an encoder-decoder model, which `generate` runs outside the top-level forward) snapshot each
# call's keyword arguments (deep copies, since `generate` mutates the cache in place). The first
# top-level call is `prefill` (whole prompt, empty cache), the next is `decode` (one token, filled
# cache); the encoder's call is `encoder`. Whatever a model's `prepare_inputs_for_generation`
# produces is what gets exported, so decoder-only, SSM and encoder-decoder models all go through
# the same code.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch

from ..capture.prepare import inference_mode, model_name, normalize_inputs
from ..errors import PrepareError

__all__ = ["decompose_for_generation", "Component"]

#: `(submodule, forward kwargs)` of one component.
Component = tuple[torch.nn.Module, dict[str, Any]]


@contextlib.contextmanager
def _recording(module: torch.nn.Module, calls: list[dict[str, Any]]) -> Iterator[None]:
    """Append a deep copy of the kwargs of every `module.forward` call to `calls`."""

    def hook(_module, args, kwargs):
        if args:
            names = list(_module.forward.__code__.co_varnames[1 : 1 + len(args)])
            kwargs = {**dict(zip(names, args)), **kwargs}
        calls.append(copy.deepcopy({k: v for k, v in kwargs.items() if v is not None}))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _generation_config(model: torch.nn.Module, generation_config: Any, new_tokens: int) -> Any:
    from transformers import GenerationConfig

    base = generation_config if generation_config is not None else getattr(model, "generation_config", None)
    config = copy.deepcopy(base) if base is not None else GenerationConfig()
    config.max_new_tokens = new_tokens
    config.min_new_tokens = new_tokens  # an early EOS must not cut the capture short
    config.do_sample = False
    config.num_beams = 1
    config.max_length = None
    return config


def decompose_for_generation(
    model: torch.nn.Module,
    inputs: Any,
    generation_config: Any = None,
    multi_token_decode: bool = False,
) -> dict[str, Component]:
    """Split `model`'s generation into components, each `(submodule, forward kwargs)`.

    Runs `model.generate(**inputs)` once (2 new tokens) with hooks that capture the kwargs of every
    forward call. Keys: `prefill` and `decode`; encoder-decoder models add `encoder`.

    Args:
        model: a generative `PreTrainedModel`.
        inputs: the prompt's forward kwargs (a tokenizer/processor output). Small is enough: the
            exported graphs are not tied to these sizes.
        generation_config: used for the capture (copied, never mutated), e.g. a static cache.
        multi_token_decode: merge two decode steps into one call (not available yet).

    Returns:
        `{name: (submodule, kwargs)}`; `submodule(**kwargs)` reproduces what `generate` computed.
    """
    name = model_name(model)
    if multi_token_decode:
        raise NotImplementedError(
            "multi_token_decode is not implemented in this version of hfexport; export the single-token decode"
        )
    if not (hasattr(model, "generate") and getattr(model, "can_generate", lambda: False)()):
        raise PrepareError(
            f"{name} cannot generate, so it has no prefill/decode components",
            model=name,
            remedy="use exporter.export(model, inputs) for a single graph, or load a generative class "
            "(AutoModelForCausalLM, AutoModelForSeq2SeqLM, ...)",
        )
    kwargs = normalize_inputs(inputs, model=model)
    config = _generation_config(model, generation_config, new_tokens=2)
    top_calls: list[dict[str, Any]] = []
    encoder_calls: list[dict[str, Any]] = []
    encoder = model.get_encoder() if getattr(model.config, "is_encoder_decoder", False) else None
    with inference_mode(model), _recording(model, top_calls), (
        _recording(encoder, encoder_calls) if encoder is not None else contextlib.nullcontext()
    ):
        model.generate(**copy.deepcopy(kwargs), generation_config=config)
    if len(top_calls) < 2:
        raise PrepareError(
            f"{name}.generate() made {len(top_calls)} call(s) to {name}.forward; prefill and decode need two",
            model=name,
            remedy="this model's generate() bypasses its top-level forward; export its submodules with "
            "exporter.export(submodule, kwargs) instead",
        )
    components: dict[str, Component] = {}
    if encoder is not None and encoder_calls:
        components["encoder"] = (encoder, encoder_calls[0])
    components["prefill"] = (model, top_calls[0])
    components["decode"] = (model, top_calls[1])
    return components
