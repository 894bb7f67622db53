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
    ("onnx", "llama"), ("openvino", "llama"),
]
#: Cases whose export the runner and image tests share (`saved_generation`: the same preset, format
#: and `dynamic=True`, made once per test run): the export job validated every component against its
#: eager submodule with `validate_components`' defaults, and its report holds each comparison, which
#: these read instead of exporting and validating the same components again (~200 s of the suite).
#: ExecuTorch's Llama/Mistral/T5 components: tests/generation/test_runner.py; its `export_for_generation`
#: call: tests/generation/test_qwen2_vl.py.
SAVED_CASES = [("onnx", "t5"), ("onnx", "llava"), ("openvino", "t5"), ("openvino", "llava"), ("executorch", "llava")]


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


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "name"), SAVED_CASES, ids=[f"{f}-{n}" for f, n in SAVED_CASES])
def test_every_component_of_the_shared_export_matched_its_eager_submodule(saved_generation, fmt, name):
    """The components `export_for_generation` plans for `fmt` (`plan_generation`, as above) are all
    in the shared export, in that order (an image-text folder adds its own among them: the token
    embeddings, ExecuTorch's MultimodalRunner program, OpenVINO's VLMPipeline models), and every
    component of it matched its eager submodule at `validate`'s default tolerance, with no cosine
    floor, at the sample and resized."""
    import json

    from hfexport.validation import default_tolerance

    require_backend(fmt)
    folder = saved_generation(fmt, name).directory
    model, inputs = build_preset(name)  # the shared export's own model is left to its other readers
    inputs = {k: v for k, v in inputs.items() if not k.startswith("decoder_")}
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    plan = AutoHfExporter.from_config(config).plan_generation(model, inputs, config)
    components = decompose_for_generation(model, plan.inputs, plan.generation_config, plan.multi_token_decode,
                                          decode_prefills=plan.decode_prefills)
    reports = json.loads((folder / "report.json").read_text())["components"]
    assert [component for component in reports if component in components] == list(components), list(reports)
    atol, rtol = default_tolerance(fmt, torch.float32)
    for component, entry in reports.items():
        report = entry["validation"]
        assert report["passed"], f"{component}: {report}"
        assert (report["atol"], report["rtol"], report["min_cosine"], report["min_cache_cosine"]) == \
            (atol, rtol, None, None), f"{component}: {report}"
        labels = [case["label"] for case in report["cases"]]
        assert labels[:2] == ["sample", "resized"] and all(case["passed"] for case in report["cases"]), report


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
