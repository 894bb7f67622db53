"""The export job's check that a packaged generation folder runs in its runtime's own LLM runner
(onnxruntime-genai, OpenVINO GenAI's `LLMPipeline`, ExecuTorch's `TextLLMRunner`) and gives the
tokens it should, before the folder is moved into place.

```
runner_check(package, model, prompt, generation_config, min_agreement=None)(folder) -> {"runner": ...}
  request   the sample prompt's first sequence, RUNNER_TOKENS greedy tokens (fewer where the cache
            holds fewer), stopping at the model's end tokens
  run       package.run(folder, request): the format's RuntimePackage runs its runtime's runner
  compare   fp32: the runner's tokens equal eager generate()'s exactly (checked in one eager forward
            over the prompt and those tokens where it can be, `_eager_picks_each`); quantized: they
            agree with hfexport's own runner on the same folder on at least `min_agreement` of the steps
```
A speech model's folder is checked on a clip made offline (`audio_input.sample_clip`): its speech
runner (`WhisperPipeline`, onnxruntime-genai's Whisper) is given the samples and makes its own
features; eager `generate()` is given the model's feature extractor's features of the same samples,
or, from a runner that hands back the features it made (onnxruntime-genai's processor, whose
log-mel differs from transformers' at the clip's ends), those, the difference reported. A folder
whose format has no speech runner reports why its runner does not open it (the manifest's
`runtime_package`). An audio-text LLM's folder is checked on the clip made to fill the feature
extractor's chunk (ExecuTorch's `MultimodalRunner` program serves that length) in the processor's
prompt: the runner is given the prompt's ids and the processor's features (`RunnerRequest.inputs`),
eager `generate()` the processor's whole output. An image-text folder's runner is given the sample
prompt's image beside its ids (a runner that takes none says why it is not checked).
A difference, or a runner that fails on the folder, raises `ValidationError` (nothing is
written). A runner that is not installed, or a folder that is not its package (the components),
is reported (`{"checked": false, "why": ...}`) and the export stands; a missing package is
warned about, once per export.

# NOTE: why a quantized export is compared with hfexport's runner and not with eager. The
# accuracy gate (`accuracy.py`) already holds its tokens to fp32 eager's, teacher-forced; free
# running, one near-tie makes every later token differ, so eager is no reference for a quantized
# program's runner. The same folder run by hfexport's own runner is: the two run the same graph,
# so they agree but for kernels' rounding, held to the gate's agreement floor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import PrepareError, ValidationError
from ..folder.manifest import read_manifest, runtime_package
from ..folder.package import RunnerRequest, RunnerTokens, RunnerUnavailable
from ..resident import drop_clean_pages, weight_storages

__all__ = ["runner_check", "skipped_entry", "RUNNER_TOKENS"]

logger = logging.getLogger("hfexport")

#: Greedy tokens the runner generates (fewer where the cache holds fewer after the prompt).
RUNNER_TOKENS = 16
#: the package task whose runner takes audio, not a text prompt (an audio-text LLM's: both)
SPEECH = "automatic-speech-recognition"
#: the package task whose runner takes the prompt's image beside its ids
IMAGE_TEXT = "image-text-to-text"


def skipped_entry() -> dict[str, Any]:
    """The report's `runner` entry of an export written without validation."""
    return {"runner": {"checked": False, "why": "skipped: validation was off (validate=False, --no-validate)"}}


