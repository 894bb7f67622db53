"""`HfOpenVINOModel`: an `openvino.Model` that also has `.save(path)`."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import openvino as ov

from ..onnx.program import checked_destination

__all__ = ["HfOpenVINOModel"]


class HfOpenVINOModel(ov.Model):
    """An `openvino.Model` (same object underneath) made by `OpenVINOExporter`."""

    compress_to_fp16: bool = False

    @classmethod
    def wrap(cls, model: ov.Model, *, compress_to_fp16: bool = False) -> HfOpenVINOModel:
        wrapped = cls(model._Model__model)
        wrapped.compress_to_fp16 = compress_to_fp16
        return wrapped

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> list[Path]:
        """Write `path` (`.xml`) and its `.bin` weights, atomically; return the two files.

        Args:
            overwrite: replace existing files; without it an existing `path` is an error.
        """
        xml = checked_destination(path, overwrite=overwrite, what="the OpenVINO model")
        if xml.suffix != ".xml":
            xml = xml.with_suffix(".xml")
        staging = Path(tempfile.mkdtemp(prefix=f".{xml.name}.partial-", dir=xml.parent))
        try:
            ov.save_model(self, str(staging / xml.name), compress_to_fp16=self.compress_to_fp16)
            written = []
            for produced in sorted(staging.iterdir()):
                os.replace(produced, xml.parent / produced.name)
                written.append(xml.parent / produced.name)
            return written
        finally:
            shutil.rmtree(staging, ignore_errors=True)
