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
#
# NOTE: the seed documents a multimodal model's components as exactly the towers, the projector,
# `language_model`, `lm_head` and `decode`. A runner that merges image features into the prompt's
# embeddings outside any graph (`multimodal.py`, OpenVINO's `VLMPipeline`, ExecuTorch's
# `MultimodalRunner`) also needs the token embedding table (`text_embeddings`); it is added only
# when asked (`runner_components=True`: `export_to_folder` asks, through `GenerationPlan.runner_components`),
# never to the documented result.
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
from ..capture.pytree import is_static_cache
from ..errors import PrepareError
from .audio_tower import audio_tower_component, without_audio_inputs
from .caches import CACHE_KEYS, full_length_caches
from .components import PROJECTOR_NAMES, Component, interface_kwargs, watched_modules
from .front import fronted

__all__ = ["decompose_for_generation", "merge_decode_steps", "planned_components"]


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
    if _detects_language(config, model):
        # Whisper's generate picks a language the config does not name with a forward call of its own,
        # without a cache, which the hooks would record as the prefill: the capture names one instead
        config.language = next(iter(config.lang_to_id))
    return config


def _detects_language(config: Any, model: torch.nn.Module) -> bool:
    """Whether `generate` would detect the language first (a multilingual Whisper's config naming none)."""
    from .decoder_prompt import DETECT_LANGUAGE, decoder_prompt

    if not getattr(config, "lang_to_id", None) or getattr(config, "is_multilingual", None) is False:
        return False
    try:
        return DETECT_LANGUAGE in decoder_prompt(config, model.config)
    except PrepareError:  # what the runner refuses (timestamps) is still exported as generate runs it
        return False


