"""Cache classes as pytree nodes: flatten/unflatten round trips and `torch.export.save`/`load`."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils._pytree as pytree
from transformers import DynamicCache, EncoderDecoderCache, StaticCache

from hfexport import DynamoConfig, DynamoExporter, register_pytree_node
from hfexport.capture.pytree import flatten_with_names, register_cache_pytree_nodes
from hfexport.presets import build_preset


@pytest.fixture(scope="module")
def llama():
    return build_preset("llama")


def _filled_dynamic(config):
    cache = DynamicCache(config=config)
    for layer in range(config.num_hidden_layers):
        cache.update(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), layer)
    return cache


def _filled_static(config, length=16):
    cache = StaticCache(config=config, max_cache_len=length)
    for layer in range(config.num_hidden_layers):
        cache.update(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), layer)
    return cache


@pytest.mark.parametrize("make", [_filled_dynamic, _filled_static], ids=["dynamic", "static"])
def test_cache_round_trips_through_flatten(llama, make):
    model, _ = llama
    register_cache_pytree_nodes()
    cache = make(model.config)
    leaves, spec = pytree.tree_flatten(cache)
    rebuilt = pytree.tree_unflatten(leaves, spec)
    assert type(rebuilt) is type(cache)
    assert rebuilt.get_seq_length() == cache.get_seq_length()
    for a, b in zip(cache.layers, rebuilt.layers):
        assert type(a) is type(b) and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    # the same structure flattens to the same spec, so a program exported with one accepts another
    assert pytree.tree_flatten(make(model.config))[1] == spec


def test_encoder_decoder_cache_flattens_both_halves(llama):
    model, _ = llama
    register_cache_pytree_nodes()
    cache = EncoderDecoderCache(_filled_dynamic(model.config), _filled_dynamic(model.config))
    names = [name for name, _ in flatten_with_names({"cache": cache})]
    assert "cache.self_attention.0.keys" in names and "cache.cross_attention.1.values" in names
    rebuilt = pytree.tree_unflatten(*pytree.tree_flatten(cache))
    assert torch.equal(rebuilt.cross_attention_cache.layers[1].values, cache.cross_attention_cache.layers[1].values)


def test_static_cache_program_saves_loads_and_updates_the_cache_in_place(llama, tmp_path):
    model, inputs = llama
    max_cache_len, prompt = 16, inputs["input_ids"]
    positions = torch.arange(prompt.shape[1])
    mask = (torch.arange(max_cache_len)[None, :] <= positions[:, None])[None, None]

    def call_kwargs(cache):
        return {"input_ids": prompt, "attention_mask": mask, "position_ids": positions[None],
                "past_key_values": cache}

    cache = _filled_static(model.config)
    cache.reset()
    program = DynamoExporter().export(model, call_kwargs(cache), config=DynamoConfig())
    torch.export.save(program, tmp_path / "decode.pt2")

    register_pytree_node(StaticCache)
    loaded = torch.export.load(tmp_path / "decode.pt2")
    _, example_kwargs = loaded.example_inputs
    fresh = copy.deepcopy(example_kwargs["past_key_values"])
    fresh.reset()
    out = loaded.module()(**call_kwargs(fresh))

    reference_cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    with torch.no_grad():
        reference = model(**call_kwargs(reference_cache))
    assert torch.allclose(out.logits, reference.logits, atol=1e-5)
    # the cache passed in was written in place: same contents, same write position
    assert int(fresh.layers[0].cumulative_length) == prompt.shape[1]
    assert torch.allclose(fresh.layers[1].keys, reference_cache.layers[1].keys, atol=1e-5)
