"""The dynamic-shapes plan and the batch growth of a sample, on a recurrent-state cache."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from hfexport.capture.dynamic import plan_dynamic_shapes
from hfexport.capture.pytree import register_cache_pytree_nodes
from hfexport.generation.components import interface_kwargs
from hfexport.presets import build_preset
from hfexport.utils import decompose_for_generation

#: Run in a fresh interpreter: in this one, an earlier test's export may already have registered
#: the cache classes, which is exactly what `grow_batch` must not rely on.
_GROW_IN_A_FRESH_PROCESS = """
import json, torch
import torch.utils._pytree as pytree
from hfexport.capture.dynamic import grow_batch
from hfexport.generation.components import interface_kwargs
from hfexport.presets import build_preset
from hfexport.utils import decompose_for_generation

model, inputs = build_preset("mamba")
kwargs = interface_kwargs(decompose_for_generation(model, inputs)["decode"][1])
grown = grow_batch(kwargs)
states = lambda k: [t for t in pytree.tree_leaves(k["past_key_values"]) if isinstance(t, torch.Tensor)]
print(json.dumps({"input_ids": list(grown["input_ids"].shape),
                  "states": [list(s.shape) for s in states(grown)],
                  "rows_kept": all(torch.equal(g[1], o[0]) for g, o in zip(states(grown), states(kwargs)))}))
"""


@pytest.mark.slow
def test_a_recurrent_state_grows_with_the_batch():
    """ExecuTorch traces at batch 2; Mamba's states (`[batch, channels, kernel]`, `[batch, channels,
    state]`) must grow with the tokens, or `cat([conv_state, tokens])` fails at capture. Called on
    the raw decode kwargs, before any export registered the cache classes."""
    done = subprocess.run([sys.executable, "-c", _GROW_IN_A_FRESH_PROCESS], capture_output=True, text=True,
                          check=True)
    grown = json.loads(done.stdout.strip().splitlines()[-1])
    assert grown["input_ids"][0] == 2 and grown["states"]
    assert all(shape[0] == 2 and len(shape) == 3 for shape in grown["states"])
    assert grown["rows_kept"]


def test_a_recurrent_state_has_a_dynamic_batch_and_fixed_widths():
    """Its channels and kernel/state widths are the weights': a resized check that widened a conv
    state gave eager a state the model cannot take (and a 'mismatch')."""
    model, inputs = build_preset("mamba")
    kwargs = interface_kwargs(decompose_for_generation(model, inputs)["decode"][1])
    register_cache_pytree_nodes(kwargs)  # as `capture` does before it plans
    plan = plan_dynamic_shapes(kwargs, dynamic=True, dynamic_shapes=None)
    assert plan["past_key_values"]
    for axes in plan["past_key_values"]:
        assert axes[0] == torch.export.Dim.AUTO
        assert axes[1] == axes[2] == torch.export.Dim.STATIC


@pytest.mark.slow
def test_a_cache_with_one_key_value_head_keeps_heads_and_head_size_static(tmp_path):
    """With one key/value head the cache's heads axis traced symbolic (size 1) and only a guard
    tied it: a runner sizing the static cache from the declared shapes took it for the cache
    length (the fuzzer's Phi-3: refused on Dynamo, wrong logits on OpenVINO). The weights fix
    heads and head size: the plan keeps them static."""
    from transformers import GenerationConfig

    from hfexport import DynamoConfig, GenerationRunner
    from hfexport.job.export import GenerationOptions, export_to_folder

    model, inputs = build_preset("llama", num_key_value_heads=1)
    result = export_to_folder((model, inputs), DynamoConfig(dynamic=True), tmp_path / "export",
                              generation=GenerationOptions(static_cache=24))
    cache = [i for i in result.manifest["components"]["decode"]["inputs"] if i["name"].endswith(".keys")]
    assert cache and all(isinstance(i["shape"][1], int) and isinstance(i["shape"][3], int) for i in cache)
    prompt = inputs["input_ids"][:1, :5]
    with torch.no_grad():
        want = model.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                              generation_config=GenerationConfig(cache_implementation="static", max_cache_len=24))
    assert GenerationRunner.load(result.directory).generate(prompt, max_new_tokens=3).tokens == want[0, 5:].tolist()


@pytest.mark.parametrize(("bounds", "size", "asked_max", "narrowed"), [
    ((1, 2), 2, 2, False),    # bounded at the sample and kept whole
    ((1, 3), 2, 3, False),    # bounded just past it
    ((2, 3), 2, 8, True),     # asked 8, kept 2..3: only the sample and its neighbour
    ((2, 2), 2, 2, True),     # a single size
    ((1, 8), 2, 8, False),
    ((1, 2), 2, None, True),  # no bound asked: the old rule
])
def test_a_range_is_narrowed_only_when_it_falls_short_of_the_bound_asked(bounds, size, asked_max, narrowed):
    from hfexport.capture.dynamic import _narrowed

    spec = torch.export.Dim("batch", min=1, max=asked_max) if asked_max else torch.export.Dim.DYNAMIC
    assert _narrowed(bounds, size, spec) is narrowed