def runner_check(package: Any, model: torch.nn.Module, prompt: dict[str, Any], generation_config: Any, *,
                 min_agreement: float | None = None, processor: Any = None) -> Callable[[Path], dict[str, Any]]:
    """The check `bundle.save_folder` runs on the staged folder (see the module docstring).

    Args:
        package: the `folder.package.RuntimePackage` that wrote the folder (`RuntimePackage.run`).
        model: the fp32 eager model; `prompt` its sample inputs (the first sequence is run).
        generation_config: the export's merged generation config (its end tokens, a static cache).
        min_agreement: `None` for an fp32 export (tokens equal to eager's); for a quantized one,
            the share of steps the runner's tokens must agree with hfexport's runner on.
        processor: the model's processor (a speech model's holds the feature extractor the
            sample clip's features are made by); None where it came without one.

    Returns:
        `check(folder)`, returning the report's `{"runner": ...}` entry (nothing for a format
        without an LLM runner).
    """

    def check(folder: Path) -> dict[str, Any]:
        extractor = getattr(processor, "feature_extractor", None)
        if "input_ids" in prompt and package.task == SPEECH and extractor is not None:  # an audio-text LLM
            try:
                request = _audio_llm_request(folder, processor, generation_config)
            except PrepareError as error:  # a processor that cannot write the clip's prompt
                return {"runner": {"checked": False, "why": f"no sample clip prompt: {error}"}}
        elif "input_ids" in prompt:
            request = _request(folder, model, prompt, generation_config, with_image=package.task == IMAGE_TEXT)
        elif package.task == SPEECH and extractor is not None:
            request = _audio_request(model, extractor, generation_config)
        else:  # a speech model's sample is its audio features
            entry = runtime_package(read_manifest(folder, verify=False)) or {}  # the folder this export just wrote
            why = entry.get("why") or ("the runtimes' LLM runners take a text prompt, and this model's sample inputs "
                                       f"hold none: {', '.join(sorted(prompt))}")
            return {"runner": {"checked": False, "why": why}}
        drop_clean_pages(spans=weight_storages(model))  # the runner's weights and eager's resident one at a time
        start = time.perf_counter()
        try:
            got = package.run(folder, request)
        except RunnerUnavailable as unavailable:
            if unavailable.missing:
                logger.warning("the export was not run in its runtime's LLM runner: %s", unavailable.why)
            return {"runner": {"checked": False, "why": unavailable.why}}
        except Exception as error:  # noqa: BLE001 - any failure of the runner on the folder refuses it, chained
            raise _refused(f"its runtime's LLM runner failed on it: {type(error).__name__}: {error}", model) from error
        if got is None:
            return {}
        seconds = time.perf_counter() - start
        entry = _compared(got, request, folder, model, generation_config, min_agreement, extractor)
        # the runner's own run, then what it was held to (eager's forward or generate(), or our runner)
        entry["seconds"] = round(seconds, 3)
        entry["compare_seconds"] = round(time.perf_counter() - start - seconds, 3)
        if not entry["passed"]:
            prompt_ids = list(got.prompt_ids or request.prompt_ids)
            given = "the sample clip" if request.audio is not None else f"prompt {prompt_ids}" + (
                f" with its {', '.join(request.inputs)}" if request.inputs else "")
            error = _refused(f"{got.runner} generated {list(got.tokens)} where {entry['against']} generated "
                             f"{entry['expected']} ({given})", model)
            error.runner = entry
            raise error
        return {"runner": entry}

    return check


def _request(folder: Path, model: torch.nn.Module, prompt: dict[str, Any], generation_config: Any, *,
             with_image: bool = False) -> RunnerRequest:
    """The sample prompt's first sequence (its padding left out), as many new tokens as the
    folder's cache holds up to `RUNNER_TOKENS`, the model's end tokens; `with_image`: its image
    inputs too (the first image's, batch-first as LLaVA's `pixel_values`)."""
    ids = prompt["input_ids"][0]
    mask = prompt.get("attention_mask")
    if mask is not None:
        ids = ids[mask[0].bool()]
    inputs = {name: value[:1] for name, value in prompt.items()
              if name not in ("input_ids", "attention_mask") and isinstance(value, torch.Tensor)}
    return RunnerRequest(tuple(int(i) for i in ids), _new_tokens(folder, len(ids)), _eos(generation_config),
                         inputs=inputs if with_image and inputs else None)


def _audio_llm_request(folder: Path, processor: Any, generation_config: Any) -> RunnerRequest:
    """The sample clip made to fill the feature extractor's chunk (`audio_input.sample_clip`), in
    the processor's prompt (`audio_input.audio_prompt_inputs`: the default request, the chat
    template): its ids, and its features and per-frame mask as `inputs`."""
    from ..generation.audio_input import audio_prompt_inputs, sample_clip

    inputs = audio_prompt_inputs(processor, sample_clip(processor.feature_extractor, share=1.0), None)
    ids = inputs.pop("input_ids")[0]
    return RunnerRequest(tuple(int(i) for i in ids), _new_tokens(folder, len(ids)), _eos(generation_config),
                         inputs={name: value[:1] for name, value in inputs.items()})


