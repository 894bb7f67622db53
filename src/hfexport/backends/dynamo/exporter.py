"""`DynamoExporter`: the `torch.export` program itself is the artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...capture.capture import Capture
from ...exporter import HfExporter
from .config import DynamoConfig

__all__ = ["DynamoExporter"]


class DynamoExporter(HfExporter):
    """Export to a `torch.export.ExportedProgram`.

    ```python
    exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    outputs = exported.module()(**inputs)
    ```
    """

    format = "dynamo"
    config_class = DynamoConfig

    def _convert(self, captured: Capture, model: torch.nn.Module, inputs: dict[str, Any],
                 config: DynamoConfig) -> torch.export.ExportedProgram:
        return captured.program

    def _save(self, artifact: torch.export.ExportedProgram, stem: Path) -> list[Path]:
        path = stem.with_suffix(".pt2")
        torch.export.save(artifact, path)
        return [path]

    def _load(self, files: list[Path]) -> torch.export.ExportedProgram:
        from ...capture.pytree import register_cache_pytree_nodes

        register_cache_pytree_nodes()  # so the program's cache inputs unflatten (and load weights-only)
        return torch.export.load(files[0])