def decompose_for_generation(
    model: torch.nn.Module,
    inputs: Any,
    generation_config: Any = None,
    multi_token_decode: bool = False,
    decode_prefills: bool = False,
    *,
    runner_components: bool = False,
) -> dict[str, Component]:
    """Split `model`'s generation into components, each `(submodule, forward kwargs)`.

    Runs `model.generate(**inputs)` once (2 new tokens, 3 with `multi_token_decode`) with hooks that capture the kwargs of every
    forward call. Keys: `prefill` and `decode`; encoder-decoder models add `encoder`; multimodal
    models have `image_encoder`/`audio_encoder`, the projector, `language_model`, `lm_head` and `decode`
    (Qwen2-VL: `image_encoder`, `language_model`, `lm_head`, `decode`).

    Args:
        model: a generative `PreTrainedModel`.
        inputs: the prompt's forward kwargs (a tokenizer/processor output). Small is enough: the
            exported graphs are not tied to these sizes.
        generation_config: used for the capture (copied, never mutated), e.g. a static cache.
        multi_token_decode: capture 3 new tokens and merge the two decode steps into one call, so
            the query axis of `decode` stays symbolic (one graph for 1, k or a whole prompt's tokens).
        decode_prefills: with `multi_token_decode` and a dynamic cache of plain key/value layers,
            no `prefill`: the `decode` graph takes the prompt on an empty cache too, with a 2-D
            `attention_mask` over cached + new tokens (OpenVINO's one stateful model,
            `backends/openvino/genai.py`). Another cache keeps its `prefill`.
        runner_components: also the components a runner needs beyond the documented ones: for a
            multimodal model, `text_embeddings` (token ids -> embeddings, the table the runner
            embeds the prompt with before writing the image features over the image tokens' rows,
            `generation/multimodal.py`), placed before `decode`. An export folder asks for them;
            the seed's calls get exactly the documented keys.

    Returns:
        `{name: (submodule, kwargs)}`; `submodule(**kwargs)` reproduces what `generate` computed,
        and `exporter.export(submodule, kwargs)` gives a program whose interface takes the same
        kwargs (the cache as `past_key_values`, its long-standing name). A static cache's `decode` (and
        `prefill`) takes one boolean causal mask `[batch, 1, query, cache_length]`. Where the
        interface's names or mask are not what the model takes, `submodule` is a
        `ComponentFront` around it (`front.py`; `front.unwrap` gives the model).
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
    watched = watched_modules(model)
    calls: dict[str, list[dict[str, Any]]] = {part: [] for part in watched}
    top_calls: list[dict[str, Any]] = []
    with inference_mode(model), full_length_caches(), contextlib.ExitStack() as stack:
        stack.enter_context(_recording(model, top_calls))
        for part, module in watched.items():
            stack.enter_context(_recording(module, calls[part]))
        model.generate(**copy.deepcopy(kwargs), generation_config=config)
    needed = 3 if multi_token_decode else 2
    if len(top_calls) < needed:
        raise PrepareError(
            f"{name}.generate() made {len(top_calls)} call(s) to {name}.forward; prefill and decode need {needed}",
            model=name,
            remedy="this model's generate() bypasses its top-level forward; export its submodules with "
            "exporter.export(submodel, kwargs) instead",
        )
    components: dict[str, Component] = {}
    towers = [part for part in ("image_encoder", "audio_encoder") if calls.get(part)]
    if towers:
        for part in (*towers, *[p for p in PROJECTOR_NAMES if calls.get(p)], "language_model", "lm_head"):
            if not calls.get(part):
                raise PrepareError(f"{part} of {name} was not called during generate()",
                                   model=name, remedy="report this model class; it needs support")
            components[part] = (watched[part], calls[part][0])
        if "audio_encoder" in components:
            components["audio_encoder"] = audio_tower_component(*components["audio_encoder"], kwargs, model_name=name,
                                                                for_runner=runner_components)
        if runner_components:
            components["text_embeddings"] = _text_embeddings(model, kwargs)
    else:
        if calls.get("encoder"):
            components["encoder"] = (watched["encoder"], calls["encoder"][0])
        static = is_static_cache(next((top_calls[1][k] for k in CACHE_KEYS if k in top_calls[1]), None))
        if not (multi_token_decode and (static or decode_prefills and _grows_by_concat(top_calls[1]))):
            components["prefill"] = (_static_prefill(model, top_calls[0], top_calls[1], kwargs) if static
                                     else _with_causal_mask(model, [top_calls[0]], top_calls[0], kwargs, past=0))
    decode = merge_decode_steps(top_calls[1], top_calls[2]) if multi_token_decode else top_calls[1]
    if "audio_encoder" in components:  # the audio is in the cache after the prefill
        audio = tuple(k for k in components["audio_encoder"][1] if k in kwargs)
        decode = without_audio_inputs(decode, audio, lambda step, candidate: _same_logits(model, step, model, candidate))
    prompt_length = kwargs["input_ids"].shape[1] if isinstance(kwargs.get("input_ids"), torch.Tensor) else 0
    components["decode"] = _with_causal_mask(model, top_calls[1:needed], decode, kwargs, past=prompt_length)
    if "prefill" not in components and not is_static_cache(next((decode[k] for k in CACHE_KEYS if k in decode), None)):
        components["decode"] = _with_padding_mask(model, *components["decode"])
    if is_static_cache(next((decode[k] for k in CACHE_KEYS if k in decode), None)):
        for part, past in (("prefill", 0), ("decode", prompt_length)):
            if part in components:
                components[part] = _with_positions(model, *components[part], past=past)
                components[part] = _attending_written_slots(*components[part], past=past)
    return {part: Component(*fronted(module, interface_kwargs(step))) for part, (module, step) in components.items()}


def _text_embeddings(model: torch.nn.Module, prompt: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The token embedding table of a multimodal model, called on the prompt's ids: a runner
    embeds the prompt with it and writes the image features over the image tokens' rows (the
    merge `generate` does inside the top-level forward), then feeds `language_model`."""
    ids = prompt.get("input_ids")
    if not isinstance(ids, torch.Tensor):
        raise PrepareError(f"{model_name(model)}'s prompt has no input_ids to embed", model=model_name(model),
                           remedy="pass the processor's output, with input_ids, as the sample inputs")
    return model.get_input_embeddings(), {"input": ids}


def _with_padding_mask(model: torch.nn.Module, module: torch.nn.Module, kwargs: dict[str, Any]) -> Component:
    """A dynamic-cache decode given the 2-D padding mask over cached + new tokens (ones) where
    `generate` left it out, when the model takes one and gives the same logits with it.

    # NOTE: transformers 5.24's `generate` drops a mask of ones (a prompt without padding), so a
    # decode captured so takes none; a runtime that batches padded prompts (OpenVINO GenAI's
    # `LLMPipeline`) feeds `attention_mask` to every call.
    """
    ids, cache = kwargs.get("input_ids"), next((kwargs[k] for k in CACHE_KEYS if k in kwargs), None)
    if "attention_mask" in kwargs or not isinstance(ids, torch.Tensor) or not hasattr(cache, "get_seq_length"):
        return module, kwargs
    try:
        if "attention_mask" not in inspect.signature(model.forward).parameters:
            return module, kwargs
    except (TypeError, ValueError):
        return module, kwargs
    mask = torch.ones(ids.shape[0], cache.get_seq_length() + ids.shape[1], dtype=torch.long)
    candidate = {**kwargs, "attention_mask": mask}
    return (module, candidate) if _same_logits(module, kwargs, module, candidate) else (module, kwargs)


