"""export_for_generation on every backend: each component matches its eager submodule."""

from __future__ import annotations

import pytest
import torch

from hfexport import AutoExportConfig, AutoHfExporter, validate_components
from hfexport.presets import build_preset
from hfexport.utils import decompose_for_generation
from tests.harness import require_backend

CASES = [
    ("dynamo", "llama"), ("dynamo", "gpt2"), ("dynamo", "mistral"), ("dynamo", "qwen3_moe"),
    ("dynamo", "t5"), ("dynamo", "whisper"), ("dynamo", "llava"),
    ("onnx", "llama"), ("onnx", "t5"), ("onnx", "llava"),
    ("openvino", "llama"), ("openvino", "t5"), ("openvino", "llava"),
    ("executorch", "llava"),  # ExecuTorch's Llama/Mistral/T5 components: tests/generation/test_runner.py
]


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "name"), CASES, ids=[f"{f}-{n}" for f, n in CASES])
def test_every_component_matches_its_eager_submodule(fmt, name):
    require_backend(fmt)
    model, inputs = build_preset(name)
    inputs = {k: v for k, v in inputs.items() if not k.startswith("decoder_")}
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    exporter = AutoHfExporter.from_config(config)
    artifacts = exporter.export_for_generation(model, inputs, config=config)
    # the components as the backend plans them (OpenVINO: one decode that also prefills)
    plan = exporter.plan_generation(model, inputs, config)
    components = decompose_for_generation(model, plan.inputs, plan.generation_config, plan.multi_token_decode,
                                          decode_prefills=plan.decode_prefills)
    assert list(artifacts) == list(components)
    for component, report in validate_components(artifacts, components).items():
        assert report.passed, f"{component}:\n{report.to_table()}"


def test_non_generative_model_is_refused():
    from hfexport import DynamoExporter
    from hfexport.errors import PrepareError

    model, inputs = build_preset("bert")
    with pytest.raises(PrepareError, match="cannot generate"):
        DynamoExporter().export_for_generation(model, inputs)


@pytest.mark.slow
def test_decode_component_runs_a_greedy_step_like_generate():
    """The exported prefill + decode, fed their own cache, give generate()'s next tokens."""
    from hfexport import DynamoConfig, DynamoExporter

    model, inputs = build_preset("llama")
    artifacts = DynamoExporter().export_for_generation(model, inputs, config=DynamoConfig(dynamic=True))
    components = decompose_for_generation(model, inputs)
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=2, min_new_tokens=2, do_sample=False)[0, -2:]
    prefill_kwargs = {k: v for k, v in components["prefill"][1].items() if k in ("input_ids", "position_ids")}
    out = artifacts["prefill"].module()(**prefill_kwargs, past_key_values=components["prefill"][1]["past_key_values"])
    first = out.logits[:, -1].argmax(-1, keepdim=True)
    position = torch.tensor([[inputs["input_ids"].shape[1]]])
    step = artifacts["decode"].module()(input_ids=first, past_key_values=out.cache, position_ids=position)
    second = step.logits[:, -1].argmax(-1)
    assert [int(first), int(second)] == expected.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["dynamo", "executorch"])
def test_mamba_prefill_is_refused_naming_the_sequence_its_scan_loops_over(fmt):
    """Mamba's CPU path scans the prompt with a Python loop, so its prefill program fixes the
    prompt length; it used to come back as if dynamic (and ran other lengths wrong or not at all).
    Its one-token decode keeps the batch dynamic: checked at batch 3."""
    from hfexport.errors import CaptureError

    require_backend(fmt)
    model, inputs = build_preset("mamba")
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    exporter = AutoHfExporter.from_config(config)
    components = decompose_for_generation(model, inputs)
    with pytest.raises(CaptureError, match=r"input_ids, axis 1 \(sequence; traced at 8\)"):
        exporter.export_components({"prefill": components["prefill"]}, config)
    decode = exporter.export_components({"decode": components["decode"]}, config)
    report = validate_components(decode, components)["decode"]
    assert report.passed and report.cases[1].input_shapes["input_ids"][0] == 3, report.to_table()
