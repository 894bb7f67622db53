"""Cache classes as pytree nodes: flatten/unflatten round trips and `torch.export.save`/`load`."""

from __future__ import annotations

import copy
import importlib
import sys
import zipfile

import pytest
import torch
import torch.utils._pytree as pytree
from transformers import DynamicCache, EncoderDecoderCache, StaticCache
from transformers.cache_utils import StaticLayer

from hfexport import DynamoConfig, DynamoExporter, register_pytree_node
from hfexport.capture.pytree import (_from_dumpable_context, _import_qualname, _to_dumpable_context, flatten_with_names,
                                     register_cache_pytree_nodes)
from hfexport.errors import RuntimeLoadError
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


def _decode_kwargs(model, inputs, cache, max_cache_len=16):
    prompt = inputs["input_ids"]
    positions = torch.arange(prompt.shape[1])
    mask = (torch.arange(max_cache_len)[None, :] <= positions[:, None])[None, None]
    return {"input_ids": prompt, "attention_mask": mask, "position_ids": positions[None], "past_key_values": cache}


@pytest.fixture(scope="module")
def static_decode_pt2(llama, tmp_path_factory):
    """A static-cache decode program of the tiny Llama, saved with `torch.export.save`."""
    model, inputs = llama
    cache = _filled_static(model.config)
    cache.reset()
    program = DynamoExporter().export(model, _decode_kwargs(model, inputs, cache), config=DynamoConfig())
    path = tmp_path_factory.mktemp("pytree") / "decode.pt2"
    torch.export.save(program, path)
    return path


def test_static_cache_program_saves_loads_and_updates_the_cache_in_place(llama, static_decode_pt2):
    model, inputs = llama
    register_pytree_node(StaticCache)
    loaded = torch.export.load(static_decode_pt2)
    _, example_kwargs = loaded.example_inputs
    fresh = copy.deepcopy(example_kwargs["past_key_values"])
    fresh.reset()
    out = loaded.module()(**_decode_kwargs(model, inputs, fresh))

    reference_cache = StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        reference = model(**_decode_kwargs(model, inputs, reference_cache))
    assert torch.allclose(out.logits, reference.logits, atol=1e-5)
    # the cache passed in was written in place: same contents, same write position
    assert int(fresh.layers[0].cumulative_length) == inputs["input_ids"].shape[1]
    assert torch.allclose(fresh.layers[1].keys, reference_cache.layers[1].keys, atol=1e-5)


@pytest.fixture
def side_effect_module(tmp_path, monkeypatch):
    """`(name, marker)`: a module on `sys.path` that writes `marker` when imported."""
    name = f"hfx_side_effect_{tmp_path.name.replace('-', '_')}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\nclass StaticLayer: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    sys.modules.pop(name, None)


def test_a_context_naming_another_module_is_refused_before_importing_it(side_effect_module):
    name, marker = side_effect_module
    dumped = _to_dumpable_context((StaticCache, True, ((StaticLayer, ("keys",), ()),), (), (), ()))
    assert _from_dumpable_context(dumped)[2][0][0] is StaticLayer  # the classes it names come back
    with pytest.raises(RuntimeLoadError, match=f"(?s){name}.*not imported.*register_pytree_node"):
        _from_dumpable_context(dumped.replace("transformers.cache_utils:StaticLayer", f"{name}:StaticLayer"))
    with pytest.raises(RuntimeLoadError, match="not a class"):
        _from_dumpable_context(dumped.replace("transformers.cache_utils:StaticLayer", "torch:save"))
    assert not marker.exists() and name not in sys.modules


def test_a_pt2_whose_tree_spec_names_another_module_is_refused_by_torch_export_load(static_decode_pt2, tmp_path,
                                                                                   side_effect_module):
    name, marker = side_effect_module
    tampered = tmp_path / "tampered.pt2"
    found = 0
    with zipfile.ZipFile(static_decode_pt2) as source, zipfile.ZipFile(tampered, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            found += data.count(b"transformers.cache_utils:StaticLayer")
            target.writestr(item, data.replace(b"transformers.cache_utils:StaticLayer", f"{name}:StaticLayer".encode()))
    assert found  # the spec's context names the layer class
    register_pytree_node(StaticCache)
    with pytest.raises(RuntimeLoadError, match=name):
        torch.export.load(tampered)
    assert not marker.exists() and name not in sys.modules


def test_a_class_of_a_module_the_caller_registered_a_cache_from_is_resolved(tmp_path, monkeypatch):
    name = f"hfx_user_cache_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("from transformers import DynamicCache\n"
                                         "class UserCache(DynamicCache): pass\nclass UserLayer: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)  # the user imports what they trust
    with pytest.raises(RuntimeLoadError, match="not imported"):
        _import_qualname(f"{name}:UserLayer")
    register_pytree_node(module.UserCache)
    assert _import_qualname(f"{name}:UserLayer") is module.UserLayer
