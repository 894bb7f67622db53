"""ExecuTorch artifacts on disk: a `.pte` (and its `.ptd` weights file) written, and read back for the runner."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import SerializationError
from ...storage import atomic_file, checked_destination
from .compat import data_payloads

__all__ = ["PteBuffer", "save_pte", "write_pte"]


class PteBuffer:
    """A saved `.pte` program, as the runner loads it (`buffer`, like `ExecutorchProgramManager`).

    Args:
        buffer: the program's bytes.
        path: the `.pte` it was read from.
        data_path: the `.ptd` holding its weights, when they live outside the program.
    """

    def __init__(self, buffer: bytes, path: Path | None = None, data_path: Path | None = None):
        self.buffer = buffer
        self.path = path
        self.data_path = data_path

    @classmethod
    def read(cls, path: Path, data_path: Path | None = None) -> PteBuffer:
        """The program saved at `path` (its weights in `data_path` when given; that file is mapped
        when the runner loads the program, not read here)."""
        return cls(Path(path).read_bytes(), Path(path), Path(data_path) if data_path is not None else None)


def write_pte(program: Any, path: Path) -> Path:
    """Write `program` (an `ExecutorchProgramManager`) to `path` in a folder the caller stages."""
    with open(path, "wb") as stream:
        program.write_to_file(stream)
    return path


def save_pte(program: Any, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write `program` to `path` atomically (temporary file, then rename); a program whose weights
    live outside it is refused (its `.pte` alone cannot run: `ExecutorchExporter().save` writes both)."""
    if data_payloads(program):
        raise SerializationError(f"the ExecuTorch program keeps its weights outside the .pte; {path} alone "
                                 "would not load",
                                 remedy="save it with ExecutorchExporter().save(program, folder), which writes the "
                                 ".pte and its .ptd")
    target = checked_destination(path, overwrite=overwrite, what="the ExecuTorch program")
    with atomic_file(target, "wb") as stream:
        program.write_to_file(stream)
    return target
