"""Which export a model gets: the task (`TASKS`), inferred from the model or asked for by name.

```
hfexport export tiny:llama -f onnx -o out      --task auto (default): a causal LM gets its runtime's LLM package
  text-generation-with-past   the runtime's LLM package (each format's `RuntimePackage.request`)
  automatic-speech-recognition  a speech encoder-decoder's generation components, which the format's speech
                              package lays out as its runner opens them (OpenVINO GenAI's `WhisperPipeline`)
  generation-components       the generation components as `--generate` exports them
  text-generation             one graph: logits only, no cache outputs
  feature-extraction          one graph: the base model's hidden states
  forward                     one graph: the model's forward as it is (logits and cache of a causal LM)
```
`resolve_task` combines a task with the generation options (`--generate`, `--multi-token-decode`,
`--static-cache`): `None` (the Python API's default) leaves those options to decide, as before
tasks existed; `"auto"` infers the task (`infer_task`) unless `--generate` is given, which keeps
meaning what it meant.

# NOTE: why a causal LM's default is the package rather than one graph. One graph of a causal LM
# returns a cache but takes none: no runtime's app can generate with it. The package is what a
# runtime's LLM runner opens (onnxruntime-genai's folder, OpenVINO GenAI's `LLMPipeline`,
# ExecuTorch's `TextLLMRunner`), so a user who names no task gets the artifact they deploy, and
# the report says how to get the one graph (`--task forward`). A speech encoder-decoder (Whisper)
# likewise gets what a speech runner transcribes with: its generation components, which a format
# with a speech runner packages for it (`register_package(format, "automatic-speech-recognition")`)
# and the others leave as `--generate` writes them, their manifest saying why their runner does not
# open it; `hfexport generate --audio` runs it in every format.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from ..errors import TaskError
from ..model_config import text_config

__all__ = ["Task", "TASKS", "TaskChoice", "GenerationFlags", "DEFAULT_CACHE_LENGTH", "default_cache_length",
           "infer_task", "resolve_task", "check_task_options", "graph_component"]

#: The cache of an LLM package whose length the user names none of (`--static-cache N` names one),
#: capped by the model's `max_position_embeddings` (a 2048-token cache of SmolLM2-135M is 94 MB).
DEFAULT_CACHE_LENGTH = 2048


@dataclasses.dataclass(frozen=True)
class Task:
    """One entry of `TASKS`: its name, what it exports (`package`, `components` or `graph`) and a
    one-line description (`hfexport export --help`, docs/cli.md)."""

    name: str
    exports: str
    description: str


TASKS: dict[str, Task] = {task.name: task for task in (
    Task("text-generation-with-past", "package",
         "the runtime's LLM package: generation components over a cache, as its LLM runner opens them"),
    Task("automatic-speech-recognition", "components",
         "a speech encoder-decoder's generation components, as the runtime's speech runner opens them where it "
         "has one (WhisperPipeline)"),
    Task("generation-components", "components", "the generation components as --generate exports them"),
    Task("text-generation", "graph", "one graph: the logits only, no cache outputs"),
    Task("feature-extraction", "graph", "one graph: the base model's hidden states"),
    Task("forward", "graph", "one graph: the model's forward as it is"),
)}


@dataclasses.dataclass(frozen=True)
class GenerationFlags:
    """The generation options given besides a task (`--generate`, `--multi-token-decode`,
    `--static-cache N`; `GenerationOptions`' fields of those names)."""

    generate: bool = False
    multi_token_decode: bool = False
    static_cache: int | None = None

    @property
    def given(self) -> bool:
        """Whether any generation option is given."""
        return self.generate or self.multi_token_decode or self.static_cache is not None


@dataclasses.dataclass(frozen=True)
class TaskChoice:
    """What `resolve_task` chose: the task, why, and the generation options it stands for (for
    `text-generation-with-past`, `static_cache` is the length the user named or `None`; the
    format's `RuntimePackage.request` makes the package of it)."""

    task: str
    reason: str
    flags: GenerationFlags

    @property
    def exports(self) -> str:
        """What the task exports: `package`, `components` or `graph` (`Task.exports`)."""
        return TASKS[self.task].exports

    def to_dict(self) -> dict[str, Any]:
        """The report's `task` entry."""
        return {"name": self.task, "reason": self.reason}


def default_cache_length(model: Any) -> tuple[int, str]:
    """The cache of an LLM package that names none, and where it comes from: the model's
    `max_position_embeddings` up to `DEFAULT_CACHE_LENGTH`."""
    config = text_config(model.config)
    positions = getattr(config, "max_position_embeddings", None)
    if positions and int(positions) <= DEFAULT_CACHE_LENGTH:
        return int(positions), "the model config's max_position_embeddings"
    return DEFAULT_CACHE_LENGTH, (f"hfexport's default ({DEFAULT_CACHE_LENGTH}; the model allows "
                                  f"{positions or 'any number of'} positions): --static-cache N for another")


def infer_task(model: Any) -> tuple[str, str]:
    """`(task, reason)` for `model` when no task is named: a text decoder that generates gets
    `text-generation-with-past`, a speech encoder-decoder `automatic-speech-recognition`, a
    recurrent decoder (Mamba) its generation components, everything else `forward`; the reason says
    why and how to ask for another."""
    from .components import is_text_decoder

    name = type(model).__name__
    config = model.config
    if not _generates_text(model):
        return "forward", f"{name} does not generate text: one graph of its forward"
    if _is_speech_encoder_decoder(model):
        return "automatic-speech-recognition", (f"{name} transcribes speech: its generation components, as the "
                                                "runtime's speech runner opens them where it has one; `--task "
                                                "forward` for one graph")
    if getattr(config, "is_encoder_decoder", False) or not is_text_decoder(model):
        return "forward", (f"{name} generates text from an encoder's or a tower's inputs, for which hfexport makes "
                           "no runtime's LLM package (their runners drive a text decoder): one graph of its forward; "
                           "`--task generation-components` for its generation components")
    # `_is_stateful` (transformers 5.24.0 modeling_utils.PreTrainedModel): a recurrent state, not key/value layers
    if getattr(model, "_is_stateful", False):
        return "generation-components", (f"{name} generates text over a recurrent state, which no runtime's LLM "
                                          "package holds as a cache: its generation components; `--task forward` "
                                          "for one graph")
    return "text-generation-with-past", f"{name} generates text; `--task forward` for one graph"


def _is_speech_encoder_decoder(model: Any) -> bool:
    """Whether `model` is an encoder-decoder whose encoder reads audio (Whisper's `input_features`)."""
    from .components import package_task

    return bool(getattr(model.config, "is_encoder_decoder", False)) and \
        package_task(model) == "automatic-speech-recognition"


def _generates_text(model: Any) -> bool:
    """Whether `model` generates text: a `*ForCausalLM`, or `can_generate()` with an LM head."""
    if type(model).__name__.endswith("ForCausalLM"):
        return True
    can_generate = getattr(model, "can_generate", None)
    heads = getattr(model, "get_output_embeddings", None)
    return bool(callable(can_generate) and can_generate() and callable(heads) and heads() is not None)


def check_task_options(requested: str | None, flags: GenerationFlags) -> None:
    """Refuse a task the generation options contradict, before the model is loaded (the CLI's
    usage error, exit 2).

    Raises:
        TaskError: an unknown task, or options that contradict it (the message names which to drop).
    """
    if requested is None or requested == "auto":
        return
    if requested not in TASKS:
        raise TaskError(f"unknown task {requested!r}", remedy=f"pass one of auto, {', '.join(TASKS)}")
    exports = TASKS[requested].exports
    if exports == "graph" and flags.given:
        raise TaskError(f"--task {requested} exports one graph, and --generate, --multi-token-decode and "
                        "--static-cache shape generation components",
                        remedy="drop them, or pass --task generation-components (or text-generation-with-past)")
    if exports == "package" and (flags.generate or flags.multi_token_decode):
        raise TaskError("--task text-generation-with-past makes the runtime's LLM package itself; --generate and "
                        "--multi-token-decode ask for the components as they are",
                        remedy="drop them (--static-cache N sizes the package's cache), or pass --task "
                        "generation-components")


def resolve_task(requested: str | None, model: Any, flags: GenerationFlags) -> TaskChoice:
    """The task an export runs, from the task asked for and the generation options given.

    Args:
        requested: a name of `TASKS`, `"auto"` (infer it, `infer_task`, unless `--generate` or
            `--multi-token-decode` is given, which keep their meaning), or `None` (the options
            alone decide, as before tasks).
        model: the loaded model.
        flags: the generation options given (`GenerationFlags`).

    Raises:
        TaskError: an unknown task, options that contradict it (`check_task_options`), or a model
            it does not apply to.
    """
    check_task_options(requested, flags)
    if requested is None or (requested == "auto" and (flags.generate or flags.multi_token_decode)):
        return _by_flags(flags)
    if requested == "auto":
        task, reason = infer_task(model)
        if flags.static_cache is not None and task != "text-generation-with-past":
            raise TaskError(f"--static-cache {flags.static_cache} sizes an LLM package's cache, and {reason}",
                            remedy="drop --static-cache, or add --generate --multi-token-decode for the "
                            "static-cache generation components")
        # a task that exports components asks for them, as naming it does (below)
        generate = TASKS[task].exports == "components"
        return TaskChoice(task, reason, GenerationFlags(generate=generate, static_cache=flags.static_cache))
    if requested == "text-generation" and not _generates_text(model):
        raise TaskError(f"--task text-generation: {type(model).__name__} does not generate text",
                        remedy="pass --task auto, forward or feature-extraction")
    is_speech = _generates_text(model) and _is_speech_encoder_decoder(model)
    if requested == "automatic-speech-recognition" and not is_speech:
        raise TaskError(f"--task automatic-speech-recognition: {type(model).__name__} is no speech encoder-decoder "
                        "(an encoder of audio features and a text decoder, as Whisper)",
                        remedy=f"pass --task auto (here {infer_task(model)[0]}), generation-components or forward")
    if requested == "text-generation-with-past" and (inferred := infer_task(model))[0] != requested:
        raise TaskError(f"--task text-generation-with-past: {inferred[1]}",
                        remedy=f"pass --task auto (here {inferred[0]}), generation-components or forward")
    if TASKS[requested].exports == "components":
        flags = dataclasses.replace(flags, generate=True)
    return TaskChoice(requested, f"asked for (--task {requested})", flags)


def _by_flags(flags: GenerationFlags) -> TaskChoice:
    """The task the generation options alone stand for (they keep their meaning): a static cache
    named is the package over it on every backend, `--generate` the components."""
    if flags.static_cache is not None:
        return TaskChoice("text-generation-with-past", f"the options named a static cache of {flags.static_cache} "
                          "tokens (--static-cache)", flags)
    if flags.generate:
        return TaskChoice("generation-components", "the options asked for the generation components (--generate)",
                          flags)
    return TaskChoice("forward", "no task nor generation option given: one graph of the forward", flags)


def graph_component(task: str, model: Any, inputs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`(module, kwargs)` of the one graph a `graph` task exports: the model's forward as it is
    (`forward`), without the cache (`text-generation`: `use_cache=False`, baked into the graph as
    a constant), or the base model's hidden states (`feature-extraction`)."""
    if task == "forward":
        return model, inputs
    module = model if task == "text-generation" else getattr(model, "base_model", model)
    if "use_cache" in inspect.signature(module.forward).parameters:
        inputs = {**inputs, "use_cache": False}
    return module, inputs
