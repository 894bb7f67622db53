"""The `torch.export` backend: the captured program is the artifact.

`config.py` (`DynamoConfig`), `exporter.py` (`DynamoExporter`), `artifact.py` (saving and loading a
program), `runner.py` (`DynamoRunner`), `patches.py` (none of its own).
"""

from .config import DynamoConfig

__all__ = ["DynamoConfig"]
