"""The accuracy gate of a quantized generation export: teacher-forced greedy tokens and logits
against fp32 eager `generate` (generation/accuracy.py), reported, and refused under the floor."""

from __future__ import annotations

import json

import pytest
import torch

from hfexport import AutoExportConfig, GenerationRunner
from hfexport.errors import ValidationError
from hfexport.generation.accuracy import INT4_CRITERIA, INT8_CRITERIA, INT8_DYNAMIC_INT4_CRITERIA
from hfexport.job.export import GenerationOptions, JudgingOptions, export_to_folder
from hfexport.presets import build_preset
from tests.harness import require_backend

pytestmark = pytest.mark.slow  # exports, quantization and generation
CACHE = 40


def _config(fmt: str):
    return AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})


def test_teacher_forced_logits_are_generates_logits(tmp_path):
    from transformers import GenerationConfig

    model, inputs = build_preset("llama")
    prompt = {"input_ids": inputs["input_ids"][:1]}
    export_to_folder((model, prompt), _config("dynamo"), tmp_path, generation=GenerationOptions(static_cache=CACHE),
                     judging=JudgingOptions(validate=False))
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False, output_logits=True,
                             return_dict_in_generate=True,
                             generation_config=GenerationConfig(cache_implementation="static", max_cache_len=CACHE))
    tokens = out.sequences[0, prompt["input_ids"].shape[1]:].tolist()
    got = GenerationRunner.load(tmp_path).score(prompt["input_ids"], tokens)
    assert len(got) == len(tokens)
    for step, (g, w) in enumerate(zip(got, out.logits)):
        torch.testing.assert_close(g, w[0].float(), atol=1e-4, rtol=1e-4, msg=f"step {step}")


def test_a_quantized_generation_export_reports_its_agreement_with_fp32_eager(tmp_path):
    require_backend("onnx")
    model, inputs = build_preset("llama")
    prompt = {"input_ids": inputs["input_ids"][:1]}
    result = export_to_folder((model, prompt), _config("onnx"), tmp_path / "q",
                              generation=GenerationOptions(static_cache=CACHE), quantize="int8-dynamic")
    accuracy = result.report["accuracy"]
    assert accuracy["tokens"] == CACHE - prompt["input_ids"].shape[1]  # as many as the cache holds after the prompt
    assert accuracy["min_agreement"] == INT8_CRITERIA.min_agreement and accuracy["passed"]
    assert accuracy["min_mean_cosine"] == INT8_CRITERIA.min_mean_cosine
    assert accuracy["agreement"] >= 0.9 and accuracy["min_cosine"] >= 0.98  # measured 1.0 and 0.9999
    assert json.loads((tmp_path / "q" / "report.json").read_text())["accuracy"] == accuracy
    timing = result.report["timing"]  # the gate and the quantization are phases of their own
    assert timing["folder"]["gate"] > 0 and all(timing[name]["quantize"] > 0 for name in result.artifacts)
    # the gate's report.json, written after the manifest first listed the files, is hashed anew
    from hfexport.folder.manifest import file_table, read_manifest

    assert read_manifest(tmp_path / "q")["files"] == file_table(tmp_path / "q")


def test_under_the_agreement_floor_nothing_is_written(tmp_path, monkeypatch):
    from hfexport.generation import accuracy

    pytest.importorskip("torchao")
    model, inputs = build_preset("llama")
    prompt = {"input_ids": inputs["input_ids"][:1]}
    measure, floors = accuracy.greedy_agreement, []

    def unreachable(*args, min_agreement, **kwargs):
        """The gate held to a floor no export reaches (above 1, which `JudgingOptions` refuses), after
        noting the floor the options gave it."""
        floors.append(min_agreement)
        return measure(*args, min_agreement=1.01, **kwargs)

    monkeypatch.setattr(accuracy, "greedy_agreement", unreachable)
    with pytest.raises(ValidationError, match="agree with fp32 eager") as caught:
        export_to_folder((model, prompt), _config("dynamo"), tmp_path / "q",
                         generation=GenerationOptions(static_cache=CACHE),
                         judging=JudgingOptions(min_agreement=1.0, accuracy_tokens=6), quantize="int8-dynamic")
    assert caught.value.accuracy.tokens == 6 and floors == [1.0]
    assert not (tmp_path / "q").exists() and not list(tmp_path.iterdir())  # no half-written folder either


