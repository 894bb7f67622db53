"""The ONNX export folder as onnxruntime-genai's own package (`folder.package.RuntimePackage`): a
static cache's attention rewritten as `GroupQueryAttention` by default, `genai_config.json` beside
the decode graph (`genai.py`), og's `Generator` as the runner check and the engine
(`llm_engine.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...folder.package import FolderContext, Packaged, RuntimePackage, register_package
from .config import OnnxConfig

__all__ = ["OnnxRuntimePackage", "OgWhisperPackage"]


@register_package("onnx", "text-generation")
class OnnxRuntimePackage(RuntimePackage):
    """onnxruntime-genai's folder (see the module docstring); an image-text or speech folder is its
    components, the manifest saying why onnxruntime-genai does not open it."""

    def folder_config(self, config: OnnxConfig) -> OnnxConfig:
        """`group_query_attention=None` is on in a folder: a static cache's attention becomes
        ONNX Runtime's `GroupQueryAttention` (onnxruntime-genai's graph) where the rule matches, and
        the record says why not elsewhere (the config written keeps None)."""
        return config.replace(_in_folder=True)

    def check_listed(self, manifest: dict[str, Any], listed: Any) -> None:
        """An onnxruntime-genai folder's `genai_config.json` holds only what hfexport writes and
        names only listed files (`genai.check_genai_config`); a Whisper folder's
        `audio_processor_config.json` only what hfexport writes, and no file og opens by name lies
        in an onnxruntime-genai folder unlisted (`whisper_folder.check_og_files`)."""
        from ...folder.manifest import parse_json
        from .genai import GENAI_CONFIG, check_genai_config
        from .whisper_folder import check_og_files

        if GENAI_CONFIG in manifest["files"]:
            config = listed.read(GENAI_CONFIG)
            check_genai_config(parse_json(config.data, config.path), set(manifest["files"]), config.path)
            check_og_files(manifest, listed)

    def write(self, folder: Path, artifacts: dict[str, Any], context: FolderContext) -> Packaged:
        """onnxruntime-genai's `genai_config.json` beside a static-cache decode graph with
        GroupQueryAttention (`genai.py`), or the manifest's word on why the folder has none."""
        from .genai import genai_folder_files

        return Packaged(genai_folder_files(folder, artifacts, context), {})

    def run(self, folder: Path, request: Any) -> Any:
        """onnxruntime-genai's greedy tokens on the folder (`genai.run_genai`)."""
        from .genai import run_genai

        return run_genai(folder, request)

    def open_engine(self, export: Any) -> Any:
        """onnxruntime-genai's `og.Generator` on a private copy (`llm_engine.py`)."""
        from .llm_engine import open_genai_engine

        return open_genai_engine(export)


@register_package("onnx", "automatic-speech-recognition")
class OgWhisperPackage(OnnxRuntimePackage):
    """onnxruntime-genai's Whisper folder: a Whisper's components, with og's encoder and decoder
    besides (`whisper.py`), where og 0.18 can run the model (`whisper.og_whisper_refusal`); og's
    `Generator` on the sample clip is the runner check."""

    def components(self, model: Any, plan: Any) -> dict[str, Any]:
        """As `RuntimePackage.components`, and og's two graphs where og serves the model."""
        from ...folder.contents import merged_generation_config
        from ...generation.components import Component
        from .whisper import og_whisper_components, og_whisper_refusal

        components = super().components(model, plan)
        generation_config = merged_generation_config(model, plan.generation_config)
        if {"encoder", "prefill"} - set(components) or og_whisper_refusal(model.config, generation_config, plan.config):
            return components
        added = og_whisper_components(model, components, generation_config)
        return {**components, **{name: Component(*part) for name, part in added.items()}}

    def write(self, folder: Path, artifacts: dict[str, Any], context: FolderContext) -> Packaged:
        """og's `genai_config.json` and `audio_processor_config.json` beside its two graphs
        (`whisper_folder.og_whisper_folder_files`), or the manifest's word on why og does not open
        the folder."""
        from .whisper_folder import og_whisper_folder_files

        return Packaged(og_whisper_folder_files(folder, artifacts, context), {})

    def run(self, folder: Path, request: Any) -> Any:
        """onnxruntime-genai's greedy tokens on the folder's audio request, its processor making the
        features (`whisper_folder.run_og_whisper`)."""
        from .whisper_folder import run_og_whisper

        return run_og_whisper(folder, request)