def _grows_by_concat(decode: dict[str, Any]) -> bool:
    """Whether `decode`'s cache is a dynamic cache of plain key/value layers (each step appends
    its tokens), which an empty cache of the same layers starts."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    cache = next((decode[k] for k in CACHE_KEYS if k in decode), None)
    return type(cache) is DynamicCache and bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _with_causal_mask(model: torch.nn.Module, steps: list[dict[str, Any]], component: dict[str, Any],
                      prompt: dict[str, Any], *, past: int) -> Component:
    """`(module, kwargs)` for a top-level component whose `attention_mask` is the precomputed mask
    of a static cache: one boolean causal mask and a front that builds the model's masks
    from it (see `masks.py`), when that reproduces every mask of `steps` (the calls it covers, the
    first after `past` tokens) exactly; else as captured."""
    from .masks import causal_mask, mask_layout, masks_from_causal, same_masks

    captured = [step.get("attention_mask") for step in steps]
    static = is_static_cache(next((component[k] for k in CACHE_KEYS if k in component), None))
    layout = mask_layout(model.config, captured[0], static=static)
    ids = prompt.get("input_ids")
    if static and captured[0] is None and ids is not None and isinstance(component.get("input_ids"), torch.Tensor):
        return _with_mask_where_none(model, component, prompt, past=past)
    if layout is None or ids is None or not all(isinstance(step.get("input_ids"), torch.Tensor) for step in steps):
        return model, component
    padding = prompt.get("attention_mask", torch.ones_like(ids))
    length = next(iter(captured[0].values())).shape[-1] if isinstance(captured[0], dict) else captured[0].shape[-1]
    start = past
    for step, mask in zip(steps, captured):
        query = step["input_ids"].shape[1]
        if not same_masks(masks_from_causal(causal_mask(padding, past, query, length), layout), mask):
            return model, component
        past += query
    mask = causal_mask(padding, start, component["input_ids"].shape[1], length)
    component = {**component, "attention_mask": mask}
    if layout == [(None, None, torch.bool)]:
        return model, component  # the model takes the causal mask as it is (Llama)
    return fronted(model, component, layout)


def _with_mask_where_none(model: torch.nn.Module, component: dict[str, Any], prompt: dict[str, Any], *,
                          past: int) -> Component:
    """A static-cache component `generate` called without a mask, given the documented causal
    mask in the first layout with which the model gives the captured call's logits; else as captured.

    # NOTE: BLOOM's `create_masks_for_generate` returns no mask for a prompt without padding (its
    # alibi then spans the whole cache), where other models get a causal mask. Exported so, its
    # static decode took `input_ids` and the cache alone: not the documented
    # `input_ids, attention_mask, position_ids` a runner or the README's loop feeds.
    """
    from .masks import PADDING_ROW, causal_mask

    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return model, component
    cache = next((component[k] for k in CACHE_KEYS if k in component), None)
    keys = [layer.keys for layer in getattr(cache, "layers", []) if isinstance(getattr(layer, "keys", None), torch.Tensor)]
    if "attention_mask" not in parameters or not keys:
        return model, component
    query = component["input_ids"].shape[1]
    padding = prompt.get("attention_mask", torch.ones_like(prompt["input_ids"]))
    candidate = {**component, "attention_mask": causal_mask(padding, past, query, keys[0].shape[-2])}
    if _same_logits(model, component, model, candidate):
        return model, candidate  # the model takes the causal mask as it is
    layout = [(None, PADDING_ROW, torch.int64)]
    if _same_logits(model, component, *fronted(model, interface_kwargs(candidate), layout)):
        return fronted(model, candidate, layout)
    return model, component


def _with_positions(model: torch.nn.Module, module: torch.nn.Module, kwargs: dict[str, Any], *,
                    past: int) -> Component:
    """A static-cache component given the documented causal mask, with `position_ids` too where the
    model takes none (the front drops them): every static `decode` takes `input_ids,
    attention_mask, position_ids` and the cache, so one loop drives them all. BLOOM's positions
    come from its mask (alibi)."""
    ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    if "position_ids" in kwargs or not isinstance(ids, torch.Tensor) or getattr(mask, "ndim", 0) != 4:
        return module, kwargs
    try:
        if "position_ids" in inspect.signature(model.forward).parameters:
            return module, kwargs
    except (TypeError, ValueError):
        return module, kwargs
    positions = torch.arange(past, past + ids.shape[1])[None].expand(ids.shape[0], -1)
    return fronted(module, {**kwargs, "position_ids": positions}, unused=("position_ids",))


def _attending_written_slots(module: torch.nn.Module, kwargs: dict[str, Any], *,
                             past: int) -> Component:
    """A static-cache component (`module`, its `kwargs` with the interface's causal mask over the
    whole cache) whose attention follows its mask's length (`attended.py`), when the narrowed
    call (`past` cached tokens, the query, one free slot) gives the full call's logits; else
    unchanged. The kwargs keep the mask over the whole cache, the documented interface a static
    export takes; a dynamic capture traces the narrowed one (`front.traced_sample`).

    # NOTE: only for a cache whose layers are all plain `StaticLayer`s (a subclass may return other
    # slots) and a model given a 4-D mask: a 2-D padding row over the whole cache (BLOOM's,
    # `masks.PADDING_ROW`) is sized by the buffers inside the model.
    """
    from transformers.cache_utils import StaticCache, StaticLayer

    from .attended import narrowed
    from .front import ComponentFront
    from .masks import PADDING_ROW

    cache = next((kwargs[k] for k in CACHE_KEYS if k in kwargs), None)
    if not (isinstance(cache, StaticCache) and cache.layers and all(type(layer) is StaticLayer for layer in cache.layers)):
        return module, kwargs
    layout = module.layout if isinstance(module, ComponentFront) else None
    if layout and any(window == PADDING_ROW for _, window, _ in layout):
        return module, kwargs
    sample = narrowed(kwargs, written=past)
    if sample is None:
        return module, kwargs
    attended = fronted(module, kwargs, attended=True)
    if _same_logits(module, kwargs, attended[0], sample):
        return attended
    return module, kwargs


def _same_logits(model: torch.nn.Module, kwargs: dict[str, Any], module: torch.nn.Module,
                 traced: dict[str, Any]) -> bool:
    """Whether `module(**traced)` gives the logits of `model(**kwargs)` (within 1e-5); a call
    that fails gives none."""
    from ..capture.interface import call_model

    try:
        with inference_mode(model), full_length_caches():
            want = call_model(model, copy.deepcopy(kwargs))
            got = module(**copy.deepcopy(traced))
    except Exception:  # noqa: BLE001 - a form the model refuses is not its form
        return False
    logits = [getattr(out, "logits", None) for out in (want, got)]
    return all(isinstance(x, torch.Tensor) for x in logits) and logits[0].shape == logits[1].shape \
        and torch.allclose(logits[0], logits[1], atol=1e-5, rtol=1e-5)


def _with_allocated_cache(prefill: dict[str, Any], decode: dict[str, Any]) -> dict[str, Any]:
    """The prefill's kwargs with its static cache allocated: the decode step's cache emptied
    (zeros, write counters at 0).

    # NOTE: `generate` hands the prefill a `StaticCache` whose layers are not allocated yet
    # (transformers allocates them at the first `update`). Traced so, the prefill allocates the
    # cache inside the graph at `max_cache_len`, a constant: the program takes no cache, its mask's
    # cache length comes out fixed, and the decode's buffers are not the ones the prefill wrote.
    # Allocated, the prefill takes the same buffers as the decode and writes into them in place,
    # and both keep the cache length symbolic (resizable at load).
    """
    key = next((k for k in CACHE_KEYS if k in prefill), None)
    source = next((decode[k] for k in CACHE_KEYS if k in decode), None)
    if key is None or source is None or all(getattr(layer, "is_initialized", False) for layer in prefill[key].layers):
        return prefill
    cache = copy.deepcopy(source)
    cache.reset()
    return {**prefill, key: cache}


def _static_prefill(model: torch.nn.Module, prefill: dict[str, Any], decode: dict[str, Any],
                    prompt: dict[str, Any]) -> Component:
    """The prefill of a static cache: its cache allocated (`_with_allocated_cache`) and, like the
    decode's, one boolean causal mask over the whole cache in place of generate's 2-D one,
    when the model gives the same logits with it.

    # NOTE: `generate` passes the prefill a 2-D padding mask (or none) and the model builds its 4-D masks
    # over `max_cache_len` slots, a Python int of the cache layers: traced so, the cache length
    # comes out fixed at that number. The decode's captured mask tells the layout the model takes
    # (`masks.mask_layout`); the prefill's mask in that layout is checked by running the model
    # both ways on the capture's prompt, and kept only if the logits agree. A model with a mask per
    # attention kind (Qwen2, Qwen3) is passed `{"full_attention": None}` for a prompt without
    # padding (beside a 4-D `sliding_attention` mask where some layers slide): traced so, SDPA's
    # `is_causal` is fixed by the sample's query length (a 1-token prompt would attend every slot of
    # the cache, the empty ones too), and a sliding mask's head axis (1) was kept dynamic and failed to
    # broadcast; it is given the one causal mask too, in the decode's layout.
    """
    from .masks import causal_mask, mask_layout

    prefill = _with_allocated_cache(prefill, decode)
    mask, ids = decode.get("attention_mask"), prefill.get("input_ids")
    layout = mask_layout(model.config, mask, static=True)
    given = prefill.get("attention_mask")  # generate leaves out a mask of ones
    if isinstance(given, dict) and all(each is None or getattr(each, "ndim", 0) == 4 for each in given.values()):
        given = None  # generate's mask per attention kind, None where SDPA's causal skip leaves it out (Qwen2, Qwen3)
    if layout is None or not isinstance(ids, torch.Tensor) or given is not None and getattr(given, "ndim", 0) != 2:
        return _with_causal_mask(model, [prefill], prefill, prompt, past=0)
    length = next(iter(mask.values())).shape[-1] if isinstance(mask, dict) else mask.shape[-1]
    padding = prompt.get("attention_mask", torch.ones_like(ids))
    candidate = {**prefill, "attention_mask": causal_mask(padding, 0, ids.shape[1], length)}
    module, traced = fronted(model, interface_kwargs(candidate), None if layout == [(None, None, torch.bool)] else layout)
    if _same_logits(model, prefill, module, traced):
        return module, traced
    return _with_causal_mask(model, [prefill], prefill, prompt, past=0)


#: Forward kwargs laid out along the query (new tokens) axis, and that axis.
_QUERY_AXIS = {
    "input_ids": 1, "position_ids": -1, "cache_position": 0, "inputs_embeds": 1, "token_type_ids": 1,
    "decoder_input_ids": 1, "decoder_position_ids": -1, "decoder_inputs_embeds": 1,
}


def merge_decode_steps(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One forward doing two consecutive decode steps: the cache as `first` saw it, the new tokens
    of both calls along the query axis.

    # NOTE: what makes the query axis symbolic (`multi_token_decode`). Every query-aligned input is merged,
    # whatever container holds it (a dict of masks per layer type, a list, a tuple):
    # `_QUERY_AXIS` inputs are concatenated; a 4D attention mask (`[b, 1, q, kv]`, what `generate`
    # passes with a static cache) stacks its query rows; a 2D one covers past + new tokens, so the
    # later call's is the merged one. Logits are kept for every query position
    # (`logits_to_keep=0`): a caller checking a block of speculative tokens, or prefilling, needs
    # them all.
    """
    merged = {key: value if key in CACHE_KEYS else _merged(key, value, second.get(key))
              for key, value in first.items()}
    if "logits_to_keep" in merged:
        merged["logits_to_keep"] = 0
    return merged


