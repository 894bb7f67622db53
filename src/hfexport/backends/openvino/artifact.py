"""`HfOpenVINOModel`: an `openvino.Model` that also has `.save(path)`."""

from __future__ import annotations

import os
from pathlib import Path

import openvino as ov

from ...errors import ExportFolderError
from ...folder.manifest import FileBytes
from ...folder.storage import checked_destination, staged_files

__all__ = ["HfOpenVINOModel", "read_openvino", "write_openvino"]


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


def read_openvino(files: list[FileBytes]) -> ov.Model:
    """The `openvino.Model` of an `.xml` and its `.bin` among `files` (what `write_openvino`
    wrote), read from their bytes: OpenVINO is never given a path.

    # NOTE: why. `Core.read_model(path)` opens the `.bin` beside the `.xml` by its name, whether or
    # not anything checked it; given the IR's text and its weights as a tensor (openvino 2026.4), it
    # opens no file. The tensor is OpenVINO's own copy of the weights' bytes, which the model's
    # constants keep alive (a tensor sharing a numpy array's memory does not keep the array: the
    # constants read freed memory once it was collected): twice the weights while the model is
    # read, once after.
    """
    import numpy as np

    xml = next((f for f in files if f.path.suffix == ".xml"), files[0])
    weights = next((f for f in files if f.name == xml.path.with_suffix(".bin").name), None)
    if weights is None:
        raise ExportFolderError(
            f"{xml.path} reads its weights from {xml.path.with_suffix('.bin').name}, which is not one of its files "
            f"({', '.join(f.name for f in files)} were given: an export folder's manifest.json lists a component's "
            "files); it is not read",
            remedy="copy the export folder again, whole, from where it was written, or export again; loading files "
                   "of your own, pass the .xml and its .bin")
    tensor = ov.Tensor(np.frombuffer(weights.data, np.uint8), shared_memory=False)
    return ov.Core().read_model(xml.data.decode("utf-8"), tensor)
