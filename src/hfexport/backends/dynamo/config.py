"""`DynamoConfig`: options of the `torch.export` backend."""

from __future__ import annotations

import dataclasses

from ...config import ExportConfig

__all__ = ["DynamoConfig"]


@dataclasses.dataclass
class DynamoConfig(ExportConfig):
    """Export to a `torch.export.ExportedProgram` (run with `.module()`, save with `torch.export.save`).

    Takes only the shared options of `ExportConfig`.
    """

    export_format = "dynamo"
