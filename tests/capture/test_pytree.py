"""Cache classes as pytree nodes: flatten/unflatten round trips and `torch.export.save`/`load`."""

from __future__ import annotations

import copy
import gc
import importlib
import json
import re
import sys
import zipfile

import pytest
import torch
import torch.utils._pytree as pytree
from transformers import DynamicCache, EncoderDecoderCache, StaticCache
from transformers.cache_utils import LinearAttentionLayer, StaticLayer

from hfexport import DynamoConfig, DynamoExporter, register_pytree_node
from hfexport.capture.pytree import (_table_class, _to_dumpable_context, flatten_with_names, from_dumpable_context,
                                     register_cache_pytree_nodes)
from hfexport.errors import RuntimeLoadError
from hfexport.presets import build_preset
from tests.backends.dynamo.archives import cache_context_edited, file_closer, rewrite


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
    assert from_dumpable_context(dumped)[2][0][0] is StaticLayer  # the classes it names come back
    with pytest.raises(RuntimeLoadError, match=f"(?s){name}:StaticLayer.*nothing was imported.*register_pytree_node"):
        from_dumpable_context(dumped.replace("transformers.cache_utils:StaticLayer", f"{name}:StaticLayer"))
    for other in ("torch:save", "transformers.cache_utils:os.remove", "transformers.utils.hub:tempfile.TemporaryFile"):
        with pytest.raises(RuntimeLoadError, match="not a cache class registered"):
            from_dumpable_context(dumped.replace("transformers.cache_utils:StaticLayer", other))
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


def test_only_the_cache_classes_a_caller_registered_and_layer_classes_resolve(tmp_path, monkeypatch):
    name = f"hfx_user_cache_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("from transformers import DynamicCache\n"
                                         "from transformers.cache_utils import DynamicLayer\n"
                                         "class UserCache(DynamicCache): pass\nclass UserLayer(DynamicLayer): pass\n"
                                         "class Other: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)  # the user imports what they trust
    with pytest.raises(RuntimeLoadError, match="not a cache class registered"):
        _table_class(f"{name}:UserCache")
    register_pytree_node(module.UserCache)
    assert _table_class(f"{name}:UserCache") is module.UserCache
    assert _table_class(f"{name}:UserLayer") is module.UserLayer  # a CacheLayerMixin subclass
    assert _table_class("transformers.cache_utils:LinearAttentionLayer") is LinearAttentionLayer  # the SSM layers' base
    for refused in (f"{name}:Other", f"{name}:UserCache.__mro__", "transformers.cache_utils:DynamicCache.__new__",
                    "transformers:DynamicCache", "transformers.cache_utils:Cache.__subclasses__"):
        with pytest.raises(RuntimeLoadError, match="not a cache class registered"):
            _table_class(refused)


def _static_context() -> list:
    """A real `StaticCache`'s dumped context, as JSON data to edit."""
    register_pytree_node(StaticCache)
    cache = StaticCache(config=build_preset("llama")[0].config, max_cache_len=8)
    return json.loads(pytree.treespec_dumps(pytree.tree_flatten(cache)[1]))[1]["context"]


def _edited(context: str, edit) -> str:
    tree = json.loads(context)
    edit(tree["t"])
    return json.dumps(tree)


def _layer_state(fields: list) -> dict:
    """The (name, value) pairs `_dump_value` writes for a layer's state."""
    return {"t": [{"t": [name, value]} for name, value in fields]}


#: edits of a real StaticCache context, each of which hfexport never writes
_BAD_CONTEXTS = {
    "class outside the table": (lambda t: t[2]["t"][0]["t"].__setitem__(0, {"class": "torch.nn:Module"}),
                                "not a cache class registered"),
    "dunder attribute": (lambda t: t[2]["t"][0]["t"].__setitem__(2, _layer_state([("__class__", 1)])),
                         "'__class__'"),
    "a method's name": (lambda t: t[2]["t"][0]["t"].__setitem__(2, _layer_state([("update", 1)])), "'update'"),
    "dtype naming a function": (lambda t: t[2]["t"][0]["t"].__setitem__(2, _layer_state([("dtype", {"dtype": "load"})])),
                                "'load', which is not a torch.dtype"),
    "dtype naming a submodule": (lambda t: t[2]["t"][0]["t"].__setitem__(2, _layer_state([("dtype", {"dtype": "onnx"})])),
                                 "not a torch.dtype"),
    "device": (lambda t: t[2]["t"][0]["t"].__setitem__(2, _layer_state([("device", {"device": "cpu;x"})])),
               "never writes"),
    "unknown kind": (lambda t: t[2]["t"][0]["t"].__setitem__(2, _layer_state([("x", {"eval": "1"})])), "never writes"),
    "a list": (lambda t: t[2]["t"][0]["t"].__setitem__(2, [1]), "never writes"),
    "five fields": (lambda t: t.pop(), "6 fields"),
    "class value outside the table": (lambda t: t[5]["t"].append({"t": ["layer_class_to_replicate",
                                                                         {"class": "builtins:eval"}]}),
                                      "not a cache class registered"),
}


@pytest.mark.parametrize("case", list(_BAD_CONTEXTS))
def test_a_context_of_another_shape_is_refused(case):
    context = _static_context()
    assert isinstance(from_dumpable_context(context)[0], type)  # the real one loads
    edit, message = _BAD_CONTEXTS[case]
    with pytest.raises(RuntimeLoadError, match=re.escape(message)):
        from_dumpable_context(_edited(context, edit))


def test_real_cache_contexts_with_underscored_attributes_load():
    """A leading underscore is a real cache's own attribute (the sliding-window layers'
    `_is_croppable`, `_sliding_window_tensor`): only dunder names are refused."""
    config = build_preset("mistral")[0].config
    register_cache_pytree_nodes()
    dumped = []
    for cache in (DynamicCache(config=config), StaticCache(config=config, max_cache_len=8),
                  EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))):
        spec = pytree.tree_flatten(cache)[1]
        dumped.append(pytree.treespec_dumps(spec))
        assert pytree.treespec_loads(dumped[-1]) == spec
    assert "_is_croppable" in dumped[1] and "_sliding_window_tensor" in dumped[0]


def test_a_tree_spec_that_builds_a_file_closer_is_refused_and_deletes_nothing(static_decode_pt2, tmp_path):
    """The attack on the old class lookup (a module prefix, then any attribute chain):
    `transformers.utils.hub:tempfile._TemporaryFileCloser`, rebuilt with `__new__` and a state naming
    a file, deleted that file when collected."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    tampered = rewrite(static_decode_pt2, tmp_path / "decode.pt2", cache_context_edited(file_closer(victim)))
    register_pytree_node(StaticCache)
    with pytest.raises(RuntimeLoadError, match="'transformers.utils.hub:tempfile._TemporaryFileCloser', which is not"):
        program = torch.export.load(tampered)
        spec = program.call_spec.in_spec
        pytree.tree_unflatten([torch.zeros(1)] * spec.num_leaves, spec)  # what a runner does with the spec
    gc.collect()
    assert victim.read_text() == "keep me"
