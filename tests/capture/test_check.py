"""Step 3, check: an axis asked to be dynamic that the program fixed is an error naming it, and
`dynamic_shapes` is checked against the inputs before tracing."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, record_of, validate
from hfexport.errors import CaptureError, PrepareError


class _AddsABatchOfTwo(torch.nn.Module):
    """Adds a batch-2 constant to its tokens: the program can only take the sample's batch."""

    def forward(self, input_ids):
        return (input_ids.float() + torch.ones(2, input_ids.shape[1]),)


class _BroadcastsAgainstThree(torch.nn.Module):
    """Adds a size-3 tensor to a batch-1 input: traced with size-1 dims kept dynamic this cannot
    broadcast; torch.export's default fixes the batch at 1."""

    def forward(self, input_ids):
        return (input_ids.float() + torch.ones(3, input_ids.shape[1]),)


def test_an_axis_the_model_fixes_is_named_with_its_role_and_the_cause():
    with pytest.raises(CaptureError, match=r"(?s)input_ids, axis 0 \(batch; traced at 2\).*specialized.*dynamic_shapes"):
        DynamoExporter().export(_AddsABatchOfTwo(), {"input_ids": torch.ones(2, 4, dtype=torch.long)},
                                config=DynamoConfig(dynamic=True))


def test_a_size_one_capture_failure_raises_unless_the_caller_allows_the_fallback():
    inputs = {"input_ids": torch.ones(1, 4, dtype=torch.long)}
    with pytest.raises(CaptureError, match="allow_size_one_specialization=True"):
        DynamoExporter().export(_BroadcastsAgainstThree(), inputs, config=DynamoConfig(dynamic=True))
    program = DynamoExporter().export(_BroadcastsAgainstThree(), inputs,
                                      config=DynamoConfig(dynamic=True, allow_size_one_specialization=True))
    fixed = record_of(program).details["specialized_size_one"]
    assert [(e["input"], e["axis"], e["role"]) for e in fixed] == [("input_ids", 0, "batch")]
    assert record_of(program).input_shapes[0][0] == 1  # the sequence axis stays dynamic
    assert isinstance(record_of(program).input_shapes[0][1], str)


def test_axes_the_weights_fix_are_listed_not_refused():
    from hfexport.presets import build_preset

    model, inputs = build_preset("vit")
    program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    fixed = {(e["input"], e["axis"]) for e in record_of(program).details.get("fixed_by_model", [])}
    assert ("pixel_values", 1) in fixed  # channels, fixed by the patch embedding's weights
    assert isinstance(record_of(program).input_shapes[0][0], str)  # the batch stays dynamic


class _HeadOfTwoPositions(torch.nn.Linear):
    """A head (`nn.Linear.forward(input)`) whose code fixes the positions at the sample's two."""

    def forward(self, input):
        return super().forward(input + torch.zeros(2, self.in_features))


class _ProjectorOfFourPatches(torch.nn.Linear):
    """A projector whose code fixes the patches per image at the sample's four."""

    def forward(self, image_features):
        return super().forward(image_features + torch.zeros(4, self.in_features))


@pytest.mark.parametrize(("module", "inputs", "axis"), [
    (_HeadOfTwoPositions(8, 16), {"input": torch.randn(1, 2, 8)}, r"input, axis 1 \(sequence; traced at 2\)"),
    (_ProjectorOfFourPatches(8, 16), {"image_features": torch.randn(2, 4, 8)},
     r"image_features, axis 1 \(patches; traced at 4\)"),
], ids=["head", "projector"])
def test_a_head_or_projector_whose_positions_come_out_fixed_is_refused(module, inputs, axis):
    """Issue 28: a head's `input` was read as a cache leaf (`input.cache...`, named I/O), its
    positions planned static as a recurrent state's width: the Qwen2-VL head came out fixed at
    the captured positions and the check, which reads only the axes the plan asks for, passed it."""
    with pytest.raises(CaptureError, match=axis):
        DynamoExporter().export(module, inputs, config=DynamoConfig(dynamic=True))


def test_a_head_takes_any_number_of_positions_from_a_one_position_sample():
    head = torch.nn.Linear(8, 16)
    program = DynamoExporter().export(head, {"input": torch.randn(1, 1, 8)}, config=DynamoConfig(dynamic=True))
    for batch, positions in ((1, 11), (3, 2)):
        hidden = torch.randn(batch, positions, 8)
        torch.testing.assert_close(program.module()(input=hidden), head(hidden))


def test_unknown_dynamic_shapes_keys_are_named_with_the_inputs():
    batch = torch.export.Dim("batch")
    with pytest.raises(PrepareError, match=r"(?s)'pixel_values'.*not among the inputs: input_ids"):
        DynamoExporter().export(_BroadcastsAgainstThree(), {"input_ids": torch.ones(2, 3, dtype=torch.long)},
                                config=DynamoConfig(dynamic_shapes={"input_ids": {0: batch}, "pixel_values": {0: batch}}))


class _TwoInputs(torch.nn.Module):
    def forward(self, x, y):
        return (x.sum(-1), y * 2)


def test_inputs_left_out_of_dynamic_shapes_are_static():
    batch = torch.export.Dim("batch", min=1, max=64)
    inputs = {"x": torch.ones(2, 3), "y": torch.ones(4, 5)}
    program = DynamoExporter().export(_TwoInputs(), inputs, config=DynamoConfig(dynamic_shapes={"x": {0: batch}}))
    shapes = dict(zip(record_of(program).input_names, record_of(program).input_shapes))
    assert isinstance(shapes["x"][0], str) and shapes["x"][1] == 3
    assert shapes["y"] == (4, 5)


def test_a_resized_check_that_cannot_resize_fails_instead_of_rerunning_the_sample():
    """A program whose batch may only be the sample's: no other batch exists to check, and the
    case says so rather than passing on the sample's shape."""
    inputs = {"input_ids": torch.ones(2, 3, dtype=torch.long)}
    program = DynamoExporter().export(_Doubles(), inputs, config=DynamoConfig(dynamic=True))
    record = record_of(program)
    batch = record.input_shapes[0][0]
    record.symbol_ranges[batch] = (2, 2)
    report = validate(program, _Doubles(), inputs)
    assert not report.passed and "no size but the sample's" in report.cases[1].error


class _Doubles(torch.nn.Module):
    def forward(self, input_ids):
        return (input_ids * 2,)
