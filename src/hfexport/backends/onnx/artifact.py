"""`HfOnnxProgram`: a `torch.onnx.ONNXProgram` whose `save` refuses to overwrite and never leaves a
half-written file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ...config import EXTERNAL_WEIGHTS_BYTES
from ...storage import checked_destination, staged_files

__all__ = ["HfOnnxProgram", "write_onnx"]


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
        """`program` as an `HfOnnxProgram` (same model and exported program)."""
        wrapped = cls(program.model, program.exported_program)
        wrapped.external_data = external_data
        return wrapped

    def save(self, destination: str | os.PathLike, *, overwrite: bool = False,
             external_data: bool | None = None, **kwargs: Any) -> list[Path]:
        """Save to `destination` (`model.onnx`, plus `model.onnx.data` for external weights).

        Written to a temporary folder beside `destination` and moved into place when complete.

        Args:
            overwrite: replace existing files; without it an existing `destination` is an error.
            external_data: weights in a separate file; `None` decides by size (`OnnxConfig.external_data`).

        Returns:
            The files written.
        """
        path = checked_destination(destination, overwrite=overwrite, what="the ONNX model")
        with staged_files(path, overwrite=overwrite) as staging:
            written = write_onnx(self, staging / path.name, external_data=external_data, **kwargs)
        return [path.parent / file.name for file in written]


def weight_bytes(program: torch.onnx.ONNXProgram) -> int:
    """The bytes of `program`'s initializers (its weights)."""
    return sum(value.const_value.nbytes for value in program.model.graph.initializers.values()
               if value.const_value is not None)


def write_onnx(program: HfOnnxProgram, path: Path, *, external_data: bool | None = None, **kwargs: Any) -> list[Path]:
    """Write `program` to `path` in a folder the caller stages (no staging of its own); return the
    files (the model, and its weights file when they are external)."""
    if external_data is None:
        external_data = program.external_data
    if external_data is None:
        external_data = weight_bytes(program) > EXTERNAL_WEIGHTS_BYTES
    before = set(path.parent.iterdir())
    torch.onnx.ONNXProgram.save(program, path, external_data=external_data, **kwargs)
    return sorted(set(path.parent.iterdir()) - before)
