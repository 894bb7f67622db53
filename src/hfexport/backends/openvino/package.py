"""The OpenVINO export folder as OpenVINO GenAI's own package (`folder.package.RuntimePackage`):
`LLMPipelinePackage`, a decoder's generation as one stateful model `LLMPipeline` opens, with the
converted tokenizer beside it (`genai.py`); `VLMPipelinePackage`, an image-text model's components
with the models `VLMPipeline` opens (`vlm.py`); `WhisperPipelinePackage`, a speech model's
components with the models `WhisperPipeline` opens (`whisper.py`). All are `OpenVINORuntimePackage`s:
what every OpenVINO folder is checked by when opened, and `LLMPipeline` as the runner check and the
engine (`llm_engine.py`); `WhisperPipeline` is the speech folder's runner check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...folder.package import FolderContext, GenerationPlan, Packaged, RuntimePackage, register_package
from .config import INFERENCE_PRECISIONS, KV_CACHE_PRECISIONS

__all__ = ["OpenVINORuntimePackage", "LLMPipelinePackage", "VLMPipelinePackage", "WhisperPipelinePackage"]


class OpenVINORuntimePackage(RuntimePackage):
    """What every OpenVINO export folder is, whatever its task: checked on opening (each model's
    `.bin` listed, only a precision as compile property), run by `LLMPipeline`, which says why
    when the folder is not its package."""

    sizes_own_cache = "none: LLMPipeline's state grows with the conversation (--static-cache N bounds it)"

    def plan(self, model, inputs, config, generation_config=None, multi_token_decode=False, *, static_cache=None):
        """One stateful model for prefill and decode, as OpenVINO GenAI runs it
        (`genai.plan_genai_generation`: a text decoder's; other models as asked)."""
        from .genai import plan_genai_generation

        plan = plan_genai_generation(model, inputs, config, generation_config, multi_token_decode)
        plan.runner_components = True
        return plan

    def check_listed(self, manifest: dict[str, Any], listed: Any) -> None:
        """Every listed `.xml` has its `.bin` listed: OpenVINO GenAI's pipelines open the `.bin`
        beside each model they read (their tokenizer's too), by its name. The compile properties
        the runtime package records, which the engine hands `LLMPipeline`, are the precisions an
        export records and nothing else: another property (`CACHE_DIR`, say) would have the
        runtime write where the folder says. A `WhisperPipeline` folder is held to what hfexport
        writes for it (`whisper.check_whisper_listed`)."""
        from ...errors import ExportFolderError
        from .whisper import RUNNER as WHISPER, check_whisper_listed

        remedy = "copy the export folder again, whole, from where it was written, or export again"
        files = manifest["files"]
        for name in files:
            weights = name.removesuffix(".xml") + ".bin"
            if name.endswith(".xml") and weights not in files:
                raise ExportFolderError(
                    f"{listed.folder / name} reads its weights from {weights}, which manifest.json does not list; an "
                    "OpenVINO model's .bin is written with it", remedy=remedy)
        properties = ((manifest.get("runtime_package") or {}).get("settings") or {}).get("properties", {})
        allowed = {"INFERENCE_PRECISION_HINT": INFERENCE_PRECISIONS, "KV_CACHE_PRECISION": KV_CACHE_PRECISIONS}
        if not isinstance(properties, dict) or any(
                value is None or value not in allowed.get(key, ()) for key, value in properties.items()):
            raise ExportFolderError(f"{listed.folder / 'manifest.json'} gives the runtime the compile properties "
                                    f"{properties!r}; an export records only a precision ({', '.join(allowed)})",
                                    remedy=remedy)
        if (manifest.get("runtime_package") or {}).get("runner") == WHISPER:
            check_whisper_listed(manifest, listed)

    def run(self, folder: Path, request: Any) -> Any:
        """OpenVINO GenAI `LLMPipeline`'s greedy tokens on the folder (`genai.run_llm_pipeline`)."""
        from .genai import run_llm_pipeline

        return run_llm_pipeline(folder, request)

    def open_engine(self, export: Any) -> Any:
        """OpenVINO GenAI's `LLMPipeline` on the checked bytes (`llm_engine.py`)."""
        from .llm_engine import open_llm_pipeline_engine

        return open_llm_pipeline_engine(export)


@register_package("openvino", "text-generation")
class LLMPipelinePackage(OpenVINORuntimePackage):
    """OpenVINO GenAI's `LLMPipeline` folder: a decoder's generation as one stateful model."""

    def file_stem(self, name: str, artifacts: dict[str, Any]) -> str:
        """A generation export in `LLMPipeline`'s layout writes its `decode` as `openvino_model`,
        the name `LLMPipeline` opens (the manifest names the files), unless refused
        (`genai.window_refusal`): then `decode`, which `LLMPipeline` does not open."""
        from .genai import GENAI_MODEL, is_genai_layout, llm_pipeline_refusal

        is_pipeline_model = name == "decode" and is_genai_layout(artifacts) and llm_pipeline_refusal(artifacts) is None
        return GENAI_MODEL if is_pipeline_model else name

    def write(self, folder: Path, artifacts: dict[str, Any], context: FolderContext) -> Packaged:
        """The converted tokenizer `LLMPipeline` needs, beside a generation export in its layout
        (`genai.genai_folder_files`), or the manifest's word on why it does not open the folder."""
        from .genai import genai_folder_files

        return Packaged(genai_folder_files(artifacts, folder, context), {})


@register_package("openvino", "image-text-to-text")
class VLMPipelinePackage(OpenVINORuntimePackage):
    """OpenVINO GenAI's `VLMPipeline` folder: an image-text model's components, with the models
    `VLMPipeline` opens besides (`vlm.py`)."""

    def components(self, model: Any, plan: GenerationPlan) -> dict[str, Any]:
        """As `RuntimePackage.components`, and the two models `VLMPipeline` needs where it serves
        the model (`vlm.vlm_refusal`)."""
        from ...generation.components import Component
        from .vlm import vlm_components, vlm_refusal

        components = super().components(model, plan)
        if "image_encoder" not in components or vlm_refusal(model.config, plan.config):
            return components
        return {**components, **{name: Component(*part) for name, part in vlm_components(model, components).items()}}

    def file_stem(self, name: str, artifacts: dict[str, Any]) -> str:
        """An export with `VLMPipeline`'s models writes them, and its `text_embeddings`, under the
        names `VLMPipeline` opens (`vlm.VLM_STEMS`)."""
        from .vlm import VLM_STEMS

        return VLM_STEMS[name] if "vision_embeddings" in artifacts and name in VLM_STEMS else name

    def write(self, folder: Path, artifacts: dict[str, Any], context: FolderContext) -> Packaged:
        """The converted tokenizer and image processor config `VLMPipeline` needs
        (`vlm.vlm_folder_files`), or the manifest's word on why it does not open the folder."""
        from .vlm import vlm_folder_files, vlm_refusal

        refusal = (vlm_refusal(context.model_config, context.plan.config) if context.plan is not None
                   else "saved without its export plan (no FolderContents.plan)")
        return Packaged(vlm_folder_files(artifacts, folder, context, refusal), {})


@register_package("openvino", "automatic-speech-recognition")
class WhisperPipelinePackage(OpenVINORuntimePackage):
    """OpenVINO GenAI's `WhisperPipeline` folder: a speech encoder-decoder's components, with the
    decoder `WhisperPipeline` opens besides and the encoder under its name (`whisper.py`)."""

    def components(self, model: Any, plan: GenerationPlan) -> dict[str, Any]:
        """As `RuntimePackage.components`, and the decoder `WhisperPipeline` needs where it serves
        the model (`whisper.whisper_refusal`)."""
        from ...folder.contents import merged_generation_config
        from ...generation.components import Component
        from .whisper import whisper_components, whisper_refusal

        components = super().components(model, plan)
        generation_config = merged_generation_config(model, plan.generation_config)
        if {"encoder", "prefill"} - set(components) or whisper_refusal(model.config, generation_config, plan.config):
            return components
        added = whisper_components(model, components)
        return {**components, **{name: Component(*part) for name, part in added.items()}}

    def file_stem(self, name: str, artifacts: dict[str, Any]) -> str:
        """An export with `WhisperPipeline`'s decoder writes it and the encoder under the names
        `WhisperPipeline` opens (`whisper.WHISPER_STEMS`)."""
        from .whisper import WHISPER_STEMS

        return WHISPER_STEMS[name] if "whisper_decoder" in artifacts and name in WHISPER_STEMS else name

    def write(self, folder: Path, artifacts: dict[str, Any], context: FolderContext) -> Packaged:
        """The converted tokenizer and `preprocessor_config.json` `WhisperPipeline` needs
        (`whisper.whisper_folder_files`), or the manifest's word on why it does not open the folder."""
        from .whisper import whisper_folder_files, whisper_refusal

        extractor = getattr(context.processor, "feature_extractor", None)
        refusal = (whisper_refusal(context.model_config, context.generation_config, context.plan.config, extractor)
                   if context.plan is not None else "saved without its export plan (no FolderContents.plan)")
        return Packaged(whisper_folder_files(artifacts, folder, context, refusal), {})

    def run(self, folder: Path, request: Any) -> Any:
        """OpenVINO GenAI `WhisperPipeline`'s greedy tokens on the folder's audio request
        (`whisper.run_whisper_pipeline`)."""
        from .whisper import run_whisper_pipeline

        return run_whisper_pipeline(folder, request)
