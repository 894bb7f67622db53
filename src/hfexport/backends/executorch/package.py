"""The ExecuTorch export folder as ExecuTorch's own package (`folder.package.RuntimePackage`):
`TextLLMRunnerPackage`, a text decoder as the one program `TextLLMRunner` loads, with the
`tokenizer.json` it reads (`llm_export.py`); `MultimodalRunnerPackage`, an image-text model's
components with the program `MultimodalRunner` loads (`multimodal.py`), and
`AudioMultimodalRunnerPackage`, the same for an audio-text LLM (Whisper keeps its components, the
manifest saying why). All are
`ExecutorchRuntimePackage`s: weights over 64 MiB in a `.ptd`, `TextLLMRunner` as the engine
(`llm_engine.py`); the runner check is each folder's runner (`text_runner.py`, `multimodal_runner.py`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ...config import EXTERNAL_WEIGHTS_BYTES
from ...folder.package import FolderContext, GenerationPlan, Packaged, RuntimePackage, register_package
from .config import ExecutorchConfig

__all__ = ["ExecutorchRuntimePackage", "TextLLMRunnerPackage", "MultimodalRunnerPackage",
           "AudioMultimodalRunnerPackage"]

logger = logging.getLogger("hfexport")


class ExecutorchRuntimePackage(RuntimePackage):
    """What every ExecuTorch export folder is, whatever its task: weights over 64 MiB in a `.ptd`,
    run by `TextLLMRunner`, which says why when the folder is not its package."""

    sizes_own_cache = ("the LLM-runner program's plan (--max-sequence-length N, else the model's positions up to "
                       "2048: the report's llm_runner.cache)")

    def folder_config(self, config: ExecutorchConfig) -> ExecutorchConfig:
        """`external_weights=None` moves weights over `EXTERNAL_WEIGHTS_BYTES` to a `.ptd` in a
        folder, whose manifest lists both files and whose runner maps both (`external.py`)."""
        if config.external_weights is None and config.external_weights_over is None:
            return config.replace(external_weights_over=EXTERNAL_WEIGHTS_BYTES)
        return config

    def plan(self, model, inputs, config, generation_config=None, multi_token_decode=False, *, static_cache=None):
        """The one program ExecuTorch's LLM runner loads, where `ExecutorchConfig.llm_runner` and
        the model allow it (`llm_export.plan_llm_program`), else the components as asked, with the
        report's word on why (whatever the task: `--llm-runner` on a model it cannot serve is refused)."""
        from .llm_export import plan_llm_program

        def components_plan() -> GenerationPlan:
            return super(ExecutorchRuntimePackage, self).plan(model, inputs, config, generation_config,
                                                              multi_token_decode)

        plan = plan_llm_program(model, inputs, config, generation_config, static_cache, components_plan)
        plan.runner_components = True
        return plan

    def run(self, folder: Path, request: Any) -> Any:
        """ExecuTorch `TextLLMRunner`'s greedy tokens on the folder's program (`text_runner.py`)."""
        from .text_runner import run_text_llm_runner

        return run_text_llm_runner(folder, request)

    def open_engine(self, export: Any) -> Any:
        """ExecuTorch's `TextLLMRunner` on a private copy (`llm_engine.py`)."""
        from .llm_engine import open_text_llm_runner_engine

        return open_text_llm_runner_engine(export)


@register_package("executorch", "text-generation")
class TextLLMRunnerPackage(ExecutorchRuntimePackage):
    """ExecuTorch's `TextLLMRunner` folder: a text decoder as the one program it loads."""

    def write(self, folder: Path, artifacts: dict[str, Any], context: FolderContext) -> Packaged:
        """The `tokenizer.json` ExecuTorch's `TextLLMRunner` reads, beside the LLM-runner program,
        the manifest's `runtime_package` and the report's `llm_runner` entries
        (`llm_export.runner_package`), or why it does not open the folder."""
        from .llm_export import runner_package

        return Packaged(*runner_package(folder, artifacts, context))


@register_package("executorch", "image-text-to-text")
class MultimodalRunnerPackage(ExecutorchRuntimePackage):
    """ExecuTorch's `MultimodalRunner` folder: an image-text (or, `AudioMultimodalRunnerPackage`,
    audio-text) model's components and the one program `MultimodalRunner` loads."""

    def components(self, model: Any, plan: GenerationPlan) -> dict[str, Any]:
        """As `RuntimePackage.components`; an image-text or audio-text model that `MultimodalRunner`
        serves (`multimodal.multimodal_refusal`) also gets its one program (`multimodal.py`), over a
        cache of `static_cache=N` tokens, else `llm_export.default_cache_length`'s."""
        from ...generation.components import Component
        from .llm_export import default_cache_length
        from .multimodal import PROGRAM, modality_of, multimodal_component, multimodal_refusal

        components = super().components(model, plan)
        if modality_of(components) is None or multimodal_refusal(model.config, plan.config):
            return components
        named = getattr(plan.generation_config, "max_cache_len", None)  # static_cache=N (--static-cache N)
        cache = named or default_cache_length(model, plan.config.max_sequence_length)[0]
        program, why = multimodal_component(model, components, cache)
        if program is None:
            logger.warning("no MultimodalRunner program: %s", why)
            plan.report["multimodal_runner"] = {"program": None, "why": why}
            return components
        return {**components, PROGRAM: Component(*program)}

    def write(self, folder: Path, artifacts: dict[str, Any], context: FolderContext) -> Packaged:
        """The manifest's word on the folder as a `MultimodalRunner` folder (`multimodal.py`)."""
        from .multimodal import multimodal_package, multimodal_refusal

        if context.plan is None:
            why = "saved without its export plan (no FolderContents.plan)"
        else:
            why = (multimodal_refusal(context.model_config, context.plan.config) if context.model_config is not None
                   else None) or context.plan.report.get("multimodal_runner", {}).get("why")
        return Packaged(multimodal_package(folder, artifacts, context, why), {})

    def run(self, folder: Path, request: Any) -> Any:
        """ExecuTorch `MultimodalRunner`'s greedy tokens on the folder's program for a request with
        the processor's image or audio inputs (`multimodal_runner.run_multimodal_request`)."""
        from .multimodal_runner import run_multimodal_request

        return run_multimodal_request(folder, request)


@register_package("executorch", "automatic-speech-recognition")
class AudioMultimodalRunnerPackage(MultimodalRunnerPackage):
    """ExecuTorch's folder of a speech model: an audio-text LLM's as `MultimodalRunnerPackage`'s
    (a clip through `make_audio_input`); an encoder-decoder's (Whisper) components, whose manifest
    says why no ExecuTorch Python runner opens them (`multimodal.SEQ2SEQ_WHY`)."""
