"""`OnnxModelBytes`: an ONNX model opened from its files' bytes, never from a path.

```
OnnxExporter.load(files)     model.onnx's bytes + the external data files among `files`
  external_locations         every `location` the model names, read from its protobuf
  (a location not among the files: refused, naming it; never looked up on disk)
OnnxRunner                   InferenceSession(model bytes) + the data files from memory
                             (SessionOptions.add_external_initializers_from_files_in_memory)
```

# NOTE: why from memory. ONNX Runtime given a path opens the model's external data by the
# `location` the model names, at session creation: a file checked before, or not at all (a model
# naming an unlisted `hidden.bin` beside it), is read by name after any check. Given bytes, it
# looks each location up among the files handed to it first (onnxruntime 1.32); a location it does
# not find there it would look for relative to the working folder, so every location is checked to
# be one of the given files before ONNX Runtime sees the model. It copies the weights while it
# builds the session (prepacking them), as it does from a mapped file: the bytes are let go once a
# session holds them (`release`), so a loaded model costs its bytes twice only while a session is
# built (a 200 MB weight: 479 MB peak, 279 MB after, against 255 MB from a path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import ExportFolderError
from ...manifest import FileBytes

__all__ = ["OnnxModelBytes", "external_locations"]


class OnnxModelBytes:
    """An ONNX model loaded from the bytes of its files (`OnnxExporter.load`).

    Args:
        model: the `.onnx` file.
        files: the other files given with it, among which every external-data location the model
            names must be (`ExportFolderError` naming the first that is not).
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
        self.path = model.path
        self.model = model.data
        self._external = [given[name] for name in sorted(named)]
        self._released = False

    def __repr__(self) -> str:
        return f"OnnxModelBytes({str(self.path)!r}, external={[f.name for f in self._external]})"

    def session_source(self, options: Any) -> bytes:
        """The model's bytes for `InferenceSession`, its external data files added to `options`
        from memory (read again, checked again, if `release` let them go)."""
        if self._released:
            self._external = [f.again() if f.again else f for f in self._external]
            self._released = False
        if self._external:
            options.add_external_initializers_from_files_in_memory(
                [f.name for f in self._external], [f.data for f in self._external],
                [len(f.data) for f in self._external])
        return self.model

    def release(self) -> None:
        """Let the external data's bytes go (a session built from them holds its own copy)."""
        if all(f.again for f in self._external):
            self._external = [FileBytes(f.path, b"", f.again) for f in self._external]
            self._released = bool(self._external)


def external_locations(model: bytes) -> set[str]:
    """Every external-data `location` the ONNX model `model` (its serialized bytes) names: its
    initializers', sparse initializers', and those of tensors in node attributes, subgraphs and
    functions included."""
    import onnx

    proto = onnx.ModelProto.FromString(model)
    found: set[str] = set()
    for graph in _graphs(proto):
        tensors = [*graph.initializer, *(t for s in graph.sparse_initializer for t in (s.values, s.indices))]
        for node in graph.node:
            tensors.extend(_attribute_tensors(node))
        for tensor in tensors:
            found.update(entry.value for entry in tensor.external_data if entry.key == "location")
            if tensor.data_location == onnx.TensorProto.EXTERNAL and not any(
                    entry.key == "location" for entry in tensor.external_data):
                found.add("")  # external, naming no file: refused as an unlisted name
    for function in proto.functions:
        for node in function.node:
            for tensor in _attribute_tensors(node):
                found.update(entry.value for entry in tensor.external_data if entry.key == "location")
    return found


def _graphs(proto: Any) -> list[Any]:
    """The model's graph and every subgraph in its nodes' attributes (and its functions'), recursively."""
    found, pending = [], [proto.graph, *(g for f in proto.functions for n in f.node for g in _subgraphs(n))]
    while pending:
        graph = pending.pop()
        found.append(graph)
        pending.extend(g for node in graph.node for g in _subgraphs(node))
    return found


def _subgraphs(node: Any) -> list[Any]:
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def _attribute_tensors(node: Any) -> list[Any]:
    tensors = []
    for attribute in node.attribute:
        if attribute.HasField("t"):
            tensors.append(attribute.t)
        tensors.extend(attribute.tensors)
        for sparse in ([attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []) + list(
                attribute.sparse_tensors):
            tensors.extend((sparse.values, sparse.indices))
    return tensors
