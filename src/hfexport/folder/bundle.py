"""An export on disk: its artifacts, a manifest naming every file, the configs, and the report.

```
out/tiny-llama/
  manifest.json        kind ("model" | "generation"), format, files (every file's size and SHA-256),
                       components (files, bytes, inputs, outputs): `manifest.py` writes and checks it
  model.onnx           one artifact per component, as its exporter writes it (or prefill.onnx, decode.onnx)
  config.json          the model config (+ generation_config.json for a generation export)
  tokenizer.json, ...  the tokenizer and its chat template, when the model came with one (`tokenizer_files`)
  processor_config.json  an image-text model's processor, when it came with one (`tokenizer_files`)
  export_config.json   the ExportConfig used
  report.json          validation and timings, with each component's files and bytes
```
`save` writes it through a staged folder (`output_folder.staged_folder`): nothing half-written
is left behind, nothing hfexport did not write is replaced, and the artifacts are written once,
straight into that folder. A single graph and a generation export share this one path, given what
goes in beside the artifacts as one `FolderContents` (`contents.py`); the manifest's `kind` says
which it is, and only a generation export records a cache and its runtime's own package.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Any

from ..capture.record import ExportRecord, record_of
from ..generation.components import package_task
from ..timing import phase
from .contents import FolderContents
from .manifest import MANIFEST, MANIFEST_VERSION, write_manifest
from .output_folder import model_folder, staged_folder
from .package import Packaged
from .tokenizer_files import save_processor_files, save_tokenizer_files

__all__ = ["save_folder", "FolderContents", "SavedExport", "save_export", "MANIFEST", "MANIFEST_VERSION",
           "record_entry", "record_from_entry"]


@dataclasses.dataclass
class SavedExport:
    """What `save` wrote: the folder, the manifest and the report (as written)."""

    directory: Path
    manifest: dict[str, Any]
    report: dict[str, Any] | None


def record_entry(record: ExportRecord) -> dict[str, Any]:
    """A record's manifest entry: the interface a caller needs without the model's Python class
    (with `state` when the artifact keeps its cache as runtime state: a caller resets or sets
    those variables instead of feeding the cache leaves; `compile_properties` when the runtime
    should be given some; `in_place_cache`, the ONNX cache inputs whose output is written into
    their own buffer; `graph_interface`, how an ONNX GroupQueryAttention graph's inputs differ from
    the record's (`backends/onnx/gqa.py`); `external_weights`, the ExecuTorch `.ptd` a program keeps its weights in,
    with the fingerprint its runner checks)."""
    entry = {
        "model_class": record.model_class,
        "inputs": [
            {"name": n, "shape": list(s), "dtype": d}
            for n, s, d in zip(record.input_names, record.input_shapes, record.input_dtypes or [""] * len(record.input_names))
        ],
        "outputs": list(record.output_names),
        "input_keys": list(record.input_keys),
        "symbol_ranges": {k: list(v) for k, v in record.symbol_ranges.items()},
        "input_mutations": record.details.get("input_mutations", 0),
    }
    for key in _RUNTIME_FACTS:
        if record.details.get(key) is not None:
            entry[key] = record.details[key]
    return entry


#: A runtime's own facts a caller needs, kept in the manifest: OpenVINO's state variables and
#: compile properties, the ONNX cache inputs written in place (so a runner need not read the graph)
#: and the ONNX graph's own interface, the ExecuTorch weights file and its fingerprint (so a runner
#: refuses another export's), the kernel libraries an ExecuTorch program's ops need (a saved
#: program loaded in a fresh process), and the method an ExecuTorch program runs where it is not
#: `forward` (`MultimodalRunner`'s `text_decoder`).
_RUNTIME_FACTS = ("state", "compile_properties", "in_place_cache", "graph_interface", "external_weights",
                  "kernel_libraries", "method")


def record_from_entry(fmt: str, entry: dict[str, Any]) -> ExportRecord:
    """The record a manifest entry describes (no program: the artifact is loaded from its files)."""
    inputs = entry["inputs"]
    details = {"input_mutations": entry.get("input_mutations", 0)} if entry.get("input_mutations") else {}
    for key in _RUNTIME_FACTS:
        if entry.get(key) is not None:
            details[key] = entry[key]
    return ExportRecord(
        format=fmt,
        model_class=entry.get("model_class", "?"),
        input_names=[i["name"] for i in inputs],
        output_names=list(entry["outputs"]),
        input_shapes=[tuple(i["shape"]) for i in inputs],
        symbol_ranges={k: tuple(v) for k, v in entry.get("symbol_ranges", {}).items()},
        details=details,
        input_keys=list(entry.get("input_keys", [])),
        input_dtypes=[i.get("dtype", "") for i in inputs],
    )


def _with_sizes(report: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """`report` with each component's files and bytes and the total (`artifact_bytes`)."""
    report = copy.deepcopy(report)
    per_component = report.setdefault("components", {})
    for name, entry in components.items():
        per_component.setdefault(name, {}).update(files=entry["files"], bytes=entry["bytes"])
    report["artifact_bytes"] = sum(entry["bytes"] for entry in components.values())
    return report


