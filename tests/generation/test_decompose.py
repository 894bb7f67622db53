"""decompose_for_generation: components found by hooks on generate(), with real kwargs."""

from __future__ import annotations

import copy

import pytest
import torch

from hfexport.errors import PrepareError
from hfexport.generation.front import unwrap
from hfexport.presets import build_preset
from hfexport.utils import decompose_for_generation


def _prompt(name: str):
    model, inputs = build_preset(name)
    return model, {k: v for k, v in inputs.items() if not k.startswith("decoder_")}


@pytest.mark.parametrize(("name", "keys"), [
    ("llama", ["prefill", "decode"]),
    ("gpt2", ["prefill", "decode"]),
    ("mamba", ["prefill", "decode"]),
    ("t5", ["encoder", "prefill", "decode"]),
    ("whisper", ["encoder", "prefill", "decode"]),
])
def test_components_reproduce_what_generate_computed(name, keys):
    model, inputs = _prompt(name)
    components = decompose_for_generation(model, inputs)
    assert list(components) == keys
    with torch.no_grad():
        generated = model.generate(**copy.deepcopy(inputs), max_new_tokens=2, min_new_tokens=2, do_sample=False,
                                   output_logits=True, return_dict_in_generate=True)
        for step, component in enumerate(("prefill", "decode")):
            module, kwargs = components[component]
            logits = module(**copy.deepcopy(kwargs)).logits[:, -1]
            assert torch.allclose(logits, generated.logits[step], atol=1e-5), component
    if "encoder" in components:
        encoder, kwargs = components["encoder"]
        assert unwrap(encoder) is model.get_encoder()
        hidden = encoder(**kwargs).last_hidden_state
        assert torch.allclose(hidden, components["prefill"][1]["encoder_outputs"].last_hidden_state, atol=1e-6)


def test_decode_takes_one_token_and_the_filled_cache():
    model, inputs = _prompt("llama")
    components = decompose_for_generation(model, inputs)
    _, prefill = components["prefill"]
    _, decode = components["decode"]
    assert prefill["input_ids"].shape == inputs["input_ids"].shape
    assert decode["input_ids"].shape == (1, 1)
    assert decode["past_key_values"].get_seq_length() == inputs["input_ids"].shape[1]


def test_the_users_generation_config_is_not_mutated():
    from transformers import GenerationConfig

    model, inputs = _prompt("llama")
    config = GenerationConfig(max_new_tokens=50, do_sample=True, temperature=0.7)
    before = config.to_dict()
    decompose_for_generation(model, inputs, generation_config=config)
    assert config.to_dict() == before


def test_a_model_that_cannot_generate_gets_a_clear_error():
    model, inputs = build_preset("bert")
    with pytest.raises(PrepareError, match="(?s)cannot generate.*exporter.export"):
        decompose_for_generation(model, inputs)


def test_multi_token_decode_merges_two_decode_steps_into_one_call():
    """The merged call (2 new tokens on the cache before them) computes both steps' logits."""
    model, inputs = _prompt("llama")
    components = decompose_for_generation(model, inputs, multi_token_decode=True)
    assert list(components) == ["prefill", "decode"]
    module, kwargs = components["decode"]
    assert kwargs["input_ids"].shape == (1, 2)
    assert kwargs["past_key_values"].get_seq_length() == inputs["input_ids"].shape[1]
    with torch.no_grad():
        generated = model.generate(**copy.deepcopy(inputs), max_new_tokens=3, min_new_tokens=3, do_sample=False,
                                   output_logits=True, return_dict_in_generate=True)
        logits = module(**copy.deepcopy(kwargs)).logits
    assert logits.shape[1] == 2  # every query position, not just the last
    assert torch.allclose(logits[:, 0], generated.logits[1], atol=1e-5)
    assert torch.allclose(logits[:, 1], generated.logits[2], atol=1e-5)


def test_static_cache_multi_token_decode_is_one_graph_with_the_seeds_mask():
    from transformers import GenerationConfig, StaticCache

    model, inputs = _prompt("llama")
    config = GenerationConfig(cache_implementation="static", max_cache_len=16)
    components = decompose_for_generation(model, inputs, generation_config=config, multi_token_decode=True)
    assert list(components) == ["decode"]  # the decode graph prefills too
    _, kwargs = components["decode"]
    assert isinstance(kwargs["past_key_values"], StaticCache)
    assert kwargs["attention_mask"].shape == (1, 1, 2, 16) and kwargs["attention_mask"].dtype == torch.bool
    assert config.to_dict() == GenerationConfig(cache_implementation="static", max_cache_len=16).to_dict()


