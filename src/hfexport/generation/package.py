"""A whole generation export on disk: every component, a manifest, and the model's configs.

```
out/tiny-llama/
  manifest.json            format, components (files, inputs, outputs, shapes, dtypes), cache kind
  decode.onnx              one file (or pair) per component, as the exporter's `save` writes it
  config.json              the model config; generation_config.json; tokenizer files when given
  export_config.json       the ExportConfig used
```
`save_generation_export` writes it through a staged folder (nothing half-written is left behind);
`GenerationExport.load` opens it again, each component with its record, ready for a `Runner`.
The manifest is all a runner needs: names, dtypes and symbolic shapes of every input, so a loop
can allocate a static cache without the model's Python class.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ..errors import SerializationError
from ..record import ExportRecord, record_of
from ..storage import staged_folder

__all__ = ["save_generation_export", "GenerationExport", "Component", "MANIFEST", "MANIFEST_VERSION"]

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


@dataclasses.dataclass
class Component:
    """One loaded component: its artifact (as its backend's `load` returns it) and record."""

    name: str
    artifact: Any
    record: ExportRecord
    files: list[Path]

    def runner(self):
        from ..runner import runner_for

        return runner_for(self.artifact, self.record)


def _record_entry(record: ExportRecord) -> dict[str, Any]:
    return {
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


def _record_from_entry(fmt: str, entry: dict[str, Any]) -> ExportRecord:
    inputs = entry["inputs"]
    details = {"input_mutations": entry.get("input_mutations", 0)} if entry.get("input_mutations") else {}
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


def _cache_kind(artifacts: dict[str, Any], generation_config: Any) -> dict[str, Any]:
    static = any(record_of(a).details.get("input_mutations") for a in artifacts.values())
    kind: dict[str, Any] = {"cache": "static" if static else "dynamic"}
    initial = {k: v for a in artifacts.values() for k, v in record_of(a).details.get("initial_cache", {}).items()}
    if initial:
        kind["initial_cache"] = initial
    if static and generation_config is not None and getattr(generation_config, "max_cache_len", None):
        kind["max_cache_len"] = int(generation_config.max_cache_len)
    return kind


def _merged_generation_config(model: Any, generation_config: Any) -> Any:
    """The model's generation config (eos, decoder start, ...) with the export's settings on top."""
    own = getattr(model, "generation_config", None) if model is not None else None
    if own is None or generation_config is None:
        return generation_config if generation_config is not None else own
    merged = copy.deepcopy(own)
    for key, value in generation_config.to_diff_dict().items():
        if key != "transformers_version":
            setattr(merged, key, value)
    return merged


def _with_sizes(report: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """`report` with each component's files and bytes and the total (`artifact_bytes`)."""
    report = copy.deepcopy(report)
    per_component = report.setdefault("components", {})
    for name, entry in components.items():
        per_component.setdefault(name, {}).update(files=entry["files"], bytes=entry["bytes"])
    report["artifact_bytes"] = sum(entry["bytes"] for entry in components.values())
    return report


def save_generation_export(
    exporter: Any,
    artifacts: dict[str, Any],
    directory: str | os.PathLike,
    *,
    model: Any = None,
    generation_config: Any = None,
    tokenizer: Any = None,
    export_config: Any = None,
    overwrite: bool = False,
    extra: dict[str, Any] | None = None,
    reports: dict[str, Any] | None = None,
    with_generation_config: bool = True,
) -> Path:
    """Write `artifacts` (from `exporter.export_for_generation`) and what a runner needs into `directory`.

    Args:
        exporter: the exporter that made the artifacts (its `save` writes each one).
        model: the eager model; its `config` (and `generation_config`) are saved beside.
        generation_config: the one used for the export (a static cache's `max_cache_len`); the
            model's own is saved when not given.
        tokenizer: saved too when given, so `hfexport generate` can print text.
        overwrite: replace an existing folder's contents; otherwise a non-empty folder is an error.
        extra: more manifest entries.
        reports: a JSON-able report written as `report.json` beside the manifest, with each
            component's files and bytes added under `components` and their total as `artifact_bytes`.
        with_generation_config: write `generation_config.json` (a single-graph export has no use for it).

    Returns:
        The folder written.
    """
    target = Path(directory).resolve()
    generation_config = _merged_generation_config(model, generation_config)
    with staged_folder(target, overwrite=overwrite) as staging:
        components = {}
        for name, artifact in artifacts.items():
            files = exporter.save(artifact, staging, name=name)
            components[name] = {"files": [f.name for f in files], "bytes": sum(f.stat().st_size for f in files),
                                **_record_entry(record_of(artifact))}
        manifest = {
            "hfexport_manifest": MANIFEST_VERSION,
            "format": exporter.format,
            "model_class": type(model).__name__ if model is not None else None,
            **_cache_kind(artifacts, generation_config),
            "components": components,
            **(extra or {}),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
        if reports is not None:
            (staging / "report.json").write_text(json.dumps(_with_sizes(reports, components), indent=2, default=str))
        if export_config is not None:
            (staging / "export_config.json").write_text(export_config.to_json(indent=2))
        if model is not None:
            model.config.save_pretrained(staging)
        if generation_config is not None and with_generation_config:
            generation_config.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
    return target


@dataclasses.dataclass
class GenerationExport:
    """A generation export loaded from disk (see the module docstring)."""

    directory: Path
    format: str
    components: dict[str, Component]
    manifest: dict[str, Any]
    config: Any = None
    generation_config: Any = None
    tokenizer: Any = None

    @classmethod
    def load(cls, directory: str | os.PathLike) -> GenerationExport:
        """Open every component of the export in `directory` (written by `save_generation_export`
        or `hfexport export --generate`)."""
        from ..auto import AutoHfExporter

        directory = Path(directory)
        path = directory / MANIFEST
        if not path.is_file():
            raise SerializationError(f"{directory} holds no {MANIFEST}",
                                     remedy="pass a folder written by `hfexport export --generate` or save_generation_export")
        manifest = json.loads(path.read_text())
        fmt = manifest["format"]
        exporter = AutoHfExporter.from_format(fmt)
        components = {}
        for name, entry in manifest["components"].items():
            files = [directory / f for f in entry["files"]]
            missing = [str(f) for f in files if not f.exists()]
            if missing:
                raise SerializationError(f"component {name!r} is missing {missing}", remedy="export again")
            components[name] = Component(name, exporter.load(files), _record_from_entry(fmt, entry), files)
        config = generation_config = tokenizer = None
        if (directory / "config.json").is_file():
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(directory)
        if (directory / "generation_config.json").is_file():
            from transformers import GenerationConfig

            generation_config = GenerationConfig.from_pretrained(directory)
        if any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(directory)
        return cls(directory, fmt, components, manifest, config, generation_config, tokenizer)
