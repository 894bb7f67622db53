"""A whole generation export on disk: every component, a manifest, and the model's configs.

```
out/tiny-llama/
  manifest.json            format, components (files, inputs, outputs, shapes, dtypes), cache kind
  decode.onnx              one file (or pair) per component, as the exporter's `save` writes it
  config.json              the model config; generation_config.json; tokenizer files and chat template
                           when given, an image-text or speech model's processor too (`tokenizer_files.py`)
  export_config.json       the ExportConfig used
```
`save_generation_export` writes it through a staged folder (nothing half-written is left behind);
`GenerationExport.load` opens it again, each component with its record, ready for a `Runner`.
The manifest is all a runner needs: names, dtypes and symbolic shapes of every input, so a loop
can allocate a static cache without the model's Python class.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .bundle import record_from_entry
from ..errors import ExportFolderError
from .manifest import MANIFEST, MANIFEST_VERSION, ListedFiles, listed_path, read_manifest
from ..capture.record import ExportRecord, record_of
from .tokenizer_files import PROCESSOR_FILES, is_metadata_file, load_processor, load_tokenizer
from ..generation.multimodal import image_prompt_entry

__all__ = ["save_generation_export", "GenerationExport", "LoadedComponent", "merged_generation_config", "MANIFEST",
           "MANIFEST_VERSION"]


@dataclasses.dataclass
class LoadedComponent:
    """One component of a saved export: its artifact (as its format's `load` returns it), record and files."""

    name: str
    artifact: Any
    record: ExportRecord
    files: list[Path]

    def runner(self):
        """A `Runner` of this component's artifact in its runtime."""
        from ..runner import runner_for

        return runner_for(self.artifact, self.record)


def _cache_kind(artifacts: dict[str, Any], generation_config: Any) -> dict[str, Any]:
    program = next((record_of(a).details["llm_program"] for a in artifacts.values()
                    if "llm_program" in record_of(a).details), None)
    if program is not None:  # ExecuTorch's LLM-runner program: the cache lives in its buffers
        return {"cache": "program", "max_cache_len": program["max_cache_len"]}
    static = any(record_of(a).details.get("input_mutations") for a in artifacts.values())
    kind: dict[str, Any] = {"cache": "static" if static else "dynamic"}
    initial = {k: v for a in artifacts.values() for k, v in record_of(a).details.get("initial_cache", {}).items()}
    if initial:
        kind["initial_cache"] = initial
    if static and generation_config is not None and getattr(generation_config, "max_cache_len", None):
        kind["max_cache_len"] = int(generation_config.max_cache_len)
    return kind


def merged_generation_config(model: Any, generation_config: Any) -> Any:
    """The model's generation config (eos, decoder start, ...) with the export's settings on top."""
    own = getattr(model, "generation_config", None) if model is not None else None
    if own is None or generation_config is None:
        return generation_config if generation_config is not None else own
    merged = copy.deepcopy(own)
    for key, value in generation_config.to_diff_dict().items():
        if key != "transformers_version":
            setattr(merged, key, value)
    return merged


def save_generation_export(
    exporter: Any,
    artifacts: dict[str, Any],
    directory: str | os.PathLike,
    *,
    model: Any = None,
    generation_config: Any = None,
    tokenizer: Any = None,
    processor: Any = None,
    export_config: Any = None,
    overwrite: bool = False,
    extra: dict[str, Any] | None = None,
    report: dict[str, Any] | None = None,
    details: bool = False,
    check: Any = None,
    plan: Any = None,
) -> Any:
    """Write `artifacts` (from `exporter.export_for_generation`) and what a runner needs into `directory`.

    Args:
        exporter: the exporter that made the artifacts (it writes each one, and packages the
            folder for its runtime's own LLM runner: `RuntimePackage.write`).
        model: the eager model; its `config` (and `generation_config`) are saved beside.
        generation_config: the one used for the export (a static cache's `max_cache_len`); the
            model's own is saved when not given.
        tokenizer: saved too when given, so `hfexport generate` can print text.
        processor: an image-text model's processor (image processor, tokenizer, chat template) or a
            speech model's (feature extractor, tokenizer), saved too when given, so `hfexport
            generate --image` can read an image file (`--audio` an audio file).
        overwrite: replace an earlier hfexport export in `directory` (only the files it wrote);
            otherwise a folder holding files is an error, and a folder holding files no export
            wrote is one either way (`output_folder`).
        extra: more manifest entries.
        report: written as `report.json` beside the manifest, with each component's files and
            bytes added under `components` and their total as `artifact_bytes`.
        details: return the `bundle.SavedExport` (folder, manifest, report) instead of the folder.
        check: run on the written folder before it is moved into place (see `bundle.save_export`).
        plan: the `GenerationPlan` the artifacts were exported by (the export job's), for the
            backend's packaging.

    Returns:
        The folder written (or, with `details`, what was written).
    """
    from .bundle import save_export
    from .package import FolderContext

    merged = merged_generation_config(model, generation_config)
    context = FolderContext(getattr(model, "config", None), merged, tokenizer, plan, processor)
    saved = save_export(exporter, artifacts, directory, kind="generation", model=model, generation_config=merged,
                        tokenizer=tokenizer, processor=processor, export_config=export_config, overwrite=overwrite,
                        manifest_extra={**_cache_kind(artifacts, merged), **image_prompt_entry(model, artifacts), **(extra or {})}, report=report,
                        check=check, context=context)
    return saved if details else saved.directory


@dataclasses.dataclass
class GenerationExport:
    """A generation export loaded from disk (see the module docstring).

    The model's `config` and the `tokenizer` are read from the folder at first use (as `load`
    reads the generation config: only the files its manifest lists, each checked): transformers
    imports a model's own configuration module to build its config, seconds that generating from
    a decoder's token ids does not need (`bench/runner_vs_vendor.py --cold`).
    """

    directory: Path
    format: str
    components: dict[str, LoadedComponent]
    manifest: dict[str, Any]
    generation_config: Any = None
    verify: bool = True

    @classmethod
    def load(cls, directory: str | os.PathLike, *, verify: bool = True) -> GenerationExport:
        """Open every component of the export in `directory` (written by `save_generation_export`,
        `hfexport export --generate`, or a single graph's `save_export`), reading only the files
        its manifest lists.

        Args:
            verify: check every listed file's SHA-256 against the manifest first (0.74 s per GiB
                on 2 CPUs, `bench/manifest_hash.py`); `False` for a folder you wrote or trust (its paths are checked still).

        Raises:
            ExportFolderError: the folder is not an hfexport export, its manifest is damaged or
                newer than this hfexport, or a file is missing or differs from what was written
                (one line naming it).
        """
        from ..auto import AutoHfExporter

        directory = Path(directory)
        manifest = read_manifest(directory, verify=False)  # its shape and paths; the files as they are read
        listed = ListedFiles(directory, manifest, verify=verify)
        # the files no component reads first (configs, tokenizer, report): a damaged one is named
        # before a runtime starts; each component's files are checked as they are read for it
        listed.check_others({f for entry in manifest["components"].values() for f in entry["files"]})
        fmt = manifest["format"]
        exporter = AutoHfExporter.from_format(fmt)
        exporter.runtime_package().check_listed(manifest, listed)
        components = {}
        for name, entry in manifest["components"].items():
            files = [listed.read(relative) for relative in entry["files"]]
            components[name] = LoadedComponent(name, exporter.load(files), record_from_entry(fmt, entry),
                                               [listed_path(directory, f) for f in entry["files"]])
        generation_config = None
        with _listed_metadata(directory, manifest, verify) as metadata:
            if (metadata / "generation_config.json").is_file():
                from transformers import GenerationConfig

                with _read_by_transformers(directory / "generation_config.json"):
                    generation_config = GenerationConfig.from_pretrained(metadata, local_files_only=True)
        return cls(directory, fmt, components, manifest, generation_config, verify)

    @functools.cached_property
    def config(self) -> Any:
        """The model's config (`config.json`, by `AutoConfig`), or None where the export has none."""
        with _listed_metadata(self.directory, self.manifest, self.verify) as metadata:
            if not (metadata / "config.json").is_file():
                return None
            from transformers import AutoConfig

            with _read_by_transformers(self.directory / "config.json"):
                # no code a file names (an `auto_map`) is imported: transformers' own class or an error
                return AutoConfig.from_pretrained(metadata, trust_remote_code=False, local_files_only=True)

    @functools.cached_property
    def tokenizer(self) -> Any:
        """The tokenizer saved with the export (`tokenizer_files.load_tokenizer`), or None."""
        with _listed_metadata(self.directory, self.manifest, self.verify) as metadata:
            with _read_by_transformers(self.directory / "tokenizer_config.json"):
                return load_tokenizer(metadata)

    @property
    def has_processor(self) -> bool:
        """Whether the export carries a processor (an image-text or speech model's, `tokenizer_files.PROCESSOR_FILES`)."""
        return any(name in self.manifest.get("files", {}) for name in PROCESSOR_FILES)

    def load_processor(self) -> Any:
        """The processor saved with the export (`tokenizer_files.load_processor`), read from the files
        the manifest lists as `load` reads the tokenizer; None where it carries none. Loaded on
        demand, not by `load`: an image processor needs Pillow, which generating from token ids and
        image arrays does not.

        Raises:
            ImportError: transformers needs a package to build the processor (`load_processor`).
        """
        if not self.has_processor:
            return None
        with _listed_metadata(self.directory, self.manifest, self.verify) as metadata:
            with _read_by_transformers(self.directory / PROCESSOR_FILES[0]):
                return load_processor(metadata)


@contextlib.contextmanager
def _listed_metadata(directory: Path, manifest: dict[str, Any], verify: bool = True) -> Iterator[Path]:
    """A scratch folder holding the listed files transformers reads (the configs, the tokenizer and
    processor files: `tokenizer_files.is_metadata_file`), written from the bytes checked against
    the manifest (`ListedFiles.read`): transformers' loaders read whatever a folder holds, by names
    of their own, so they are given only what the export wrote, and no file of code (`.py`)."""
    listed = ListedFiles(directory, manifest, verify=verify)
    components = {f for entry in manifest["components"].values() for f in entry["files"]}
    with tempfile.TemporaryDirectory(prefix="hfexport-metadata-") as scratch:
        for relative in manifest["files"]:
            if relative not in components and is_metadata_file(relative):
                (Path(scratch) / relative).write_bytes(listed.read(relative).data)
        yield Path(scratch)


@contextlib.contextmanager
def _read_by_transformers(named: Path) -> Iterator[None]:
    """A file transformers refuses while reading an export's metadata (the copies `_listed_metadata`
    wrote) as one line naming it (`named`, the file in the export folder it reads first)."""
    try:
        yield
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if "trust_remote_code" in str(error):  # transformers 5.24's refusal of an `auto_map` without its own class
            first = ("it names a class transformers does not have, to be built by code of its own (an auto_map), "
                     "and hfexport never runs code from an export folder")
        raise ExportFolderError(f"transformers cannot read {named} (or a file it names beside it): {first}",
                                 remedy="copy the export folder again, whole, from where it was written, or export "
                                 "again") from None
