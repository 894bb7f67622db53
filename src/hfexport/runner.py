"""`Runner`: runs an exported artifact in its own runtime, for validation and the CLI.

Each backend has a `runner.py` with a `Runner` subclass registered next to its exporter.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree

from .record import ExportRecord

__all__ = ["Runner", "runner_for"]


class Runner:
    """Run one artifact on forward kwargs; return its outputs flattened in `record.output_names` order."""

    runtime: ClassVar[str] = ""

    def __init__(self, artifact: Any, record: ExportRecord):
        self.artifact = artifact
        self.record = record

    @property
    def precision(self) -> str:
        """The precision the runtime computes in (`"f32"`, `"bf16"`, ...)."""
        return "as exported"

    def run(self, inputs: dict[str, Any]) -> list[torch.Tensor]:
        raise NotImplementedError

    def flat_inputs(self, inputs: dict[str, Any]) -> list[Any]:
        """`inputs` flattened to the artifact's input leaves (caches expanded to their tensors)."""
        return pytree.tree_leaves(inputs)


def runner_for(artifact: Any, record: ExportRecord) -> Runner:
    from .registry import BACKENDS, backend_names

    backend_names()
    return BACKENDS.get(record.format).runner_class()(artifact, record)
