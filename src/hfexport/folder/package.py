"""What an export folder is, apart from its components: the runtime's own package.

An export folder (`export_to_folder`, `hfexport export`) is each format's runtime's own package
where that runtime has one: onnxruntime-genai's folder, OpenVINO GenAI's `LLMPipeline` and
`VLMPipeline` folders, ExecuTorch's `TextLLMRunner` and `MultimodalRunner` programs. Each format's
`RuntimePackage` per task it has a runner for (text, image-text, speech: `PACKAGE_TASKS`), in
`backends/<format>/package.py` and registered there (`@register_package("openvino", "image-text-to-text")`),
is the one place that knows it; `HfExporter.runtime_package(task)` gives it:

```
folder_config(config)          the folder's defaults made explicit in the config it is exported with
request(model, static_cache)   the generation options that make the package (text-generation-with-past)
plan(model, prompt, ...)       -> GenerationPlan: the components its runner needs, or those asked for
components(model, plan)        -> {name: Component}: what `plan` exports
file_stem(name, artifacts)     the file name its runner opens each component by
write(folder, artifacts, FolderContext) -> Packaged: the files its runner reads, written beside the
                               components, and the manifest's one `runtime_package` entry
run(folder, RunnerRequest)     -> RunnerTokens: its runner, greedy on the folder (the job's runner check)
open_engine(export)            its runner as the engine of `hfexport generate` and `chat`
check_listed(manifest, listed) a folder opened from elsewhere: what its runner reads is listed
```
`HfExporter` keeps capture, conversion, quantization, saving and loading of single artifacts; the
base `RuntimePackage` is a folder of the components as asked, with no runner. A task no package of
the format registers gets the format's text-generation package, whose manifest entry says why its
runner does not open the folder (an encoder-decoder's components are not `LLMPipeline`'s model).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch

from ..config import ExportConfig
from ..errors import RegistryError
from ..generation.components import PACKAGE_TASKS
from ..registry import Registry

__all__ = ["RuntimePackage", "GenerationPlan", "FolderContext", "Packaged", "RunnerRequest", "RunnerTokens",
           "RunnerUnavailable", "PACKAGES", "register_package", "package_for"]


@dataclasses.dataclass
class GenerationPlan:
    """How a backend captures a model's generation components (`HfExporter.plan_generation`,
    `RuntimePackage.plan`):
    the arguments `decompose_for_generation` is called with, and the config each component is
    exported with; or the components the backend builds itself (ExecuTorch's LLM-runner program),
    and what the export's report and records say of that choice."""

    inputs: dict[str, Any]
    generation_config: Any
    multi_token_decode: bool
    decode_prefills: bool
    config: ExportConfig | None
    #: `{name: (module, kwargs)}` the backend built itself; None: `decompose_for_generation`'s
    components: dict[str, tuple[torch.nn.Module, dict[str, Any]]] | None = None
    #: entries of the export's `report.json` about the package (ExecuTorch's `llm_runner`)
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: details added to each named component's record once exported (why a program was not made)
    record_details: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: also capture what a runner needs beyond the documented components (an image-text model's
    #: `text_embeddings`: `decompose_for_generation(runner_components=True)`); the export folder
    #: asks for it (`export_to_folder`), the seed's `export_for_generation` does not
    runner_components: bool = False


@dataclasses.dataclass
class FolderContext:
    """What a backend packages a generation export folder from (`RuntimePackage.write`)."""

    #: the model's config (`None` where the caller saved artifacts without the model)
    model_config: Any
    #: the model's generation config with the export's settings over it (what is saved)
    generation_config: Any
    tokenizer: Any
    #: the plan the components were exported by (`None` where `FolderContents.plan` was not given)
    plan: GenerationPlan | None = None
    #: an image-text model's processor (`None` where the model came without one)
    processor: Any = None
    #: `{component: [file names]}` as written into the folder (filled in by `bundle.save_folder`)
    component_files: dict[str, list[str]] = dataclasses.field(default_factory=dict)


class Packaged(NamedTuple):
    """What `RuntimePackage.write` wrote, as entries of the manifest and of the report."""

    manifest: dict[str, Any]
    report: dict[str, Any]


class RuntimePackage:
    """A format's export folder as its runtime's own package (see the module docstring): made for
    one exporter and task (`HfExporter.runtime_package(task)`), which it captures and converts with."""

    #: what the folder is a package for (`PACKAGE_TASKS`; set by `register_package`)
    task: ClassVar[str] = "text-generation"
    #: how this package sizes its cache when the user names none (`request`); `None`: it takes
    #: `tasks.default_cache_length`'s static cache
    sizes_own_cache: ClassVar[str | None] = None

    def __init__(self, exporter: Any):
        self.exporter = exporter

    def folder_config(self, config: ExportConfig) -> ExportConfig:
        """`config` with the options it leaves `None` set to the folder's defaults, where they
        differ from a single artifact's (ONNX's GroupQueryAttention, ExecuTorch's weights file):
        what every export of the folder, one graph or the generation components, is made with."""
        return config

    def request(self, model: torch.nn.Module, static_cache: int | None) -> tuple[Any, dict[str, Any]]:
        """The generation options that make this package (task `text-generation-with-past`,
        `hfexport.generation.tasks`), and the report's word on its cache.

        By default a static-cache decode that also prefills (`static_cache=N`: what onnxruntime-genai's
        folder and `hfexport generate` run), over `static_cache` tokens or, where the user named none,
        `tasks.default_cache_length`; a package whose plan sizes or grows the cache itself
        (`sizes_own_cache`) is asked with `generate=True` alone, as its `--generate` does.

        Returns:
            `(tasks.GenerationFlags, {"tokens": N or None, "from": why})`.
        """
        from ..generation.tasks import GenerationFlags, default_cache_length

        if static_cache is not None:
            named = {"tokens": static_cache, "from": "static_cache=N (--static-cache N)"}
            return GenerationFlags(True, True, static_cache), named
        if self.sizes_own_cache:
            return GenerationFlags(generate=True), {"tokens": None, "from": self.sizes_own_cache}
        length, why = default_cache_length(model)
        return GenerationFlags(True, True, length), {"tokens": length, "from": why}

    def plan(self, model: torch.nn.Module, inputs: dict[str, Any], config: ExportConfig, generation_config: Any = None,
             multi_token_decode: bool = False, *, static_cache: int | None = None) -> GenerationPlan:
        """How the folder captures `model`'s generation components: as the exporter plans them
        (`HfExporter.plan_generation`), with what a runner needs beyond the documented components
        (an image-text model's `text_embeddings`); a package whose runner wants another layout
        plans that (OpenVINO's one stateful model, ExecuTorch's LLM-runner program).

        Args:
            static_cache: the cache length the caller named (`static_cache=N`, `--static-cache N`;
                `generation_config` then already asks for that static cache), which a package may
                size its own program by.
        """
        plan = self.exporter.plan_generation(model, inputs, config, generation_config, multi_token_decode)
        plan.runner_components = True
        return plan

    def components(self, model: torch.nn.Module, plan: GenerationPlan) -> dict[str, Any]:
        """`{name: (module, kwargs)}` that `plan` exports (`generation.decompose.planned_components`),
        and any a package's runner needs besides (a `MultimodalRunner` program)."""
        from ..generation.decompose import planned_components

        return planned_components(model, plan)

    def check_listed(self, manifest: dict[str, Any], listed: Any) -> None:
        """Refuse (`ExportFolderError`) an export folder whose runtime package names a file the
        manifest does not list (onnxruntime-genai's `genai_config.json`, an OpenVINO `.xml`'s
        `.bin`), before any runtime opens it; `listed` (a `manifest.ListedFiles`) reads the files,
        checked. Nothing to check by default."""

    def file_stem(self, name: str, artifacts: dict[str, Any]) -> str:
        """The file name (without suffix) component `name` of `artifacts` is saved under."""
        return name

    def write(self, folder: Path, artifacts: dict[str, Any], context: FolderContext) -> Packaged:
        """Write what the runtime's own runner needs beside a generation export's `artifacts` into
        `folder` (a staged export folder, its components, configs and tokenizer already written),
        and say what was written, with the manifest's one `runtime_package` entry
        (`manifest.runtime_package_entry`): the runner, its files, or why it does not
        open the folder. Nothing by default."""
        return Packaged({}, {})

    @property
    def has_runner(self) -> bool:
        """Whether this format runs a folder in its runtime's own runner (`run`)."""
        return type(self).run is not RuntimePackage.run

    def run(self, folder: Path, request: Any) -> Any:
        """Run the runtime's own runner on a packaged generation export `folder` (written by
        `write`, its manifest read back) greedily as `request` (`RunnerRequest`) asks,
        and return its `RunnerTokens`: the check that the folder is the runtime's
        package (`job.runner_check`). `None`: this format has no such runner.

        Raises:
            RunnerUnavailable: the runner's package is not installed, or the folder
                is not its package (the components), with why.
            RuntimeLoadError: the runner failed on the folder.
        """
        return None

    def open_engine(self, export: Any) -> Any:
        """The runtime's own engine (`folder.engine.LlmEngine`) on the packaged generation
        export `export` (a loaded `GenerationExport`), given a private copy of its checked files or
        their bytes, never the folder (docs/trust.md): what drives `hfexport generate` and `chat`
        on a runtime's package.

        Raises:
            RunnerUnavailable: this format has no engine hfexport drives, the engine's
                package is not installed (`missing=True`), or the folder is not its package, with why.
        """

        raise RunnerUnavailable(f"hfexport drives no runtime engine of the {self.exporter.format} format")


#: The runtime packages, by `"<format>/<task>"` (`register_package`).
PACKAGES: Registry[type[RuntimePackage]] = Registry("runtime package")


def register_package(format: str, task: str, *, override: bool = False):
    """Class decorator: `cls` is `format`'s export folder for `task` (one of `PACKAGE_TASKS`), as
    `HfExporter.runtime_package(task)` gives it. A new runtime's package is one class and this line."""
    if task not in PACKAGE_TASKS:
        raise RegistryError(f"no task {task!r}; a runtime package is for one of {', '.join(PACKAGE_TASKS)}",
                            remedy="register the package for one of those tasks")

    def register(cls: type[RuntimePackage]) -> type[RuntimePackage]:
        if not (isinstance(cls, type) and issubclass(cls, RuntimePackage)):
            raise RegistryError(f"register_package takes a RuntimePackage subclass, got {cls!r}",
                                remedy="subclass hfexport.folder.package.RuntimePackage")
        PACKAGES.add(f"{format}/{task}", cls, override=override)
        cls.task = task
        return cls

    return register


def package_for(exporter: Any, task: str = "text-generation") -> RuntimePackage:
    """`exporter`'s format's package for `task`; for a task it registers none for, its
    text-generation package (which says why its runner does not open such a folder); for a format
    with none, the components as asked (`RuntimePackage`)."""
    if task not in PACKAGE_TASKS:
        raise ValueError(f"no task {task!r}; runtime packages are for {', '.join(PACKAGE_TASKS)}")
    for key in (f"{exporter.format}/{task}", f"{exporter.format}/text-generation"):
        if key in PACKAGES:
            return PACKAGES.get(key)(exporter)
    return RuntimePackage(exporter)


# What the export job asks of a runtime's own LLM runner (`RuntimePackage.run`), and what it answers:
# greedy tokens of a packaged export folder, for `folder.runner_check` to compare with eager `generate`.

@dataclasses.dataclass(frozen=True)
class RunnerRequest:
    """Greedy generation asked of a vendor runner.

    Args:
        prompt_ids: the prompt's token ids, one sequence, special tokens included as the model's
            tokenizer put them (the runner adds none of its own).
        max_new_tokens: how many tokens to generate at most.
        eos_token_ids: the ids that end generation early (the token itself is returned), as
            eager `generate` stops at the model's `eos_token_id`; empty: none.
        audio: a speech runner's input instead of a prompt: mono float32 samples at the model's
            feature extractor's sampling rate, which the runner turns into features itself (its
            decoder prompt is its own, from the folder's generation config); None: a text prompt.
        inputs: a multimodal prompt's processor outputs besides its ids, one sequence's
            (`pixel_values`; an audio-text LLM's `input_features` and its per-frame mask), for a
            runner that takes them (ExecuTorch's `MultimodalRunner`): `prompt_ids` then hold the
            image's or clip's placeholder tokens as the processor wrote them, and eager `generate`
            is given the same; None: a text prompt.
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    eos_token_ids: tuple[int, ...] = ()
    audio: Any = None
    inputs: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class RunnerTokens:
    """What a vendor runner generated: the new token ids (not the prompt) and which runner, with
    its version (`"onnxruntime-genai 0.18.0"`); a speech runner that computes the features itself
    and hands them back (onnxruntime-genai's processor) gives them as `features`, which eager
    `generate()` is then run on (`job.runner_check`); a runner that was given fewer prompt tokens
    than the request's names them as `prompt_ids`, which eager is then given."""

    tokens: tuple[int, ...]
    runner: str
    features: Any = None
    prompt_ids: tuple[int, ...] | None = None


class RunnerUnavailable(Exception):
    """The folder cannot be run by its runtime's LLM runner here: the runner's package is not
    installed (`missing=True`), or the folder is not the runner's package (the components)."""

    def __init__(self, why: str, *, missing: bool = False):
        super().__init__(why)
        self.why = why
        self.missing = missing
