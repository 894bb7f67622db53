"""`OnnxModelFiles`: an ONNX model opened from private copies of its checked files, never from the
folder it was listed in.

```
OnnxExporter.load(files)     model.onnx + the external data files among `files`
  external_locations         every `location` the model names, read from its protobuf
  (a location not among the files: refused, naming it; never looked up on disk)
  FileBytes.copy_to          each file copied into a private folder, checked as copied
OnnxRunner                   InferenceSession(the private model.onnx): ONNX Runtime maps the copies
```

# NOTE: why private copies. ONNX Runtime given a model's path opens its external data by the
# `location` the model names, when the session is created: in the export folder, a file checked
# before (and swapped since), or not checked at all (a model naming an unlisted `hidden.bin`).
# Given the model's bytes and its data files from memory (`add_external_initializers_from_
# files_in_memory`, onnxruntime 1.32) it copies the weights while it builds the session: a
# 428 MB model's load peaked at 964 MB over the imports, against 422 MB from a mapped file
# (`bench/open_folder.py`). So each file is copied, checked as it is copied, into a folder only
# this process writes, and ONNX Runtime maps those copies as it mapped the originals; a location
# that is not one of them is refused before it sees the model (and could only fail there: the
# folder holds nothing else). The copies go when the model is collected.
#
# `external_locations` reads the locations off the protobuf's wire format rather than with the
# `onnx` package: importing it took 1.3-1.5 s, as long as the rest of a 428 MB model's load.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ...errors import ExportFolderError
from ...folder.manifest import FileBytes

__all__ = ["OnnxModelFiles", "external_locations"]


class OnnxModelFiles:
    """An ONNX model loaded from its files (`OnnxExporter.load`), as private copies ONNX Runtime opens.

    Args:
        model: the `.onnx` file.
        files: the other files given with it, among which every external-data location the model
            names must be (`ExportFolderError` naming the first that is not).

    Attributes:
        path: the private copy of the model (its data files beside it) ONNX Runtime opens.
        source: where the model was read from (for messages).
    """

    def __init__(self, model: FileBytes, files: list[FileBytes]):
        given = {f.name: f for f in files}
        named = external_locations(model.data)
        unlisted = sorted(named - given.keys())
        if unlisted:
            raise ExportFolderError(
                f"{model.path} names {unlisted[0]!r} as the file of its weights, which is not one of its files "
                f"({', '.join(sorted(given)) or 'none'} were given: an export folder's manifest.json lists a "
                "component's files); it is not read",
                remedy="copy the export folder again, whole, from where it was written, or export again; loading "
                       "files of your own, pass every file `save` wrote (model.onnx and model.onnx.data)")
        self._copies = tempfile.TemporaryDirectory(prefix="hfexport-onnx-")
        self.source = model.path
        self.path = Path(self._copies.name) / model.name
        self.path.write_bytes(model.data)
        for name in sorted(named):
            given[name].copy_to(Path(self._copies.name))

    def __repr__(self) -> str:
        return f"OnnxModelFiles({str(self.source)!r})"


# Field numbers of onnx.proto (onnx 1.23) on the way from a model to its tensors' external data.
_MODEL_GRAPH, _MODEL_FUNCTIONS = 7, 25
_GRAPH_NODES, _GRAPH_INITIALIZERS, _GRAPH_SPARSE = 1, 5, 15
_NODE_ATTRIBUTES = 5
_FUNCTION_NODES = 7
_ATTRIBUTE_TENSORS = {5: "tensor", 10: "tensor", 22: "sparse", 23: "sparse", 6: "graph", 11: "graph"}
_SPARSE_TENSORS = (1, 2)  # values, indices
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION, _EXTERNAL = 13, 14, 1
_ENTRY_KEY, _ENTRY_VALUE = 1, 2


def external_locations(model: bytes) -> set[str]:
    """Every external-data `location` the ONNX model `model` (its serialized bytes) names: its
    graphs' initializers and sparse initializers, and tensors in node attributes, subgraphs and
    functions included; `""` for an external tensor that names none. Read off the protobuf wire
    format (`ExportFolderError` where it is not one)."""
    found: set[str] = set()
    try:
        for field, value in _fields(model):
            if field == _MODEL_GRAPH:
                _graph(value, found)
            elif field == _MODEL_FUNCTIONS:
                for inner, node in _fields(value):
                    if inner == _FUNCTION_NODES:
                        _node(node, found)
    except (IndexError, ValueError) as error:
        raise ExportFolderError(f"the ONNX model is not a valid protobuf ({error})",
                                 remedy="copy the export folder again, whole, or export again") from None
    return found


def _graph(graph: memoryview, found: set[str]) -> None:
    for field, value in _fields(graph):
        if field == _GRAPH_NODES:
            _node(value, found)
        elif field == _GRAPH_INITIALIZERS:
            _tensor(value, found)
        elif field == _GRAPH_SPARSE:
            _sparse(value, found)


def _node(node: memoryview, found: set[str]) -> None:
    for field, attribute in _fields(node):
        if field != _NODE_ATTRIBUTES:
            continue
        for inner, value in _fields(attribute):
            kind = _ATTRIBUTE_TENSORS.get(inner)
            if kind == "tensor":
                _tensor(value, found)
            elif kind == "sparse":
                _sparse(value, found)
            elif kind == "graph":
                _graph(value, found)


def _sparse(sparse: memoryview, found: set[str]) -> None:
    for field, value in _fields(sparse):
        if field in _SPARSE_TENSORS:
            _tensor(value, found)


def _tensor(tensor: memoryview, found: set[str]) -> None:
    external, locations = False, []
    for field, value in _fields(tensor, varints=True):
        if field == _TENSOR_DATA_LOCATION and value == _EXTERNAL:
            external = True
        elif field == _TENSOR_EXTERNAL_DATA and isinstance(value, memoryview):
            entry = dict(_fields(value))
            if bytes(entry.get(_ENTRY_KEY, b"")) == b"location":
                locations.append(bytes(entry.get(_ENTRY_VALUE, b"")).decode("utf-8", "replace"))
    found.update(locations)
    if external and not locations:
        found.add("")


def _fields(message: bytes | memoryview, *, varints: bool = False):
    """`(field number, value)` of each length-delimited field of `message` (and each varint field's
    integer, with `varints`); fixed-width fields are skipped."""
    data, at = memoryview(message), 0
    while at < len(data):
        key, at = _varint(data, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            if varints:
                yield field, value
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ValueError("a field runs past the end of its message")
            yield field, data[at:at + length]
            at += length
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire} (groups are not in onnx.proto)")


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")
