"""`HfOnnxProgram`: a `torch.onnx.ONNXProgram` whose `save` refuses to overwrite and never leaves a
half-written file."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from ...errors import SerializationError

__all__ = ["HfOnnxProgram", "checked_destination"]


def checked_destination(destination: str | os.PathLike, *, overwrite: bool, what: str) -> Path:
    """Raise `SerializationError` when `destination` cannot be written as asked."""
    path = Path(destination)
    if not path.parent.exists():
        raise SerializationError(f"cannot save {what} to {path}: folder {path.parent} does not exist",
                                 remedy=f"create {path.parent} first")
    if path.exists() and not overwrite:
        raise SerializationError(f"{path} already exists", remedy="pass overwrite=True, or choose another path")
    return path


class HfOnnxProgram(torch.onnx.ONNXProgram):
    """An `ONNXProgram` (same API) made by `OnnxExporter`."""

    external_data: bool | None = None

    @classmethod
    def from_proto(cls, proto: Any, like: HfOnnxProgram) -> HfOnnxProgram:
        """A program holding `proto` (a quantized model), otherwise like `like`."""
        import onnx_ir as ir

        wrapped = cls(ir.from_proto(proto), like.exported_program)
        wrapped.external_data = like.external_data
        return wrapped

    @classmethod
    def wrap(cls, program: torch.onnx.ONNXProgram, *, external_data: bool | None = None) -> HfOnnxProgram:
        wrapped = cls(program.model, program.exported_program)
        wrapped.external_data = external_data
        return wrapped

    def save(self, destination: str | os.PathLike, *, overwrite: bool = False,
             external_data: bool | None = None, **kwargs) -> list[Path]:
        """Save to `destination` (`model.onnx`, plus `model.onnx.data` for external weights).

        Written to a temporary folder beside `destination` and moved into place when complete.

        Args:
            overwrite: replace existing files; without it an existing `destination` is an error.
            external_data: weights in a separate file; `None` decides by size (over 2 GB).

        Returns:
            The files written.
        """
        path = checked_destination(destination, overwrite=overwrite, what="the ONNX model")
        if external_data is None:
            external_data = self.external_data
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
        try:
            super().save(staging / path.name, external_data=external_data, **kwargs)
            written = []
            for produced in sorted(staging.iterdir()):
                target = path.parent / produced.name
                if target.exists() and not overwrite:
                    raise SerializationError(f"{target} already exists", remedy="pass overwrite=True")
                os.replace(produced, target)
                written.append(target)
            return written
        finally:
            shutil.rmtree(staging, ignore_errors=True)
