"""The dynamic-shapes plan and the batch growth of a sample, on a recurrent-state cache."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from hfexport.capture.dynamic import grow_batch, plan_dynamic_shapes
from hfexport.generation.decompose import interface_kwargs
from hfexport.presets import build_preset
from hfexport.utils import decompose_for_generation


def _mamba_decode_kwargs():
    model, inputs = build_preset("mamba")
    return interface_kwargs(decompose_for_generation(model, inputs)["decode"][1])


def test_a_recurrent_state_grows_with_the_batch():
    """ExecuTorch traces at batch 2; Mamba's states (`[batch, channels, kernel]`, `[batch, channels,
    state]`) must grow with the tokens, or `cat([conv_state, tokens])` fails at capture. Called on
    the raw decode kwargs, before any export registered the cache classes."""
    kwargs = _mamba_decode_kwargs()
    grown = grow_batch(kwargs)
    states = [leaf for leaf in pytree.tree_leaves(grown["past_key_values"]) if isinstance(leaf, torch.Tensor)]
    assert grown["input_ids"].shape[0] == 2 and states
    assert all(state.shape[0] == 2 and state.dim() == 3 for state in states)
    original = [leaf for leaf in pytree.tree_leaves(kwargs["past_key_values"]) if isinstance(leaf, torch.Tensor)]
    assert all(torch.equal(g[1], o[0]) for g, o in zip(states, original))


def test_a_recurrent_state_has_a_dynamic_batch_and_fixed_widths():
    """Its channels and kernel/state widths are the weights': a resized check that widened a conv
    state gave eager a state the model cannot take (and a 'mismatch')."""
    kwargs = _mamba_decode_kwargs()
    plan = plan_dynamic_shapes(kwargs, dynamic=True, dynamic_shapes=None)
    for axes in plan["past_key_values"]:
        assert axes[0] == torch.export.Dim.AUTO
        assert axes[1] == axes[2] == torch.export.Dim.STATIC
