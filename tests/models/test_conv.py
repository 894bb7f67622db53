"""`conv2d` keeps a batch of one dynamic on a channels-last-strided input (models/conv.py):
ConvNext's one-graph export at batch 1 was refused (its batch bounded to 0..2, and traced at 2
the program refused batch 1)."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, record_of, validate
from hfexport.errors import CaptureError
from hfexport.models import conv  # noqa: F401 - registers the patch taken out below
from hfexport.presets import build_preset
from hfexport.workarounds import PATCHES
from tests.harness import without


class _PermutedConv(torch.nn.Module):
    """What a ConvNext block hands its depthwise conv: features normalised over channels in
    `(N, H, W, C)` and permuted back to `(N, C, H, W)`, with channels-last strides."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(4)
        self.conv = torch.nn.Conv2d(4, 4, kernel_size=3, padding=1, groups=4)

    def forward(self, pixel_values):
        return (self.conv(self.norm(pixel_values.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)),)


def test_a_conv_on_a_permuted_input_keeps_a_batch_of_one():
    module = _PermutedConv().eval()
    sample = torch.randn(1, 4, 6, 6)
    program = DynamoExporter().export(module, {"pixel_values": sample}, config=DynamoConfig(dynamic=True))
    for batch, side in ((3, 6), (1, 5)):
        other = torch.randn(batch, 4, side, side)
        torch.testing.assert_close(program.module()(pixel_values=other)[0], module(other)[0])
    with without(PATCHES, "patch_conv2d_strided_input"), \
            pytest.raises(CaptureError, match=r"axis 0 \(batch; traced at 1; allowed 0\.\.2\)"):
        DynamoExporter().export(module, {"pixel_values": sample}, config=DynamoConfig(dynamic=True))


def test_convnext_one_graph_takes_any_batch_from_a_batch_of_one():
    model, inputs = build_preset("convnext")
    assert inputs["pixel_values"].shape[0] == 1
    program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    assert isinstance(record_of(program).input_shapes[0][0], str)
    assert "traced_batch" not in record_of(program).details  # traced at the caller's batch of 1
    report = validate(program, model, {"pixel_values": torch.randn(3, 3, 40, 40)})  # and its resized case
    assert report.passed, report.to_table()
