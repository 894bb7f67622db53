"""Run an artifact in its runtime, compare with eager PyTorch, and report per output.

`validate(artifact, model, inputs)` runs the sample inputs and, for an artifact with dynamic
dimensions, inputs of other sizes; each output is compared with eager's. The modules, by job:
`driver` (`validate`, `validate_components`), `compare` (one output against eager: tolerance,
cosine floors, padding), `inputs` (the resized cases' inputs, `register_resizer`) and `report`
(`ValidationReport`). Their public names are re-exported here.
"""

from __future__ import annotations

from .compare import DEFAULT_TOLERANCE, LOW_PRECISION_EPS, default_tolerance
from .driver import validate, validate_components
from .inputs import RESIZERS, register_resizer, resize_inputs
from .report import CaseReport, OutputDiff, ValidationReport

__all__ = ["validate", "validate_components", "ValidationReport", "CaseReport", "OutputDiff", "resize_inputs",
           "DEFAULT_TOLERANCE", "default_tolerance", "LOW_PRECISION_EPS", "RESIZERS", "register_resizer"]