def _new_tokens(folder: Path, prompt_length: int) -> int:
    """`RUNNER_TOKENS`, or fewer where the folder's cache (a static cache, a runner program's)
    holds fewer after the prompt."""
    manifest = read_manifest(folder, verify=False)  # the folder this export just wrote
    bound = manifest.get("max_cache_len") or ((runtime_package(manifest) or {}).get("settings") or {}).get(
        "max_cache_len")
    return max(1, min(RUNNER_TOKENS, int(bound) - prompt_length)) if bound else RUNNER_TOKENS


def _eos(generation_config: Any) -> tuple[int, ...]:
    eos = getattr(generation_config, "eos_token_id", None)
    eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    return tuple(int(e) for e in eos)


def _audio_request(model: torch.nn.Module, extractor: Any, generation_config: Any) -> RunnerRequest:
    """The sample clip (`audio_input.sample_clip`), as many new tokens as the decoder has positions
    for after its prompt up to `RUNNER_TOKENS`, the model's end tokens."""
    from ..generation.audio_input import sample_clip
    from ..generation.decoder_prompt import decoder_prompt

    prompt = decoder_prompt(generation_config, model.config)
    positions = getattr(model.config, "max_target_positions", None) or len(prompt) + RUNNER_TOKENS
    return RunnerRequest((), max(1, min(RUNNER_TOKENS, int(positions) - len(prompt))), _eos(generation_config),
                         audio=sample_clip(extractor))


def _eager_speech(model: torch.nn.Module, extractor: Any, request: RunnerRequest, generation_config: Any,
                  features: Any = None) -> list[int]:
    """Eager `generate()`'s new tokens on `features` (those the runner computed from the request's
    clip), else the feature extractor's features of the clip."""
    if features is None:
        features = extractor(request.audio, sampling_rate=extractor.sampling_rate,
                             return_tensors="pt")["input_features"]
    features = torch.as_tensor(features, dtype=model.dtype)
    with torch.no_grad():
        out = model.generate(input_features=features, max_new_tokens=request.max_new_tokens, do_sample=False,
                             generation_config=generation_config, return_dict_in_generate=True, output_logits=True)
    return out.sequences[0, out.sequences.shape[1] - len(out.logits):].tolist()


def _compared(got: RunnerTokens, request: RunnerRequest, folder: Path, model: torch.nn.Module,
              generation_config: Any, min_agreement: float | None, extractor: Any = None) -> dict[str, Any]:
    """The report's entry: the runner's tokens against eager's (fp32) or hfexport's runner's, on
    the prompt the runner was given (`RunnerTokens.prompt_ids`)."""
    ids = torch.tensor([got.prompt_ids or request.prompt_ids])
    if request.audio is not None and min_agreement is None:
        against = "eager generate()"
        expected = _eager_speech(model, extractor, request, generation_config, got.features)
    elif request.audio is not None:
        from ..generation.loop import GenerationRunner

        against = "hfexport's runner on the same folder"
        runner = GenerationRunner.load(folder, verify=False, engine="hfexport")  # verify=False: the folder it hashed
        if got.features is None:
            result = runner.generate_from_audio(request.audio, max_new_tokens=request.max_new_tokens)
        else:  # the features the runner made, as eager is given them
            result = runner.generate([], input_features=torch.as_tensor(got.features),
                                     max_new_tokens=request.max_new_tokens)
        expected = list(result.tokens)
    elif min_agreement is None:
        against = "eager generate()"
        expected = list(got.tokens) if _eager_picks_each(got.tokens, ids, request, model, generation_config) else None
        if expected is None:
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=request.max_new_tokens,
                                     do_sample=False, generation_config=generation_config, **(request.inputs or {}))
            expected = out[0, ids.shape[1]:].tolist()
    else:
        from ..generation.loop import GenerationRunner

        against = "hfexport's runner on the same folder"
        expected = list(GenerationRunner.load(folder, verify=False, engine="hfexport").generate(
            ids, max_new_tokens=request.max_new_tokens, **(request.inputs or {})).tokens)  # verify=False: hashed now
    tokens = list(got.tokens)
    agreement = sum(a == b for a, b in zip(tokens, expected)) / max(len(tokens), len(expected), 1)
    equal = tokens == expected
    passed = equal if min_agreement is None else agreement >= min_agreement
    entry = {"checked": True, "runner": got.runner, "tokens_equal": equal, "tokens": len(tokens), "against": against,
             "passed": passed, "expected": expected}
    if min_agreement is not None:
        entry.update(agreement=round(agreement, 4), min_agreement=min_agreement)
    if got.prompt_ids is not None:  # both ran on the prompt the runner serves as generate() does
        entry["prompt_ids"] = list(got.prompt_ids)
    if got.features is not None and extractor is not None:  # eager ran on them: how far they are from the extractor's
        entry["features_max_abs_diff"] = _features_difference(got.features, extractor, request)
    if passed:
        entry.pop("expected")
    return entry


