"""The one harness every backend's parity tests use: build → export → run in runtime → compare."""

from __future__ import annotations

from typing import Any

import torch

from hfexport import validate
from hfexport.presets import build_preset


def export_and_validate(exporter, config, name: str, inputs: dict[str, Any] | None = None, **validate_kwargs):
    """Export preset `name` with `exporter`/`config`, validate it in its runtime, and return
    `(artifact, report, model, inputs)`; asserts every case of the report passed."""
    model, sample = build_preset(name)
    inputs = sample if inputs is None else inputs
    artifact = exporter.export(model, inputs, config=config)
    report = validate(artifact, model, inputs, **validate_kwargs)
    assert report.passed, report.to_table()
    return artifact, report, model, inputs


def assert_close_to_eager(got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = (got.double() - want.double()).abs().max().item()
    assert diff <= atol, f"max abs difference {diff} > {atol}"
