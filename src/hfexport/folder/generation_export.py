"""A whole generation export on disk: every component, a manifest, and the model's configs.

```
out/tiny-llama/
  manifest.json            format, components (files, inputs, outputs, shapes, dtypes), cache kind
  decode.onnx              one file (or pair) per component, as the exporter's `save` writes it
  config.json              the model config; generation_config.json; tokenizer files and chat template
                           when given, an image-text or speech model's processor too (`tokenizer_files.py`)
  export_config.json       the ExportConfig used
```
`bundle.save_folder` writes it (given `FolderContents("generation", ...)`) through a staged folder (nothing
half-written is left behind); `GenerationExport.load` opens it again, each component with its
record, ready for a `Runner`.
The manifest is all a runner needs: names, dtypes and symbolic shapes of every input, so a loop
can allocate a static cache without the model's Python class.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..capture.record import ExportRecord
from ..errors import ExportFolderError
from .bundle import record_from_entry, save_folder
from .contents import FolderContents, merged_generation_config
from .manifest import MANIFEST, MANIFEST_VERSION, ListedFiles, listed_path, read_manifest
from .tokenizer_files import PROCESSOR_FILES, is_metadata_file, load_processor, load_tokenizer

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


def save_generation_export(exporter: Any, artifacts: dict[str, Any], directory: str | os.PathLike, *,
                           extra: dict[str, Any] | None = None, details: bool = False, overwrite: bool = False,
                           check: Any = None, **contents: Any) -> Any:
    """Deprecated: `save_folder(exporter, artifacts, directory, FolderContents("generation", ...))`, which
    this calls.

    `contents` are `FolderContents`' fields (`model`, `generation_config`, `tokenizer`,
    `processor`, `export_config`, `report`, `plan`); `extra` is its `extra`.

    Returns:
        The folder written (or, with `details`, the `bundle.SavedExport`).
    """
    warnings.warn("save_generation_export is deprecated and goes in the next release: call "
                  "hfexport.save_folder(exporter, artifacts, directory, hfexport.FolderContents('generation', ...))",
                  DeprecationWarning, stacklevel=2)
    saved = save_folder(exporter, artifacts, directory, FolderContents("generation", extra=extra, **contents),
                        overwrite=overwrite, check=check)
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
        """Open every component of the export in `directory` (written by `bundle.save_folder`, as
        `hfexport export --generate` does, or a single graph's), reading only the files its
        manifest lists.

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
        exporter.runtime_package().check_listed(manifest, listed)  # one check per format, whatever the task
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