#: generation config fields that may differ from their defaults without moving `generate(do_sample=False)`'s
#: pick off the logits' argmax (transformers 5.24): the cache, the outputs asked for, the special
#: tokens (the end tokens are the request's), the length (the request's budget), and the sampling
#: knobs greedy ignores. Any other field set (a repetition penalty, a minimum length, suppressed
#: tokens, beam or assisted search, ...) sends the check to `generate()` itself.
_GREEDY_NEUTRAL = frozenset({
    "use_cache", "cache_implementation", "cache_config", "max_cache_len", "output_attentions",
    "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate", "pad_token_id",
    "bos_token_id", "eos_token_id", "decoder_start_token_id", "max_length", "max_new_tokens", "do_sample",
    "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "renormalize_logits",
    "compile_config", "disable_compile", "_from_model_config", "transformers_version",
})


def _eager_picks_each(tokens: tuple[int, ...], ids: torch.Tensor, request: RunnerRequest, model: torch.nn.Module,
                      generation_config: Any) -> bool:
    """Whether the runner's `tokens` are eager greedy `generate()`'s, found in one forward over the
    prompt and the tokens: each token the logits' argmax after the prompt and the tokens before it
    is, step by step, the token greedy decoding picks, and the run ends where `generate()` ends (the
    token budget, or an end token). One forward reads the weights once, where `generate()` reads
    them once a token (1.2 of the 1.25 GB Llama's 4 s runner check, `bench/RESULTS.md`).

    False (the caller then runs `generate()`, whose tokens the report shows) where any token is
    not the pick, where the generation config sets a field outside `_GREEDY_NEUTRAL` (one that may
    move greedy's pick off the argmax), where the request carries inputs beside the ids, for an
    encoder-decoder, or where the forward fails. A near-tie between two eager computations (this
    forward and `generate()`'s cached steps round apart) that this forward settles the runner's
    way passes: both are eager's pick.
    """
    settings = generation_config.to_diff_dict() if hasattr(generation_config, "to_diff_dict") else {}
    if not tokens or request.inputs or getattr(model.config, "is_encoder_decoder", False) or (
            set(settings) - _GREEDY_NEUTRAL):
        return False
    ends = set(request.eos_token_ids)
    if any(token in ends for token in tokens[:-1]) or len(tokens) > request.max_new_tokens:
        return False
    if len(tokens) < request.max_new_tokens and tokens[-1] not in ends:
        return False  # the runner stopped where generate() would go on
    sequence = torch.cat([ids, torch.tensor([tokens[:-1]], dtype=ids.dtype)], dim=1)
    try:
        with torch.no_grad():
            logits = model(input_ids=sequence, attention_mask=torch.ones_like(sequence)).logits
    except Exception:  # noqa: BLE001 - a model whose forward wants more than ids: generate() decides
        logger.debug("the runner check's one-forward path failed; eager generate() decides", exc_info=True)
        return False
    picks = logits[0, ids.shape[1] - 1:].argmax(-1).tolist()
    return picks == list(tokens)


def _features_difference(features: Any, extractor: Any, request: RunnerRequest) -> float | None:
    """The largest difference between a runner's features of the request's clip and the feature
    extractor's (None where their shapes differ)."""
    import numpy as np

    own = extractor(request.audio, sampling_rate=extractor.sampling_rate, return_tensors="np")["input_features"]
    features = np.asarray(features, dtype=np.float32)
    return round(float(np.abs(features - own).max()), 6) if features.shape == own.shape else None


def _refused(what: str, model: torch.nn.Module) -> ValidationError:
    return ValidationError(
        f"the export folder does not run as it should in its runtime's LLM runner: {what}; nothing was written",
        model=type(model).__name__,
        remedy="run the folder with hfexport generate to compare, and report this; or validate=False "
        "(--no-validate) to write it anyway")
