"""Qwen2-VL's vision tower computes its patch layout with tensor ops (models/qwen2_vl.py): the tiny
tower exported with one image takes two images of other sizes only with both patches."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, validate
from hfexport.errors import CaptureError
from hfexport.models import qwen2_vl  # noqa: F401 - registers the patches taken out below
from hfexport.presets import build_preset, qwen2_vl_image
from hfexport.workarounds import PATCHES
from tests.harness import without


@pytest.fixture(scope="module")
def tower():
    """The tiny Qwen2-VL's vision tower, its config, and its inputs for the preset's one 4 x 6-patch image."""
    model, inputs = build_preset("qwen2_vl")
    sample = {"hidden_states": inputs["pixel_values"], "grid_thw": inputs["image_grid_thw"]}
    return model.model.visual, model.config, sample


def _takes_other_images(tower) -> None:
    module, config, sample = tower
    program = DynamoExporter().export(module, sample, config=DynamoConfig(dynamic=True))
    image = qwen2_vl_image(config, [(1, 4, 4), (2, 2, 6)], seed=3)  # two images, one with two frames
    report = validate(program, module, {"hidden_states": image["pixel_values"], "grid_thw": image["image_grid_thw"]})
    assert report.passed, report.to_table()


@pytest.mark.slow  # ~7 s: two exports and a validation
def test_the_layout_is_computed_without_tolist(tower):
    """transformers 5.24 loops over `grid_thw.tolist()`: the program fixes the number of images."""
    _takes_other_images(tower)
    with without(PATCHES, "patch_qwen2_vl_vision_layout"), \
            pytest.raises(CaptureError, match=r"grid_thw, axis 0 \(images; traced at 1"):
        _takes_other_images(tower)  # still needed


def test_the_attention_runs_once_with_a_block_diagonal_mask(tower):
    """transformers 5.24 splits the patches per frame with `torch.split(lengths.tolist())`."""
    with without(PATCHES, "patch_qwen2_vl_vision_attention"), pytest.raises(CaptureError, match="data-dependent"):
        _takes_other_images(tower)  # still needed
