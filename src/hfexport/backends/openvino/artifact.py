"""`HfOpenVINOModel`: an `openvino.Model` that also has `.save(path)`."""

from __future__ import annotations

import os
from pathlib import Path

import openvino as ov

from ...storage import checked_destination, staged_files

__all__ = ["HfOpenVINOModel", "write_openvino"]


class HfOpenVINOModel(ov.Model):
    """An `openvino.Model` (same object underneath) made by `OpenVINOExporter`."""

    compress_to_fp16: bool = False

    @classmethod
    def wrap(cls, model: ov.Model, *, compress_to_fp16: bool = False) -> HfOpenVINOModel:
        """`model` as an `HfOpenVINOModel` (the same model underneath)."""
        wrapped = cls(model._Model__model)
        wrapped.compress_to_fp16 = compress_to_fp16
        return wrapped

    def save(self, path: str | os.PathLike, *, overwrite: bool = True) -> list[Path]:
        """Write `path` (`.xml`) and its `.bin` weights, atomically, replacing the model saved
        there before (as `openvino.save_model` does); return the two files.

        Nothing but the `.xml` and `.bin` of that name is touched, and a failed save leaves them as
        they were.

        Args:
            overwrite: `True` (the default) replaces an existing model, as `openvino.save_model`
                does; `False` refuses it (`SerializationError`), for a caller that must not lose a
                file. Kept from hfexport's first version, which refused by default.
        """
        xml = Path(path)
        if xml.suffix != ".xml":
            xml = xml.with_suffix(".xml")
        xml = checked_destination(xml, overwrite=overwrite, what="the OpenVINO model")
        with staged_files(xml, overwrite=overwrite, companions=(xml.with_suffix(".bin").name,)) as staging:
            written = write_openvino(self, staging / xml.name)
        return [xml.parent / file.name for file in written]


def write_openvino(model: ov.Model, xml: Path) -> list[Path]:
    """Write `model` as `xml` and its `.bin` in a folder the caller stages; return both files."""
    ov.save_model(model, str(xml), compress_to_fp16=getattr(model, "compress_to_fp16", False))
    return [xml, xml.with_suffix(".bin")]