def test_multimodal_prefill_splits_into_encoder_projector_language_model_and_head():
    model, inputs = build_preset("llava")
    components = decompose_for_generation(model, inputs)
    assert list(components) == ["image_encoder", "multi_modal_projector", "language_model", "lm_head", "decode"]
    assert unwrap(components["image_encoder"][0]) is model.get_encoder(modality="image")
    # asked for what a runner needs besides (an export folder asks): the embedding table on the
    # prompt, the language model's embeddings wherever the token is text
    with_runner = decompose_for_generation(model, inputs, runner_components=True)
    assert list(with_runner) == ["image_encoder", "multi_modal_projector", "language_model", "lm_head",
                                 "text_embeddings", "decode"]
    table, kwargs = with_runner["text_embeddings"]
    assert table is model.get_input_embeddings() and torch.equal(kwargs["input"], inputs["input_ids"])
    text = inputs["input_ids"] != model.config.image_token_index
    with torch.no_grad():
        assert torch.equal(table(kwargs["input"])[text], components["language_model"][1]["inputs_embeds"][text])
    assert unwrap(components["language_model"][0]) is model.get_decoder()
    assert unwrap(components["lm_head"][0]) is model.get_output_embeddings()
    # chained eagerly, the components give generate()'s first token
    with torch.no_grad():
        generated = model.generate(**copy.deepcopy(inputs), max_new_tokens=1, do_sample=False,
                                   output_logits=True, return_dict_in_generate=True)
        language_model, kwargs = components["language_model"]
        hidden = language_model(**copy.deepcopy(kwargs)).last_hidden_state
        logits = components["lm_head"][0](hidden[:, -1])
    assert torch.allclose(logits, generated.logits[0], atol=1e-5)
    # the head's kwargs are what generate fed it: the language model output's last position
    assert torch.equal(components["lm_head"].kwargs["input"], hidden[:, -1:])


def test_a_model_without_projector_gets_none_and_its_tower_feeds_the_language_model():
    """Qwen2-VL merges patches inside its vision tower: no projector key; the tower's merged
    features are exactly the language model's embeddings at the image tokens."""
    model, inputs = build_preset("qwen2_vl")
    components = decompose_for_generation(model, inputs)
    assert list(components) == ["image_encoder", "language_model", "lm_head", "decode"]  # the seed's keys, exactly
    tower, kwargs = components["image_encoder"]
    assert unwrap(tower) is model.get_encoder(modality="image")
    with torch.no_grad():
        merged = tower(**copy.deepcopy(kwargs)).pooler_output
    embeds = components["language_model"][1]["inputs_embeds"][0]
    image_positions = inputs["input_ids"][0] == model.config.image_token_id
    assert torch.equal(embeds[image_positions], merged)
    language_model, kwargs = components["language_model"]
    with torch.no_grad():
        hidden = language_model(**copy.deepcopy(kwargs)).last_hidden_state
    assert torch.equal(components["lm_head"].kwargs["input"], hidden[:, -1:])  # generate's, not repeated


def _static_generate(model, inputs, new_tokens: int, max_cache_len: int):
    from transformers import GenerationConfig

    config = GenerationConfig(cache_implementation="static", max_cache_len=max_cache_len)
    with torch.no_grad():
        return model.generate(**copy.deepcopy(inputs), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, generation_config=config, output_logits=True,
                              return_dict_in_generate=True)


