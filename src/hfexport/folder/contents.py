"""What an export folder holds besides its artifacts: `FolderContents`, what `bundle.save_folder` is given.

A single graph's folder (`kind="model"`) and a generation folder (`kind="generation"`) are saved by
the one `bundle.save_folder`; what a generation folder adds is derived here from the same fields: the
generation config saved (the model's own with the export's settings over it), the manifest's cache
kind and image prompt, and what its runtime package is written from (`package.FolderContext`).

# NOTE: one record rather than keyword arguments: `save_export` and `save_generation_export` were
# two 14-parameter functions sharing 11 of them (issue 51); a record says once what a folder holds,
# and `kind` says which of the two folders it is.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

from ..capture.record import record_of
from ..generation.multimodal import audio_prompt_entry, image_prompt_entry
from .package import FolderContext, GenerationPlan

__all__ = ["FolderContents", "KINDS", "merged_generation_config"]

#: The folders `bundle.save_folder` writes: one graph (`{"model": artifact}`), or a model's generation components.
KINDS = ("model", "generation")


@dataclasses.dataclass(frozen=True)
class FolderContents:
    """What `bundle.save_folder` writes beside the artifacts, and which folder it is (`kind`).

    `model`, `generation_config`, `tokenizer` and `processor` are the eager model's side, saved so
    the folder loads and generates without it; `export_config`, `report`, `extra` and `plan` are
    the export's side. Every field but `kind` may be left `None` (not saved).
    """

    #: `"model"` (one graph) or `"generation"` (its components, packaged for the runtime's LLM runner)
    kind: str = "model"
    #: the eager model; its `config` is saved as `config.json` (and its class named in the manifest)
    model: Any = None
    #: saved as `generation_config.json`; a generation folder saves the model's own with this one's
    #: settings over it (`merged_generation_config`: eos, decoder start, a static cache's `max_cache_len`)
    generation_config: Any = None
    #: saved with its chat template, so `hfexport generate` can print text (`tokenizer_files`)
    tokenizer: Any = None
    #: an image-text model's processor (image processor, tokenizer, chat template) or a speech model's
    #: (feature extractor, tokenizer), saved too, so `hfexport generate --image` can read an image
    #: file (`--audio` an audio file)
    processor: Any = None
    #: the `ExportConfig` used, saved as `export_config.json`
    export_config: Any = None
    #: written as `report.json`, with each component's files and bytes added (`None`: no report)
    report: dict[str, Any] | None = None
    #: more manifest entries (the export job's `weights_from`)
    extra: dict[str, Any] | None = None
    #: the `GenerationPlan` a generation folder's components were exported by (the export job's),
    #: for its runtime package; `None` where the caller exported them itself
    plan: GenerationPlan | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be 'model' or 'generation', got {self.kind!r}")
        if self.plan is not None and self.kind != "generation":
            raise ValueError("a GenerationPlan packages a generation folder: pass kind='generation', or no plan")

    @functools.cached_property
    def saved_generation_config(self) -> Any:
        """The generation config written into the folder (a generation folder's is merged over the
        model's own: `merged_generation_config`)."""
        if self.kind == "generation":
            return merged_generation_config(self.model, self.generation_config)
        return self.generation_config

    def manifest_entries(self, artifacts: dict[str, Any]) -> dict[str, Any]:
        """The manifest's entries from these contents: a generation folder's cache kind and image
        or audio prompt, then `extra`."""
        derived = {}
        if self.kind == "generation":
            derived = {**_cache_kind(artifacts, self.saved_generation_config),
                       **image_prompt_entry(self.model, artifacts), **audio_prompt_entry(self.model, artifacts)}
        return {**derived, **(self.extra or {})}

    def folder_context(self, component_files: dict[str, list[str]]) -> FolderContext:
        """What a generation folder's runtime package is written from (`RuntimePackage.write`), given
        `{component: [file names]}` as written."""
        return FolderContext(getattr(self.model, "config", None), self.saved_generation_config, self.tokenizer,
                             self.plan, self.processor, component_files)


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


def _cache_kind(artifacts: dict[str, Any], generation_config: Any) -> dict[str, Any]:
    """The manifest's word on a generation folder's cache: `cache` (program, static or dynamic),
    `max_cache_len`, `initial_cache`."""
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
