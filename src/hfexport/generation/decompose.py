"""`decompose_for_generation`: run `generate()` once and record the real kwargs of each forward.

# NOTE: no per-architecture glue. Hooks on `forward` of the top-level model (and of the encoder of
# an encoder-decoder model, which `generate` runs outside the top-level forward) snapshot each
# call's keyword arguments (deep copies, since `generate` mutates the cache in place). The first
# top-level call is `prefill` (whole prompt, empty cache), the next is `decode` (one token, filled
# cache); the encoder's call is `encoder`. Whatever a model's `prepare_inputs_for_generation`
# produces is what gets exported, so decoder-only, SSM and encoder-decoder models all go through
# the same code.
#
# Multimodal models are found the same way: `get_encoder(modality="image"|"audio")` names the
# towers, a projector is looked up under the fixed names in `PROJECTOR_NAMES`, `get_decoder()` is
# the language model and `get_output_embeddings()` the head. Their hooks see their own calls
# wherever `generate` makes them (transformers 5.24 runs the vision tower and projector before
# the first top-level forward, outside it). Prefill then splits into those components.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..capture.prepare import inference_mode, model_name, normalize_inputs
from ..capture.names import io_leaf_names, with_interface_cache_name
from ..capture.pytree import is_static_cache
from ..errors import PrepareError

__all__ = ["decompose_for_generation", "interface_kwargs", "initial_cache", "starting_component",
           "note_initial_cache", "merge_decode_steps", "Component", "PROJECTOR_NAMES"]

#: Attribute names under which a multimodal model exposes its projector (SPEC R6).
PROJECTOR_NAMES = ("multi_modal_projector", "connector", "embed_vision", "embed_audio")

#: `(submodule, forward kwargs)` of one component.
Component = tuple[torch.nn.Module, dict[str, Any]]


@contextlib.contextmanager
def _recording(module: torch.nn.Module, calls: list[dict[str, Any]]) -> Iterator[None]:
    """Append a deep copy of the kwargs of every `module.forward` call to `calls`."""

    def hook(_module, args, kwargs):
        if args:  # a positional call (a projector's `forward(image_features)`): name the arguments
            kwargs = _named_arguments(_module, args, kwargs)
        calls.append(copy.deepcopy({k: v for k, v in kwargs.items() if v is not None}))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _named_arguments(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`args` and `kwargs` of a call, all by parameter name (`**kwargs` entries spread out)."""
    signature = inspect.signature(module.forward)
    named: dict[str, Any] = {}
    for name, value in signature.bind_partial(*args, **kwargs).arguments.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


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

    Runs `model.generate(**inputs)` once (2 new tokens, 3 with `multi_token_decode`) with hooks that capture the kwargs of every
    forward call. Keys: `prefill` and `decode`; encoder-decoder models add `encoder`.

    Args:
        model: a generative `PreTrainedModel`.
        inputs: the prompt's forward kwargs (a tokenizer/processor output). Small is enough: the
            exported graphs are not tied to these sizes.
        generation_config: used for the capture (copied, never mutated), e.g. a static cache.
        multi_token_decode: capture 3 new tokens and merge the two decode steps into one call, so
            the query axis of `decode` stays symbolic (one graph for 1, k or a whole prompt's tokens).

    Returns:
        `{name: (submodule, kwargs)}`; `submodule(**kwargs)` reproduces what `generate` computed.
    """
    name = model_name(model)
    if not (hasattr(model, "generate") and getattr(model, "can_generate", lambda: False)()):
        raise PrepareError(
            f"{name} cannot generate, so it has no prefill/decode components",
            model=name,
            remedy="use exporter.export(model, inputs) for a single graph, or load a generative class "
            "(AutoModelForCausalLM, AutoModelForSeq2SeqLM, ...)",
        )
    kwargs = normalize_inputs(inputs, model=model)
    config = _generation_config(model, generation_config, new_tokens=3 if multi_token_decode else 2)
    watched = _watched_modules(model)
    calls: dict[str, list[dict[str, Any]]] = {name: [] for name in watched}
    top_calls: list[dict[str, Any]] = []
    with inference_mode(model), contextlib.ExitStack() as stack:
        stack.enter_context(_recording(model, top_calls))
        for name, module in watched.items():
            stack.enter_context(_recording(module, calls[name]))
        model.generate(**copy.deepcopy(kwargs), generation_config=config)
    needed = 3 if multi_token_decode else 2
    if len(top_calls) < needed:
        raise PrepareError(
            f"{name}.generate() made {len(top_calls)} call(s) to {name}.forward; prefill and decode need {needed}",
            model=name,
            remedy="this model's generate() bypasses its top-level forward; export its submodules with "
            "exporter.export(submodule, kwargs) instead",
        )
    components: dict[str, Component] = {}
    towers = [name for name in ("image_encoder", "audio_encoder") if calls.get(name)]
    if towers:
        for name in (*towers, *[p for p in PROJECTOR_NAMES if calls.get(p)], "language_model", "lm_head"):
            if not calls.get(name):
                raise PrepareError(f"{name} of {model_name(model)} was not called during generate()",
                                   model=model_name(model), remedy="report this model class; it needs support")
            components[name] = (watched[name], calls[name][0])
    else:
        if calls.get("encoder"):
            components["encoder"] = (watched["encoder"], calls["encoder"][0])
        if not (multi_token_decode and is_static_cache(next((top_calls[1][k] for k in _CACHE_KEYS if k in top_calls[1]), None))):
            components["prefill"] = (model, top_calls[0])  # else the decode graph prefills too (SPEC R8)
    decode = merge_decode_steps(top_calls[1], top_calls[2]) if multi_token_decode else top_calls[1]
    components["decode"] = (model, decode)
    return components


#: Forward kwargs laid out along the query (new tokens) axis, and that axis.
_QUERY_AXIS = {
    "input_ids": 1, "position_ids": -1, "cache_position": 0, "inputs_embeds": 1, "token_type_ids": 1,
    "decoder_input_ids": 1, "decoder_position_ids": -1, "decoder_inputs_embeds": 1,
}
_CACHE_KEYS = ("cache", "past_key_values", "cache_params")


def merge_decode_steps(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One forward doing two consecutive decode steps: the cache as `first` saw it, the new tokens
    of both calls along the query axis.

    # NOTE: what makes the query axis symbolic (SPEC R7). Query-aligned inputs (`_QUERY_AXIS`) are
    # concatenated; a 2D attention mask covers past + new tokens, so the later call's mask is the
    # merged one; a 4D mask (`[b, 1, q, kv]`, what `generate` passes with a static cache) stacks
    # its query rows. Logits are kept for every query position (`logits_to_keep=0`): a caller
    # checking a block of speculative tokens, or prefilling, needs them all.
    """
    merged: dict[str, Any] = {}
    for key, value in first.items():
        later = second.get(key)
        if key in _CACHE_KEYS or not isinstance(value, torch.Tensor) or not isinstance(later, torch.Tensor):
            merged[key] = value
        elif key in _QUERY_AXIS:
            merged[key] = torch.cat([value, later], dim=_QUERY_AXIS[key])
        elif key.endswith("attention_mask") and value.dim() == 4:
            merged[key] = torch.cat([value, later], dim=-2)
        elif key.endswith("attention_mask"):
            merged[key] = later
        else:
            merged[key] = value
    if "logits_to_keep" in merged:
        merged["logits_to_keep"] = 0
    return merged


def initial_cache(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The scalar leaves of the empty cache generation starts from, by leaf name
    (`cache.0.cumulative_length`: 0, `cache.0._sliding_window_tensor`: 4).

    A runner allocates the large buffers itself (zeros of the recorded shapes); these small ones
    carry values it cannot guess. A static cache is `reset()` first, as the seed resets the
    program's own template: its write counters start at 0 whatever the capture left in them.
    """
    key = next((k for k in _CACHE_KEYS if k in kwargs), None)
    if key is None:
        return {}
    cache = copy.deepcopy(kwargs[key])
    if is_static_cache(cache):
        cache.reset()
    tree = {key: cache}
    leaves = pytree.tree_leaves(tree)
    return {name: leaf.tolist() for name, leaf in zip(io_leaf_names(tree), leaves)
            if isinstance(leaf, torch.Tensor) and leaf.numel() <= 1}


def starting_component(components: dict[str, Any]) -> str:
    """The component that takes the prompt: `prefill`, else the static-cache `decode`."""
    return "prefill" if "prefill" in components else "decode"


def note_initial_cache(components: dict[str, Component], artifacts: dict[str, Any]) -> None:
    """Record on the starting component's artifact the scalars of the cache it starts from
    (`record.details["initial_cache"]`), for a runner that has no model to build one."""
    from ..record import record_of

    name = starting_component(components)
    if name in artifacts:
        values = initial_cache(components[name][1])
        if values:
            record_of(artifacts[name]).details["initial_cache"] = values


def interface_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with the cache under its long-standing name, `past_key_values`: the exported
    interface is the seed's (`decode(input_ids=..., past_key_values=...)`) while transformers 5.24
    calls the argument `cache`. The capture front hands it to the model under the model's own name
    (`capture.named_kwargs_forward`), so models whose old name differs (Mamba's `cache_params`)
    still get their cache.

    The order is the seed's too: `input_ids, attention_mask, position_ids`, the rest, the cache
    last. Runtimes that take inputs by position (ExecuTorch's `method.execute`, the C++
    `set_input(.., i)`) see `[input_ids, attention_mask, position_ids, cache x N]`."""
    kwargs = with_interface_cache_name(kwargs)
    first = [k for k in _LEADING if k in kwargs]
    last = [k for k in ("past_key_values", *_CACHE_KEYS) if k in kwargs]
    middle = [k for k in kwargs if k not in first and k not in last]
    return {k: kwargs[k] for k in (*first, *middle, *dict.fromkeys(last))}


_LEADING = ("input_ids", "decoder_input_ids", "attention_mask", "decoder_attention_mask", "position_ids",
            "decoder_position_ids")


def _watched_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
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
