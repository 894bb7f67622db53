"""The `torch.export` backend: the captured program is the artifact.

`config.py` (`DynamoConfig`), `exporter.py` (`DynamoExporter`), `artifact.py` (saving and loading a
program), `runner.py` (`DynamoRunner`), `patches.py` (none of its own). What a `.pt2` from elsewhere
may hold before it is loaded: `archive.py` (its members), `program_json.py` (its program's JSON),
`expressions.py` (size expressions and guards), `tree_specs.py` (its tree specs).
"""

from .config import DynamoConfig

__all__ = ["DynamoConfig"]
