"""ExecuTorch artifacts on disk: a `.pte` written atomically, and read back for the runner."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...storage import atomic_file, checked_destination

__all__ = ["PteBuffer", "save_pte", "write_pte"]


class PteBuffer:
    """A saved `.pte` program, as the runner loads it (`buffer`, like `ExecutorchProgramManager`)."""

    def __init__(self, buffer: bytes):
        self.buffer = buffer

    @classmethod
    def read(cls, path: Path) -> PteBuffer:
        """The program saved at `path`."""
        return cls(Path(path).read_bytes())


def write_pte(program: Any, path: Path) -> Path:
    """Write `program` (an `ExecutorchProgramManager`) to `path` in a folder the caller stages."""
    with open(path, "wb") as stream:
        program.write_to_file(stream)
    return path


def save_pte(program: Any, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write `program` to `path` atomically (temporary file, then rename)."""
    target = checked_destination(path, overwrite=overwrite, what="the ExecuTorch program")
    with atomic_file(target, "wb") as stream:
        program.write_to_file(stream)
    return target