@pytest.mark.parametrize(("name", "overrides", "masks"), [
    ("qwen3", {}, {"full_attention"}),  # a dict of one mask: every config with layer_types
    ("gemma2", {"sliding_window": 3}, {"sliding_attention", "full_attention"}),  # additive float masks
    ("gemma3_text", {"sliding_window": 3}, {"sliding_attention", "full_attention"}),
    ("mistral", {"sliding_window": 3}, None),  # one windowed mask, no layer_types
])
def test_a_static_cache_decode_takes_one_boolean_causal_mask(name, overrides, masks):
    """Whatever masks `generate` gives the model (per layer type, windowed, additive), the decode
    component takes the seed's one causal mask and computes what generate computed."""
    from transformers import GenerationConfig

    from hfexport.generation.front import ComponentFront

    model, inputs = build_preset(name, **overrides)
    components = decompose_for_generation(model, inputs, multi_token_decode=True,
                                          generation_config=GenerationConfig(cache_implementation="static",
                                                                             max_cache_len=16))
    module, kwargs = components["decode"]
    prompt = inputs["input_ids"].shape[1]
    assert kwargs["attention_mask"].dtype == torch.bool and kwargs["attention_mask"].shape == (1, 1, 2, 16)
    expected = torch.arange(16)[None, :] <= torch.arange(prompt, prompt + 2)[:, None]
    assert torch.equal(kwargs["attention_mask"][0, 0], expected)
    assert isinstance(module, ComponentFront)
    if masks is not None:
        assert {key for key, _, _ in module.layout} == masks
    generated = _static_generate(model, inputs, 3, 16)
    with torch.no_grad():
        logits = module(**copy.deepcopy(kwargs)).logits
    torch.testing.assert_close(logits[:, 0], generated.logits[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[:, 1], generated.logits[2], atol=1e-5, rtol=1e-5)


def test_sliding_window_layers_keep_a_full_length_cache():
    """Mistral, window 4, a 6-token prompt: the prefill's cache holds all 6 positions in every
    layer (transformers keeps 3), and nothing about the window is an input."""
    model, inputs = build_preset("mistral", sliding_window=4)
    prompt = {"input_ids": inputs["input_ids"][:, :6], "attention_mask": inputs["attention_mask"][:, :6]}
    components = decompose_for_generation(model, prompt)
    module, kwargs = components["prefill"]
    with torch.no_grad():
        cache = module(**copy.deepcopy(kwargs)).past_key_values
    assert {layer.keys.shape[2] for layer in cache.layers} == {6}
    decode_cache = components["decode"][1]["past_key_values"]
    assert {layer.keys.shape[2] for layer in decode_cache.layers} == {6}
    leaves = [leaf for leaf in torch.utils._pytree.tree_leaves(kwargs) if isinstance(leaf, torch.Tensor)]
    assert all(leaf.numel() != 1 for leaf in leaves[1:])  # no `_sliding_window_tensor` to feed


@pytest.mark.parametrize("name", ["llama", pytest.param("mamba", marks=pytest.mark.slow)])
def test_the_captured_kwargs_are_the_exported_interface(name):
    """The seed's pattern: `submodel(**subinputs)` as a sanity check, then export it on the same
    kwargs; the program takes those kwargs as they are (the cache as `past_key_values`)."""
    from hfexport import DynamoConfig, DynamoExporter

    model, inputs = _prompt(name)
    submodel, subinputs = decompose_for_generation(model, inputs)["decode"]
    assert "past_key_values" in subinputs and "cache" not in subinputs
    with torch.no_grad():
        want = submodel(**copy.deepcopy(subinputs)).logits
        program = DynamoExporter().export(submodel, subinputs, config=DynamoConfig(dynamic=True))
        assert list(program.example_inputs[1]) == list(subinputs)
        got = program.module()(**copy.deepcopy(subinputs)).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_merging_decode_steps_reaches_masks_inside_containers():
    from hfexport.generation.decompose import merge_decode_steps

    row = lambda q: torch.ones(1, 1, 1, 8, dtype=torch.bool) & (torch.arange(8) <= q)  # noqa: E731
    first = {"input_ids": torch.tensor([[5]]), "attention_mask": {"full_attention": row(4), "sliding_attention": row(4)},
             "position_ids": torch.tensor([[4]]), "logits_to_keep": 1}
    second = {"input_ids": torch.tensor([[6]]), "attention_mask": {"full_attention": row(5), "sliding_attention": row(5)},
              "position_ids": torch.tensor([[5]]), "logits_to_keep": 1}
    merged = merge_decode_steps(first, second)
    assert {k: tuple(v.shape) for k, v in merged["attention_mask"].items()} == {
        "full_attention": (1, 1, 2, 8), "sliding_attention": (1, 1, 2, 8)}
    assert merged["position_ids"].tolist() == [[4, 5]] and merged["logits_to_keep"] == 0
    with pytest.raises(PrepareError, match="'rope_deltas' changes between two decode steps"):
        merge_decode_steps({**first, "rope_deltas": torch.ones(1, 2)}, {**second, "rope_deltas": torch.ones(1, 3)})


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "mistral", "qwen3"])
def test_a_static_prefill_takes_the_allocated_cache_and_the_seeds_mask(name):
    """Without multi-token decode, a static cache's prefill used to allocate the cache in the graph
    at max_cache_len: no cache input, the cache length fixed (Mistral's export was refused). It now
    writes into the buffers the decode takes, and both keep the cache length symbolic."""
    from transformers import GenerationConfig

    from hfexport import DynamoConfig, DynamoExporter, record_of

    model, inputs = _prompt(name)
    components = decompose_for_generation(model, inputs, GenerationConfig(cache_implementation="static", max_cache_len=24))
    module, kwargs = components["prefill"]
    assert tuple(kwargs["attention_mask"].shape) == (1, 1, inputs["input_ids"].shape[1], 24)
    assert all(layer.is_initialized and int(layer.cumulative_length) == 0 for layer in kwargs["past_key_values"].layers)
    program = DynamoExporter().export(module, kwargs, config=DynamoConfig(dynamic=True))
    shapes = dict(zip(record_of(program).input_names, record_of(program).input_shapes))
    assert isinstance(shapes["cache.0.keys"][2], str) and isinstance(shapes["attention_mask"][3], str)
    with torch.no_grad():
        want = module(**copy.deepcopy(kwargs)).logits
        got = program.module()(**copy.deepcopy(kwargs)).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
