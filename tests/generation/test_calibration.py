"""`generation.calibration.captured_calibration`: each component's inputs captured once per
calibration prompt, and a plan whose components the backend built itself refused (no export)."""

from __future__ import annotations

import pytest
import torch

from hfexport.errors import PrepareError
from hfexport.exporter import GenerationPlan
from hfexport.generation.calibration import captured_calibration
from hfexport.generation.decompose import decompose_for_generation
from hfexport.presets import build_preset


def test_each_component_gets_its_inputs_captured_on_every_prompt():
    model, inputs = build_preset("llama")
    plan = GenerationPlan(inputs, None, False, False, None)
    prompts = [{"input_ids": torch.tensor([[5, 9, 3]])}, {"input_ids": torch.tensor([[7, 1, 8, 2, 4, 6]])}]
    captured = captured_calibration(lambda asked: decompose_for_generation(model, asked.inputs), plan, prompts)
    assert set(captured) == {"prefill", "decode"} and all(len(samples) == 2 for samples in captured.values())
    # the prefill takes each prompt whole; the decode takes one token after it
    assert [s["input_ids"].shape[1] for s in captured["prefill"]] == [3, 6]
    assert [s["input_ids"].shape[1] for s in captured["decode"]] == [1, 1]
    assert [s["past_key_values"].get_seq_length() for s in captured["decode"]] == [3, 6]


def test_a_plan_with_the_backends_own_components_is_refused():
    model, inputs = build_preset("llama")
    plan = GenerationPlan(inputs, None, True, False, None, components={"model": (model, inputs)})
    with pytest.raises(PrepareError, match="from the sample prompt only"):
        captured_calibration(lambda asked: pytest.fail("captured"), plan, [inputs])


def test_executorchs_llm_runner_program_refuses_calibration_on_several_prompts():
    from types import SimpleNamespace

    from hfexport.backends.executorch.llm_export import _refuse_prompt_calibration

    def config(samples):
        quantizer = SimpleNamespace(needs_calibration=True, calibration_samples=lambda: samples)
        return SimpleNamespace(quantizer=quantizer)

    _refuse_prompt_calibration(config([{}]))  # the program's own captured sample (a model without a tokenizer)
    _refuse_prompt_calibration(SimpleNamespace(quantizer=None))
    with pytest.raises(PrepareError, match="--no-llm-runner"):
        _refuse_prompt_calibration(config([{}, {}]))
