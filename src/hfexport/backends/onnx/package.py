"""The ONNX export folder as onnxruntime-genai's own package (`folder.package.RuntimePackage`): a
static cache's attention rewritten as `GroupQueryAttention` by default, `genai_config.json` beside
the decode graph (`genai.py`), og's `Generator` as the runner check and the engine
(`llm_engine.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...folder.package import FolderContext, Packaged, RuntimePackage, register_package
from .config import OnnxConfig

__all__ = ["OnnxRuntimePackage"]


@register_package("onnx", "text-generation")
class OnnxRuntimePackage(RuntimePackage):
    """onnxruntime-genai's folder (see the module docstring); an image-text or speech folder is its
    components, the manifest saying why onnxruntime-genai does not open it."""

    def folder_config(self, config: OnnxConfig) -> OnnxConfig:
        """`group_query_attention=None` is on in a folder: a static cache's attention becomes
        ONNX Runtime's `GroupQueryAttention` (onnxruntime-genai's graph), where the rule matches."""
        return config.replace(group_query_attention=True) if config.group_query_attention is None else config

    def check_listed(self, manifest: dict[str, Any], listed: Any) -> None:
        """An onnxruntime-genai folder's `genai_config.json` holds only what hfexport writes and
        names only listed files (`genai.check_genai_config`)."""
        from ...folder.manifest import parse_json
        from .genai import GENAI_CONFIG, check_genai_config

        if GENAI_CONFIG in manifest["files"]:
            config = listed.read(GENAI_CONFIG)
            check_genai_config(parse_json(config.data, config.path), set(manifest["files"]), config.path)

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