def save_folder(exporter: Any, artifacts: dict[str, Any], directory: str | os.PathLike, contents: FolderContents, *,
                overwrite: bool = False, check: Any = None) -> SavedExport:
    """Write `artifacts` (`{component name: artifact}`, from one exporter) and what loads them
    again (`contents`) into `directory`.

    Args:
        exporter: the exporter that made the artifacts (its `write` puts each one in the folder;
            for a generation folder its `RuntimePackage.write` adds its runtime's own files, once
            everything else is written, and what it returns goes into the manifest and the report).
        artifacts: `{"model": artifact}` for `kind="model"`, the generation components for
            `kind="generation"` (from `exporter.export_for_generation`).
        contents: what the folder holds besides the artifacts, and which folder it is
            (`contents.FolderContents`).
        overwrite: replace an earlier hfexport export in `directory` (only the files it wrote);
            otherwise a folder holding files is an error, and a folder holding files no export
            wrote is one either way (`output_folder`).
        check: called with the written folder before it takes `directory`'s place: its returned
            dict is added to the report, and an exception leaves nothing written (the export
            job's accuracy gate, which runs the saved export).

    Returns:
        A `SavedExport`.
    """
    target = Path(directory).resolve()
    package = exporter.runtime_package(package_task(contents.model, artifacts))
    with staged_folder(target, overwrite=overwrite, source=model_folder(contents.model)) as staging:
        components = {}
        for name, artifact in artifacts.items():
            with phase("serialise", component=name):
                files = exporter.write(artifact, staging, name=package.file_stem(name, artifacts))
            components[name] = {"files": [f.name for f in files], "bytes": sum(f.stat().st_size for f in files),
                                **record_entry(record_of(artifact))}
        _write_beside(staging, contents)
        packaged = Packaged({}, {})
        if contents.kind == "generation":  # the runtime's own files, once the folder holds everything else
            files = {name: entry["files"] for name, entry in components.items()}
            packaged = package.write(staging, artifacts, contents.folder_context(files))
        manifest = {
            "kind": contents.kind,
            "format": exporter.format,
            "model_class": type(contents.model).__name__ if contents.model is not None else None,
            **contents.manifest_entries(artifacts),
            **packaged.manifest,
            "components": components,
        }
        entry = packaged.manifest.get("runtime_package")
        package_entry = {"runtime_package": entry} if entry is not None else {}
        report = contents.report
        report = {**report, **package_entry, **packaged.report} if report is not None else None
        written = _with_sizes(report, components) if report is not None else None
        if written is not None:
            (staging / "report.json").write_text(json.dumps(written, indent=2, default=str))
        manifest = write_manifest(staging, manifest)  # last, listing every file (a check loads the folder)
        if check is not None:
            if found := check(staging):
                written = {**(written or {}), **found}
                (staging / "report.json").write_text(json.dumps(written, indent=2, default=str))
            manifest = write_manifest(staging, manifest, changed=frozenset({"report.json"}))
    return SavedExport(target, manifest, written)


def _write_beside(staging: Path, contents: FolderContents) -> None:
    """Write the configs, the tokenizer and the processor `contents` holds into `staging`."""
    if contents.export_config is not None:
        (staging / "export_config.json").write_text(contents.export_config.to_json(indent=2))
    model = contents.model
    if model is not None and getattr(model, "config", None) is not None:
        model.config.save_pretrained(staging)
    if contents.saved_generation_config is not None:
        contents.saved_generation_config.save_pretrained(staging)
    if contents.tokenizer is not None:
        save_tokenizer_files(contents.tokenizer, staging)
    if contents.processor is not None:
        save_processor_files(contents.processor, staging)


def save_export(exporter: Any, artifacts: dict[str, Any], directory: str | os.PathLike, *,
                manifest_extra: dict[str, Any] | None = None, context: Any = None, overwrite: bool = False,
                check: Any = None, **contents: Any) -> SavedExport:
    """Deprecated: `save_folder(exporter, artifacts, directory, FolderContents(...))`, which this calls.

    `contents` are `FolderContents`' fields (`kind`, `model`, `generation_config`, `tokenizer`,
    `processor`, `export_config`, `report`); `manifest_extra` is its `extra`, and a `context`
    gives its `plan` (a generation folder's context is derived from the contents now).
    """
    warnings.warn("save_export is deprecated and goes in the next release: call "
                  "hfexport.save_folder(exporter, artifacts, directory, hfexport.FolderContents(...))",
                  DeprecationWarning, stacklevel=2)
    plan = getattr(context, "plan", None) if contents.get("kind") == "generation" else None
    return save_folder(exporter, artifacts, directory, FolderContents(extra=manifest_extra, plan=plan, **contents),
                       overwrite=overwrite, check=check)