@pytest.fixture(scope="module")
def broken_quantizer():
    """`bench/quant_criteria.py`'s ONNX Runtime int4 quantizer with spoiled scales."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from quant_criteria import broken_quantizer

    return broken_quantizer


@pytest.mark.parametrize("broken", [None, "noisy-scale", "wrong-group"])
def test_default_criteria_write_a_correct_int4_export_and_refuse_a_broken_one(broken, broken_quantizer, tmp_path):
    """The quantized-export criteria a user gets without a tolerance (`quantized_criteria`): the
    int4 recipe passes; each block's scale off by a random factor or taken from its neighbour is
    refused by the accuracy gate (greedy agreement 0.44 and 0.0 on this model, floor 0.6), and
    nothing is written. Validation's cosine floors are advisory there (the gate judges); a floor
    the caller gives binds them again and refuses the broken logits (cosine 0.955 and 0.13)."""
    require_backend("onnx")
    model, inputs = build_preset("llama")
    prompt = {"input_ids": inputs["input_ids"][:1]}
    quantize = broken_quantizer(broken) if broken else "int4-weights"
    if broken is None:
        result = export_to_folder((model, prompt), _config("onnx"), tmp_path / "q",
                                  generation=GenerationOptions(static_cache=CACHE), quantize=quantize)
        assert result.passed and result.report["accuracy"]["passed"]
        report = result.reports["decode"]
        assert report.min_cosine == INT4_CRITERIA.min_cosine
        assert report.min_cache_cosine == INT4_CRITERIA.min_cache_cosine
        assert "accuracy gate" in report.cosine_advisory and report.below_floor == []  # measured 0.996 and up
        return
    with pytest.raises(ValidationError, match="agree with fp32 eager") as caught:
        export_to_folder((model, prompt), _config("onnx"), tmp_path / "q",
                         generation=GenerationOptions(static_cache=CACHE), quantize=quantize)
    assert caught.value.accuracy.agreement < INT4_CRITERIA.min_agreement
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValidationError, match=r"differs from eager PyTorch \(cosine similarity 0\.\d+ for logits\)"):
        export_to_folder((model, prompt), _config("onnx"), tmp_path / "q",
                         generation=GenerationOptions(static_cache=CACHE),
                         judging=JudgingOptions(min_cosine=INT4_CRITERIA.min_cosine), quantize=quantize)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("scheme", "criteria"), [
    ("int4-weights", INT4_CRITERIA), ("int8-dynamic", INT8_CRITERIA), ("int8-weights", INT8_CRITERIA),
    ("int8-dynamic-int4-weights", INT8_DYNAMIC_INT4_CRITERIA), (None, None),
])
def test_each_scheme_is_judged_by_the_criteria_measured_for_it(scheme, criteria):
    """8da4w's whole-prompt logits floor is its own (measured on SmolLM2: 0.828 where weight-only
    int4 keeps 0.999); the step floors that catch a broken quantizer are int4's."""
    from hfexport.generation.accuracy import quantized_criteria

    assert quantized_criteria(scheme) == criteria
    if criteria is INT8_DYNAMIC_INT4_CRITERIA:
        assert criteria.min_cosine < 0.8 and (criteria.min_agreement, criteria.min_mean_cosine) == \
            (INT4_CRITERIA.min_agreement, INT4_CRITERIA.min_mean_cosine)


@pytest.mark.slow
def test_openvino_default_int4_is_q4_0s_layout_and_passes_the_gate(tmp_path):
    """OpenVINO's default int4 (`--weight-format int4`): llama.cpp Q4_0's layout (symmetric groups of
    32, every linear int4), written through the default accuracy gate on the tiny Llama: the saved
    folder's teacher-forced greedy tokens through `GenerationRunner` agree with eager `generate`'s
    and their logits' cosine reach int4's floors, and `LLMPipeline` on the same folder agrees with
    that runner (the job's runtime-runner check). (Free-running tokens of a random-weight model part
    at the first near-tie, `accuracy.py`'s note.)"""
    require_backend("openvino")
    model, inputs = build_preset("llama")
    length = int(torch.randint(3, 8, ()))  # a drawn prompt length, 3-7 tokens
    prompt = {"input_ids": inputs["input_ids"][:1, :length]}
    result = export_to_folder((model, prompt), _config("openvino"), tmp_path / "q",
                              generation=GenerationOptions(generate=True), quantize="int4-weights")
    assert result.passed and result.report["accuracy"]["passed"]
    assert result.report["accuracy"]["agreement"] >= INT4_CRITERIA.min_agreement
    settings = result.report["components"]["decode"]["record"]["quantization"]["nncf_settings"]
    assert settings == {"mode": "INT4_SYM", "group_size": 32, "ratio": 1.0, "backup_mode": "INT8_ASYM"}
    accuracy = result.report["accuracy"]  # the saved folder run by GenerationRunner, teacher-forced against eager
    assert accuracy["tokens"] >= 8 and accuracy["mean_cosine"] >= INT4_CRITERIA.min_mean_cosine
    # and the folder as OpenVINO GenAI runs it: the job ran `LLMPipeline` on the saved folder
    runner = result.report["runner"]
    assert runner["checked"] and runner["passed"] and runner["runner"].startswith("openvino-genai"), runner
