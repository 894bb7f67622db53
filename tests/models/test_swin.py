"""Swin's patch embedding pads without a branch on the image size (models/swin.py)."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.models import swin  # noqa: F401 - registers the patch taken out below
from hfexport.presets import build_preset
from hfexport.workarounds import PATCHES
from tests.harness import without


class _PatchEmbedding(torch.nn.Module):
    """The tiny Swin's patch embedding (patch size 4), its patch grid left out of the outputs."""

    def __init__(self):
        super().__init__()
        model, _ = build_preset("swin")
        self.embed = model.swin.embeddings.patch_embeddings

    def forward(self, pixel_values):
        return (self.embed(pixel_values)[0],)


def _takes_a_side_that_is_not_a_multiple_of_the_patch(module: torch.nn.Module) -> None:
    sample = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    program = DynamoExporter().export(module, {"pixel_values": sample}, config=DynamoConfig(dynamic=True))
    image = torch.randn(2, 3, 30, 30, generator=torch.Generator().manual_seed(1))  # the sample's 8 x 8 patch grid
    with torch.no_grad():
        want = module(image)[0]
    torch.testing.assert_close(program.module()(pixel_values=image)[0], want)


def test_a_program_traced_at_32_pixels_takes_30():
    """Traced at 32 x 32 (a multiple of the patch size 4) the unpatched program is guarded on
    `width % 4 == 0` (and ONNX Runtime, which drops the guard, gave wrong logits at 34 x 34)."""
    module = _PatchEmbedding().eval()
    _takes_a_side_that_is_not_a_multiple_of_the_patch(module)
    with without(PATCHES, "patch_swin_patch_embedding_pad"), pytest.raises(Exception, match=r"Guard failed.*% 4 == 0"):
        _takes_a_side_that_is_not_a_multiple_of_the_patch(module)  # still needed