def _merged(key: str, value: Any, later: Any) -> Any:
    """`value` (first step) and `later` (second step) of input `key` as one two-step input."""
    if isinstance(value, dict) and isinstance(later, dict) and set(value) == set(later):
        return {k: _merged(key, v, later[k]) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and isinstance(later, (list, tuple)) and len(value) == len(later):
        return type(value)(_merged(key, v, w) for v, w in zip(value, later))
    if not isinstance(value, torch.Tensor) or not isinstance(later, torch.Tensor):
        return value
    if key in _QUERY_AXIS:
        return torch.cat([value, later], dim=_QUERY_AXIS[key])
    if key.endswith("attention_mask"):
        return torch.cat([value, later], dim=-2) if value.dim() == 4 else later
    if torch.equal(value, later) if value.shape == later.shape else False:
        return value
    raise PrepareError(
        f"decode input {key!r} changes between two decode steps ({list(value.shape)} then {list(later.shape)}) "
        "and is not known to be laid out along the query axis, so the two steps cannot be merged",
        remedy="export without multi_token_decode=True, or report this model class so its input gets a query axis",
    )


def planned_components(model: torch.nn.Module, plan: Any) -> dict[str, tuple[torch.nn.Module, dict[str, Any]]]:
    """`{name: (module, kwargs)}` that a `GenerationPlan` exports: the backend's own components
    (`plan.components`), or what `decompose_for_generation` captures from one `generate()` run
    with the plan's arguments."""
    if plan.components is not None:
        return plan.components
    return decompose_for_generation(model, plan.inputs, generation_config=plan.generation_config,
                                    multi_token_decode=plan.multi_token_decode, decode_prefills=plan.decode_prefills,
                                    runner_components=plan.runner_components)
