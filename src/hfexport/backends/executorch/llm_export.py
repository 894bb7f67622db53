"""Which static-cache program an ExecuTorch export folder gets, and the tokenizer file beside it.

```
ExecutorchConfig(), GenerationOptions(static_cache=N)                 hfexport export ... --static-cache N
  llm_runner=None (default)  `LlmProgram` (llm.py): one `decode.pte` TextLLMRunner and hfexport generate run,
                             tokenizer.json beside it; where it cannot serve the export, the
                             static-cache components, with a warning and the report's `llm_runner` saying why
  llm_runner=True            `LlmProgram`, or `PrepareError` with the remedy
  llm_runner=False           the static-cache components (the cache as method inputs)

ExecutorchConfig(), GenerationOptions(generate=True)                  hfexport export ... --generate
  (no static cache, no generation_config, dynamic shapes)
  llm_runner=None or True    `LlmProgram` over a cache of `default_cache_length` tokens (the config's
                             max_sequence_length, else the model's positions up to `DEFAULT_CACHE_LENGTH`);
                             where it cannot serve the export (None only), the dynamic-cache components
  llm_runner=False           the dynamic-cache components (batch and length dynamic, the cache as inputs)
```

# NOTE: why a fallback rather than an error by default. `--static-cache N` on ExecuTorch exported
# the static-cache components before the LLM-runner program existed; where the program cannot
# serve an export (`refusal`: a prompt of several sequences, an encoder-decoder or multimodal
# model, a padded prompt; or `LlmProgram`'s own: attention outside transformers'
# `AttentionInterface`, arguments it cannot apply), those components still give everything the
# request asked for (the batch, the towers, every layer's attention), so nothing asked for is lost:
# only ExecuTorch's own runner cannot load them, which the warning and the report say. Asked for
# by name (`llm_runner=True`), the program is required and a refusal raises.

# NOTE: why the program is the default of a plain `--generate` too. ExecuTorch plans every
# intermediate at its upper bound when a program loads; the dynamic-cache components of a real
# LLM plan their prefill at the config's positions and batch (SmolLM2-135M: 8192 tokens x 8
# sequences, 115 GiB, refused after a 6-minute export), and they decode slower than the program
# (the cache copied in and out each step). ExecuTorch deploys an LLM as this program over a cache
# bounded ahead of time, so a plain `--generate` of a decoder the program serves gets it, with the
# bound said in the report (`llm_runner.cache`); what it cannot serve gets the dynamic-cache
# components, as before, with the reason in the report.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ...capture.prepare import model_name
from ...errors import PrepareError
from ...generation.tasks import DEFAULT_CACHE_LENGTH
from ...generation.tasks import default_cache_length as _package_cache_length
from .llm import OPT_OUT, LlmProgram

__all__ = ["TEXT_RUNNER", "plan_llm_program", "llm_component", "default_llm_component", "try_llm_component", "refusal",
           "fallback_note", "runner_tokenizer", "runner_package", "default_cache_length", "TOKENIZER_FILE",
           "DEFAULT_CACHE_LENGTH"]

logger = logging.getLogger("hfexport")

#: The tokenizer file ExecuTorch's runner reads (`TextLLMRunner(pte, tokenizer_path)`): Hugging Face's JSON.
TOKENIZER_FILE = "tokenizer.json"
#: the runner of the manifest's `runtime_package` entry of a text folder (`manifest.RUNNERS`)
TEXT_RUNNER = "TextLLMRunner"


def plan_llm_program(model: torch.nn.Module, prompt: dict[str, Any], config: Any, generation_config: Any,
                     static_cache: int | None, components_plan: Any) -> Any:
    """The plan of a generation export in a folder (`ExecutorchExporter.plan_generation`): the
    LLM-runner program where the request and the model allow it (the module's table), else
    `components_plan()` (the components as asked), with the report's and the record's word on
    why where the program was wanted and could not serve the export.

    Args:
        config: the `ExecutorchConfig` (`llm_runner`, `max_sequence_length`, `dynamic`).
        generation_config: the request's (`static_cache=N` already made it a static cache).
        static_cache: the cache length the caller named, if any.
        components_plan: returns the `GenerationPlan` of the components as asked.

    Raises:
        ValueError: `llm_runner=True` with a `generation_config` but no `static_cache`.
        PrepareError: `llm_runner=True` and the program cannot serve the export; a sample prompt
            longer than the cache.
    """
    from ...folder.package import GenerationPlan

    if config.llm_runner and generation_config is not None and static_cache is None:
        raise ValueError("llm_runner (--llm-runner) sizes the program's cache from static_cache=N (--static-cache N), "
                         "not from a generation_config: pass static_cache=N instead")
    if config.llm_runner is False:
        return components_plan()
    plain = static_cache is None  # a plain generation export: no cache named
    if plain and (generation_config is not None or not (config.llm_runner or config.dynamic)):
        return components_plan()  # static shapes (`--static`) keep the components unless the program is asked for
    cache, note = (static_cache, None) if not plain else default_cache_length(model, config.max_sequence_length)
    if config.llm_runner:
        program, why = llm_component(model, prompt, cache), None
    elif plain:
        program, why = try_llm_component(model, prompt, cache)
        if why is not None:
            logger.info("%s; exporting the dynamic-cache generation components (hfexport generate runs them, "
                        "ExecuTorch's TextLLMRunner cannot load them)", why)
    else:
        program, why = default_llm_component(model, prompt, cache)
    if program is None:
        plan = components_plan()
        plan.report["llm_runner"] = fallback_note(why, static=not plain)
        plan.record_details["decode"] = {"llm_custom_ops": {"used": False, "reason": why}}
        return plan
    _refuse_prompt_calibration(config)
    from transformers import GenerationConfig

    static = generation_config if not plain else GenerationConfig(cache_implementation="static", max_cache_len=cache)
    return GenerationPlan(prompt, static, True, False, config, components=program,
                          report={"llm_runner": {"cache": {"tokens": cache, "from": note}}} if plain else {})


def _refuse_prompt_calibration(config: Any) -> None:
    """Refuse a quantizer that calibrates on several prompts: the LLM-runner program is built from
    the sample prompt (`llm_component`), and is not captured again on each calibration prompt as
    the generation components are (`generation.calibration`)."""
    quantizer = config.quantizer
    if quantizer is not None and quantizer.needs_calibration and len(quantizer.calibration_samples()) > 1:
        raise PrepareError("ExecuTorch's LLM-runner program is captured on the sample prompt only; calibrating "
                           f"{quantizer!r} on several prompts is not wired for it",
                           remedy="pass --no-llm-runner (llm_runner=False) to export the generation components, "
                           "which calibrate on every prompt, or choose a dynamic or weight-only scheme")


def runner_package(folder: Path, artifacts: dict[str, Any], context: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest's `runtime_package` entry and the report's `llm_runner` entry of a text
    export folder (`context`: an `exporter.FolderContext`): for the LLM-runner program, the files
    `TextLLMRunner` reads, with the tokenizer file it reads placed beside it (`runner_tokenizer`);
    for the components, why the runner cannot load them (the report's `llm_runner` says it already)."""
    from ...folder.manifest import runtime_package_entry
    from ...capture.record import record_of

    planned = context.plan.report.get("llm_runner", {}) if context.plan is not None else {}
    if not any("llm_program" in record_of(artifact).details for artifact in artifacts.values()):
        why = planned.get("why") or ("saved without its export plan (no FolderContents.plan)"
                                     if context.plan is None else "the components were asked for (--no-llm-runner, "
                                     "or static shapes without --static-cache N)")
        return runtime_package_entry(TEXT_RUNNER, why=f"the folder holds the generation components: {why}"), {}
    placed = runner_tokenizer(folder, context.tokenizer)
    program = context.component_files.get("decode", [])
    settings = {"program": "decode.pte", "data": "decode.ptd" if "decode.ptd" in program else None}
    entry = (runtime_package_entry(TEXT_RUNNER, files=[*program, placed["tokenizer"]], settings=settings)
             if placed["tokenizer"] else runtime_package_entry(  # the program runs on a tokenizer given beside it
                 TEXT_RUNNER, why="the export was given no tokenizer: TextLLMRunner needs tokenizer.json",
                 settings=settings))
    return entry, {"llm_runner": {**placed, **({"cache": planned["cache"]} if "cache" in planned else {})}}


def llm_component(model: torch.nn.Module, prompt: dict[str, Any], max_cache_len: int) -> dict[str, Any]:
    """`{"decode": (LlmProgram, kwargs)}`: the one component of a generation export shaped for
    ExecuTorch's LLM runner, sampled on `prompt`'s tokens (at least two, so the token axis traces
    symbolic).

    Raises:
        PrepareError: the program cannot serve the export (`refusal`, or `LlmProgram`'s own), or the
            sample prompt does not fit the cache.
    """
    if why := refusal(model, prompt):
        raise PrepareError(why, model=model_name(model), remedy=OPT_OUT)
    return _program(model, _sample_ids(model, prompt, max_cache_len), max_cache_len)


def default_llm_component(model: torch.nn.Module, prompt: dict[str, Any],
                          max_cache_len: int) -> tuple[dict[str, Any] | None, str | None]:
    """For `llm_runner` left at its default: `(llm_component(...), None)`, or where the program
    cannot serve the export `(None, why)`, with a warning that the static-cache components are
    exported instead (see the module note). A prompt longer than the cache raises either way."""
    program, why = try_llm_component(model, prompt, max_cache_len)
    if program is not None:
        return program, None
    logger.warning("%s; exporting the static-cache components instead (the cache as method inputs): hfexport "
                   "generate runs them, ExecuTorch's TextLLMRunner cannot load them (llm_runner=False, "
                   "--no-llm-runner, asks for them without this warning)", why)
    return None, why


def try_llm_component(model: torch.nn.Module, prompt: dict[str, Any],
                      max_cache_len: int) -> tuple[dict[str, Any] | None, str | None]:
    """`(llm_component(...), None)`, or `(None, why)` where the program cannot serve the export
    (no warning). A prompt longer than the cache raises."""
    why = refusal(model, prompt)
    if why is None:
        ids = _sample_ids(model, prompt, max_cache_len)
        try:
            return _program(model, ids, max_cache_len), None
        except PrepareError as error:
            why = str(error).split("\nWhat to do:")[0]
    return None, why


def default_cache_length(model: torch.nn.Module, max_sequence_length: int | None) -> tuple[int, str]:
    """The cache of a generation export that names none, and where it comes from:
    `max_sequence_length` (`ExecutorchConfig`, `--max-sequence-length`) where given, else the
    model's `max_position_embeddings` up to `DEFAULT_CACHE_LENGTH` (`tasks.default_cache_length`)."""
    if max_sequence_length is not None:
        return int(max_sequence_length), "ExecutorchConfig.max_sequence_length (--max-sequence-length)"
    length, why = _package_cache_length(model)  # the LLM package's default on every backend
    return length, why.replace("--static-cache N", "--static-cache N or --max-sequence-length N")


def refusal(model: torch.nn.Module, prompt: dict[str, Any]) -> str | None:
    """Why the LLM-runner program cannot serve an export of `model` on the sample `prompt`, or
    `None`: it holds one sequence of a text decoder's cache and takes token ids and positions only."""
    from ...generation.components import is_text_decoder

    if getattr(model.config, "is_encoder_decoder", False) or not is_text_decoder(model):
        return ("ExecuTorch's LLM runner drives a text decoder; this model has an encoder or an image/audio tower, "
                "which the program's one method does not hold")
    ids = prompt.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return f"the LLM-runner program takes token ids; the prompt has {sorted(prompt)}"
    extra = sorted(k for k, v in prompt.items() if k not in ("input_ids", "attention_mask") and v is not None)
    if extra:
        return f"the LLM-runner program takes token ids and positions only; the prompt also gives {', '.join(extra)}"
    if ids.shape[0] != 1:
        return (f"the sample prompt holds {ids.shape[0]} sequences; the LLM-runner program holds the cache of one "
                "(TextLLMRunner generates one sequence)")
    mask = prompt.get("attention_mask")
    if isinstance(mask, torch.Tensor) and not bool(mask.all()):
        return "the sample prompt is padded (its attention_mask has zeros); the LLM-runner program takes no mask"
    return None


def _program(model: torch.nn.Module, ids: torch.Tensor, max_cache_len: int) -> dict[str, Any]:
    """`{"decode": (LlmProgram, kwargs)}` sampled on `ids` from position 0 (`LlmProgram` may refuse the model)."""
    return {"decode": (LlmProgram(model, max_cache_len), {"input_ids": ids, "input_pos": torch.tensor([0])})}


def _sample_ids(model: torch.nn.Module, prompt: dict[str, Any], max_cache_len: int) -> torch.Tensor:
    """The prompt's token ids, at least two of them, or `PrepareError` where they do not fit the cache."""
    ids = prompt["input_ids"]
    if ids.shape[1] < 2:
        ids = torch.cat([ids, ids], dim=1)
    if ids.shape[1] >= max_cache_len:
        raise PrepareError(f"the sample prompt's {ids.shape[1]} tokens do not fit the cache of {max_cache_len}",
                           model=model_name(model),
                           remedy="export with a larger cache: --static-cache N (a plain --generate: --max-sequence-length N)")
    return ids


def fallback_note(why: str, *, static: bool = True) -> dict[str, Any]:
    """What the report's `llm_runner` says of an export that fell back: to the static-cache
    components (`default_llm_component`), or for a plain `--generate` (`static=False`) to the
    dynamic-cache ones."""
    fallback = ("the static-cache components (the cache as method inputs)" if static
                else "the dynamic-cache generation components (the cache as method inputs)")
    return {"program": None, "fallback": fallback, "why": why,
            "run": "hfexport generate (GenerationRunner); ExecuTorch's TextLLMRunner cannot load this program"}


def runner_tokenizer(folder: Path, tokenizer: Any) -> dict[str, Any]:
    """Place the tokenizer file ExecuTorch's LLM runner reads in the export `folder`: Hugging
    Face's `tokenizer.json` (written by a fast tokenizer's `save_pretrained`, else from its
    backend). Returns `{"program": ..., "tokenizer": file or None, "run": how to run it}`."""
    path = Path(folder) / TOKENIZER_FILE
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not path.is_file() and backend is not None:
        backend.save(str(path))
    found = path.is_file()
    return {"program": "decode.pte", "tokenizer": TOKENIZER_FILE if found else None,
            "run": "import executorch.extension.llm.custom_ops.custom_ops (the llama:: kernels), then "
                   "executorch.extension.llm.runner.TextLLMRunner('decode.pte', 'tokenizer.json'"
                   "[, data_path='decode.ptd'])" if found else "the export was given no tokenizer: pass the model's "
                   "tokenizer.json to TextLLMRunner"}
