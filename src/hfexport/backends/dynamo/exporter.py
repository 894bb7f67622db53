"""`DynamoExporter`: the `torch.export` program itself is the artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...capture.record import ExportRecord
from ...capture.trace import Capture
from ...exporter import HfExporter
from ...folder.manifest import FileBytes
from .artifact import read_program, write_program
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
    fix_order = ()

    def _convert(self, captured: Capture, record: ExportRecord, model: torch.nn.Module, inputs: dict[str, Any],
                 config: DynamoConfig) -> torch.export.ExportedProgram:
        return captured.program

    def _write(self, artifact: torch.export.ExportedProgram, stem: Path) -> list[Path]:
        return [write_program(artifact, stem.with_suffix(".pt2"))]

    def _load(self, files: list[FileBytes]) -> torch.export.ExportedProgram:
        return read_program(files[0].data, name=files[0].name)  # the bytes checked are the bytes loaded
