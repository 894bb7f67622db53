"""Qwen2-VL on all four backends: a vision tower that takes any number of images of any size.

The tower's patch layout (rotary positions, per-frame attention) is data-dependent in
transformers; `hfexport.models.qwen2_vl` computes it with tensor ops. These tests export every
generation component once per backend and run each artifact in its runtime against eager, at the
prompt's image and at images the export never saw.
"""

from __future__ import annotations

import pytest
import torch

from hfexport import AutoExportConfig, AutoHfExporter, validate, validate_components
from hfexport.presets import build_preset, qwen2_vl_image
from hfexport.utils import decompose_for_generation
from tests.harness import require_backend

FORMATS = ["dynamo", "onnx", "openvino", "executorch"]


@pytest.fixture(scope="module")
def model_and_inputs():
    return build_preset("qwen2_vl")


@pytest.fixture(scope="module", params=FORMATS)
def exported(request, model_and_inputs):
    require_backend(request.param)
    model, inputs = model_and_inputs
    config = AutoExportConfig.from_dict({"export_format": request.param, "dynamic": True})
    # the seed's call, as its Qwen2-VL example makes it; the components again for validation
    artifacts = AutoHfExporter.from_config(config).export_for_generation(model, inputs, config=config)
    return artifacts, decompose_for_generation(model, inputs)


def test_layout_matches_transformers_helpers():
    """The tensor-op layout equals transformers' own loop, for several images and a video-like t=2."""
    from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids

    from hfexport.models.qwen2_vl import block_diagonal_mask, vision_patch_layout

    for grid in ([[1, 4, 6]], [[2, 4, 4], [1, 2, 6], [3, 6, 2]]):
        grid = torch.tensor(grid)
        patches = int(grid.prod(-1).sum())
        positions, padded = vision_patch_layout(grid, patches, merge_size=2)
        assert torch.equal(positions, get_vision_position_ids(grid, 2))
        assert torch.equal(block_diagonal_mask(padded, patches, torch.float32),
                           block_diagonal_mask(get_vision_cu_seqlens(grid), patches, torch.float32))


@pytest.mark.slow
def test_every_component_matches_eager(exported):
    artifacts, components = exported
    # the seed's example, exactly: no projector (folded into the tower), nothing a runner adds
    assert list(artifacts) == ["image_encoder", "language_model", "lm_head", "decode"]
    for name, report in validate_components(artifacts, components).items():
        assert report.passed, f"{name}:\n{report.to_table()}"


@pytest.mark.slow
def test_image_encoder_takes_images_it_was_not_exported_with(exported, model_and_inputs):
    """Two images of other sizes, one with two frames: more patches, two segments, same program."""
    artifacts, components = exported
    model, _ = model_and_inputs
    image = qwen2_vl_image(model.config, [(1, 4, 4), (2, 2, 6)], seed=3)
    module, _ = components["image_encoder"]
    report = validate(artifacts["image_encoder"], module,
                      {"hidden_states": image["pixel_values"], "grid_thw": image["image_grid_thw"]})
    assert report.passed, report.to_table()
    assert report.cases[0].outputs[0].shape == [4 * 4 + 2 * 2 * 6, 32]


@pytest.mark.slow
def test_head_takes_any_number_of_positions(exported, model_and_inputs):
    """Issue 28: the head, captured on generate's one position, took exactly that many (then two,
    repeated): 11 positions were refused on every backend. Now the language model's whole output."""
    artifacts, components = exported
    model, _ = model_and_inputs
    module, kwargs = components["lm_head"]
    assert kwargs["input"].shape[1] == 1  # what generate fed the head
    generator = torch.Generator().manual_seed(4)
    for batch, positions in ((1, 11), (2, 3)):
        hidden = torch.randn(batch, positions, kwargs["input"].shape[-1], generator=generator)
        report = validate(artifacts["lm_head"], module, {"input": hidden})
        assert report.passed, report.to_table()
        assert report.cases[0].outputs[0].shape == [batch, positions, model.config.text_config.vocab_size]
