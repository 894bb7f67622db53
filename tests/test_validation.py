"""Validation: differences are measured per output, and failures are failures."""

from __future__ import annotations

import torch

from hfexport import DynamoConfig, DynamoExporter, validate
from hfexport.presets import build_preset
from hfexport.validation import _tile


def test_report_lists_every_output_with_its_tolerance():
    model, inputs = build_preset("llama")
    program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    report = validate(program, model, inputs)
    names = [o.name for o in report.cases[0].outputs]
    assert names[0] == "logits" and "cache.1.values" in names
    data = report.to_dict()
    assert data["passed"] and data["atol"] == 1e-5 and "atol + rtol" in data["rule"]
    assert "tolerance: atol=1e-05" in report.to_table()


def test_a_wrong_weight_fails_validation():
    model, inputs = build_preset("bert")
    program = DynamoExporter().export(model, inputs, config=DynamoConfig())
    # give eager a changed copy of one weight; the program keeps the exported one
    dense = model.encoder.layer[0].intermediate.dense
    dense.weight = torch.nn.Parameter(dense.weight.detach() * 3)
    report = validate(program, model, inputs)
    assert not report.passed
    failing = [o for o in report.cases[0].outputs if not o.passed]
    assert failing and failing[0].max_abs > 1e-3


def test_a_specialised_dimension_fails_the_resized_case():
    model, inputs = build_preset("llama")
    program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=False))
    from hfexport import record_of

    record = record_of(program)
    record.input_shapes = [("b", "s"), ("b", "s")]  # claim dims that the program does not have
    record.symbol_ranges = {}
    report = validate(program, model, inputs, resized=True)
    assert report.cases[0].passed and not report.cases[1].passed
    assert report.cases[1].error  # the runtime refused the new shape: reported, not raised


def test_tile_keeps_values_and_reaches_the_shape():
    t = torch.arange(6).reshape(1, 6)
    out = _tile(t, (3, 8))
    assert out.shape == (3, 8) and torch.equal(out[2, :6], t[0]) and torch.equal(out[0, 6:], t[0, :2])
