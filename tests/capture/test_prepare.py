"""Prepare step: attention checks, input normalisation, and the model left as it was."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.errors import CaptureError, PrepareError
from hfexport.presets import build_preset


@pytest.mark.parametrize("impl", ["flash_attention_2", "flex_attention"])
def test_unexportable_attention_is_refused_before_tracing(impl):
    model, inputs = build_preset("llama")
    model.config._attn_implementation = impl
    with pytest.raises(PrepareError) as info:
        DynamoExporter().export(model, inputs, config=DynamoConfig())
    message = str(info.value)
    assert impl in message and 'model.set_attn_implementation("sdpa")' in message
    assert "LlamaForCausalLM" in message


def test_batch_encoding_inputs_are_accepted():
    from transformers import BatchEncoding

    model, inputs = build_preset("bert")
    program = DynamoExporter().export(model, BatchEncoding(inputs), config=DynamoConfig())
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    assert torch.allclose(program.module()(**inputs).last_hidden_state, expected, atol=1e-5)


def test_non_dict_inputs_get_a_clear_error():
    model, inputs = build_preset("bert")
    with pytest.raises(PrepareError, match="dict of forward keyword arguments"):
        DynamoExporter().export(model, (inputs["input_ids"],), config=DynamoConfig())


def test_model_is_left_unchanged_after_a_failed_export():
    model, inputs = build_preset("llama")
    model.train()
    model.model.layers[0].eval()  # a mixed state must come back exactly
    impl = model.config._attn_implementation
    flags = [m.training for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    bad_inputs = dict(inputs, input_ids=inputs["input_ids"].float())  # embedding rejects float ids
    with pytest.raises(CaptureError) as info:
        DynamoExporter().export(model, bad_inputs, config=DynamoConfig())
    assert "LlamaForCausalLM" in str(info.value) and "What to do" in str(info.value)
    assert [m.training for m in model.modules()] == flags
    assert model.config._attn_implementation == impl
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.is_grad_enabled()
