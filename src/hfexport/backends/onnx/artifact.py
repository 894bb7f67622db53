"""`HfOnnxProgram`: a `torch.onnx.ONNXProgram` whose `save` never leaves a half-written file.

# NOTE: `save(path)` replaces a file already at `path`, as `torch.onnx.ONNXProgram.save` does,
# rather than refusing it: the seed's flows save one name again (a multimodal export saves each
# component per test length to one name), and a program that behaves like the one it stands for
# must not fail there. It still writes through a staged folder, so a failed save leaves the file
# that was there, and it replaces only the program's own files (`model.onnx`, `model.onnx.data`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ...config import EXTERNAL_WEIGHTS_BYTES
from ...folder.storage import checked_destination, staged_files
from .scratch import save_linked

__all__ = ["HfOnnxProgram", "scratch_session_options", "write_onnx"]


class HfOnnxProgram(torch.onnx.ONNXProgram):
    """An `ONNXProgram` (same API) made by `OnnxExporter`."""

    external_data: bool | None = None

    @classmethod
    def from_proto(cls, proto: Any, like: HfOnnxProgram) -> HfOnnxProgram:
        """A program holding `proto` (a quantized model), otherwise like `like`."""
        import onnx_ir as ir

        return cls.from_model(ir.from_proto(proto), like)

    @classmethod
    def from_model(cls, model: Any, like: HfOnnxProgram) -> HfOnnxProgram:
        """A program holding `model` (an ONNX IR model: a quantized one), otherwise like `like`."""
        wrapped = cls(model, like.exported_program)
        wrapped.external_data = like.external_data
        return wrapped

    @classmethod
    def wrap(cls, program: torch.onnx.ONNXProgram, *, external_data: bool | None = None) -> HfOnnxProgram:
        """`program` as an `HfOnnxProgram` (same model and exported program)."""
        wrapped = cls(program.model, program.exported_program)
        wrapped.external_data = external_data
        return wrapped

    def weights_external(self) -> bool:
        """Whether `save` writes the weights to their own file (asked, or decided by their size)."""
        if self.external_data is not None:
            return self.external_data
        return weight_bytes(self) > EXTERNAL_WEIGHTS_BYTES

    def save(self, destination: str | os.PathLike, *, overwrite: bool = True,
             external_data: bool | None = None, **kwargs: Any) -> list[Path]:
        """Save to `destination` (`model.onnx`, plus `model.onnx.data` for external weights),
        replacing the model saved there before, as `torch.onnx.ONNXProgram.save` does.

        Written to a temporary folder beside `destination` and moved into place when complete, so
        a failed save leaves what was there. Only the model's own files are replaced: a
        `model.onnx.data` this save does not write (its weights now inside `model.onnx`) is
        removed, as it held the previous model's weights; nothing else in the folder is touched.

        Args:
            overwrite: `True` (the default) replaces an existing `destination`, as the runtime's
                own `save` does; `False` refuses it (`SerializationError`), for a caller that
                must not lose a file. Kept from hfexport's first version, which refused by default.
            external_data: weights in a separate file; `None` decides by size (`OnnxConfig.external_data`).

        Returns:
            The files written.
        """
        path = checked_destination(destination, overwrite=overwrite, what="the ONNX model")
        with staged_files(path, overwrite=overwrite, companions=(f"{path.name}.data",)) as staging:
            written = write_onnx(self, staging / path.name, external_data=external_data, **kwargs)
        return [path.parent / file.name for file in written]


def weight_bytes(program: torch.onnx.ONNXProgram) -> int:
    """The bytes of `program`'s initializers (its weights)."""
    return sum(value.const_value.nbytes for value in program.model.graph.initializers.values()
               if value.const_value is not None)


def write_onnx(program: HfOnnxProgram, path: Path, *, external_data: bool | None = None, **kwargs: Any) -> list[Path]:
    """Write `program` to `path` in a folder the caller stages (no staging of its own); return the
    files (the model, and its weights file when they are external). External weights that
    validation already wrote to a scratch file (`scratch.py`) are that file, linked, not written again."""
    if external_data is None:
        external_data = program.weights_external()
    if external_data and not kwargs:
        linked = save_linked(program.model, path)
        if linked is not None:
            return linked
    before = set(path.parent.iterdir())
    torch.onnx.ONNXProgram.save(program, path, external_data=external_data, **kwargs)
    return sorted(set(path.parent.iterdir()) - before)


def scratch_session_options() -> Any:
    """ONNX Runtime session options for a model `scratch.scratch_model` wrote: prepacking off, so
    the weights stay mapped from the file instead of packed into a copy.

    # NOTE: what ONNX Runtime opens before the export is written (the fusions' load check, the
    # validation runner). Serialized in memory instead, the model held three more copies of its
    # weights (the proto, its bytes, the session's): 5.3x the weights at the 134 MB Llama's export
    # peak and 3.2x at its validation (`bench/export_cost.py`), and a model over 2 GiB could not be
    # serialized at all. With prepacking off ONNX Runtime maps the external file instead of copying
    # it (onnxruntime 1.32: anonymous RSS unchanged by a 512 MiB weight), so the pages are the
    # file's, which the kernel can drop and read again.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.disable_prepacking", "1")
    return options
