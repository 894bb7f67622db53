"""A model that builds its mask from a 2-D mask over a static cache (BLOOM): its static-cache
components take the documented interface and keep the cache length and query length dynamic
(models/static_cache.py, generation/masks.py's padding row). Long fuzz run: BLOOM with a static
cache was refused (its cache length fixed at `max_cache_len`, a one-token prompt refused)."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import GenerationConfig

import hfexport
from hfexport import DynamoConfig, DynamoExporter
from hfexport.errors import ExportError
from hfexport.presets import build_preset
from hfexport.utils import decompose_for_generation
from hfexport.workarounds import PATCHES
from tests.harness import without

pytestmark = pytest.mark.slow  # BLOOM exports and validations, ~40 s

MAX_CACHE_LEN = 16
LOOP_INPUTS = ["input_ids", "attention_mask", "position_ids"]


@functools.cache  # decomposed once per case, shared by the tests below (none changes them)
def _bloom_components(batch: int, padding: bool, multi_token_decode: bool):
    model, _ = build_preset("bloom", seed=0)
    ids = torch.randint(1, 128, (batch, 6), generator=torch.Generator().manual_seed(batch))
    mask = torch.ones_like(ids)
    if padding:
        ids[-1, 0], mask[-1, 0] = 0, 0
    config = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN, pad_token_id=0)
    return model, {"input_ids": ids, "attention_mask": mask}, decompose_for_generation(
        model, {"input_ids": ids, "attention_mask": mask}, generation_config=config,
        multi_token_decode=multi_token_decode)


@pytest.mark.parametrize(("batch", "padding", "multi_token_decode"), [(1, False, True), (3, True, False)],
                         ids=["one-sequence-multi-token-decode", "padded-batch-prefill-decode"])
def test_bloom_static_components_take_the_documented_mask_and_validate_at_other_sizes(batch, padding,
                                                                                        multi_token_decode):
    _, _, components = _bloom_components(batch, padding, multi_token_decode)
    for name, (_, kwargs) in components.items():
        assert [k for k in kwargs if k != "past_key_values"] == LOOP_INPUTS, name
        assert kwargs["attention_mask"].shape[-1] == MAX_CACHE_LEN and kwargs["attention_mask"].dim() == 4
    artifacts = DynamoExporter().export_components(components, DynamoConfig(dynamic=True))
    reports = hfexport.validate_components(artifacts, components)
    for name, report in reports.items():
        assert report.passed, report.to_table()
        labels = [case.label for case in report.cases]
        assert "resized" in labels, (name, labels)  # another cache length
        if components[name].kwargs["input_ids"].shape[1] > 1:
            assert "smallest" in labels, (name, labels)  # and one token


def test_bloom_static_decode_generates_the_tokens_of_generate(tmp_path):
    from hfexport import AutoExportConfig, GenerationRunner
    from hfexport.job.export import GenerationOptions, export_to_folder

    model, inputs = build_preset("bloom", seed=0)
    prompt = {"input_ids": inputs["input_ids"][:1]}
    export_to_folder((model, prompt), AutoExportConfig.from_dict({"export_format": "dynamo", "dynamic": True}),
                     tmp_path,  # validated, as the CLI exports it
                     generation=GenerationOptions(generate=True, static_cache=MAX_CACHE_LEN))
    config = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(**prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False, generation_config=config)
    got = GenerationRunner.load(tmp_path).generate(prompt["input_ids"], max_new_tokens=6, eos_token_id=None)
    assert got.tokens == want[0, prompt["input_ids"].shape[1]:].tolist()


def test_the_static_layer_mask_length_patch_is_still_needed():
    _, _, components = _bloom_components(1, False, True)
    with without(PATCHES, "patch_static_layer_mask_sizes"), pytest.raises(ExportError, match="cache_length"):
        DynamoExporter().export_components(components, DynamoConfig(dynamic=True))


def test_the_causal_mask_skip_patch_is_still_needed():
    _, _, components = _bloom_components(1, False, True)
    module, kwargs = components["decode"]
    one_token = {**kwargs, "input_ids": kwargs["input_ids"][:, :1], "attention_mask": kwargs["attention_mask"][:, :, :1],
                 "position_ids": kwargs["position_ids"][:, :1]}
    program = DynamoExporter().export(module, kwargs, config=DynamoConfig(dynamic=True))
    torch.testing.assert_close(program.module()(**_copy(one_token)).logits, module(**_copy(one_token)).logits)
    with without(PATCHES, "patch_bloom_causal_mask_skip"):
        program = DynamoExporter().export(module, kwargs, config=DynamoConfig(dynamic=True))
    with pytest.raises(Exception, match="Guard failed"):
        program.module()(**_copy(one_token))


def _copy(kwargs):
    import copy

    return copy.deepcopy(kwargs)


def test_a_static_cache_without_key_buffers_generates(tmp_path):
    """Mamba2's cache (conv and SSM states, no key buffers, no max_cache_len) through the runner's
    cache session: the static cache's length was read from buffers it does not have (coverage
    matrix, mamba2 generate)."""
    from hfexport import AutoExportConfig, GenerationRunner
    from hfexport.job.export import GenerationOptions, export_to_folder

    model, inputs = build_preset("mamba2", seed=0)
    prompt = {"input_ids": inputs["input_ids"][:1]}
    # ONNX, where the matrix found it: reloading a Dynamo .pt2 holding this cache logs through a
    # malformed message of torch 2.13's torch.export.load fallback, which pytest's log capture raises on
    pytest.importorskip("onnxruntime")
    export_to_folder((model, prompt), AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True}), tmp_path,
                     generation=GenerationOptions(generate=True))  # validated, as the CLI exports it
    with torch.no_grad():
        want = model.generate(**prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    got = GenerationRunner.load(tmp_path).generate(prompt["input_ids"], max_new_tokens=4, eos_token_id=None)
    assert got.tokens == want[0, prompt["input_ids"].shape[1]:].tolist()
