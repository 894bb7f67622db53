"""The export job's check that a packaged generation folder runs in its runtime's own LLM runner
(onnxruntime-genai, OpenVINO GenAI's `LLMPipeline`, ExecuTorch's `TextLLMRunner`) and gives the
tokens it should, before the folder is moved into place.

```
runner_check(package, model, prompt, generation_config, min_agreement=None)(folder) -> {"runner": ...}
  request   the sample prompt's first sequence, RUNNER_TOKENS greedy tokens (fewer where the cache
            holds fewer), stopping at the model's end tokens
  run       package.run(folder, request): the format's RuntimePackage runs its runtime's runner
  compare   fp32: the runner's tokens equal eager generate()'s exactly; quantized: they agree with
            hfexport's own runner on the same folder on at least `min_agreement` of the steps
```
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

from ..errors import ValidationError
from ..folder.manifest import read_manifest
from ..folder.package import RunnerRequest, RunnerTokens, RunnerUnavailable

__all__ = ["runner_check", "skipped_entry", "RUNNER_TOKENS"]

logger = logging.getLogger("hfexport")

#: Greedy tokens the runner generates (fewer where the cache holds fewer after the prompt).
RUNNER_TOKENS = 16


def skipped_entry() -> dict[str, Any]:
    """The report's `runner` entry of an export written without validation."""
    return {"runner": {"checked": False, "why": "skipped: validation was off (validate=False, --no-validate)"}}


def runner_check(package: Any, model: torch.nn.Module, prompt: dict[str, Any], generation_config: Any, *,
                 min_agreement: float | None = None, package_asked: bool = False) -> Callable[[Path], dict[str, Any]]:
    """The check `bundle.save_folder` runs on the staged folder (see the module docstring).

    Args:
        package: the `folder.package.RuntimePackage` that wrote the folder (`RuntimePackage.run`).
        model: the fp32 eager model; `prompt` its sample inputs (the first sequence is run).
        generation_config: the export's merged generation config (its end tokens, a static cache).
        min_agreement: `None` for an fp32 export (tokens equal to eager's); for a quantized one,
            the share of steps the runner's tokens must agree with hfexport's runner on.
        package_asked: the task asked for the runtime's LLM package (`text-generation-with-past`,
            what `--task auto` gives a causal LM): a folder that is not the runner's package (its
            components, and why) refuses the export instead of being written as a lesser thing.

    Returns:
        `check(folder)`, returning the report's `{"runner": ...}` entry (nothing for a format
        without an LLM runner).
    """

    def check(folder: Path) -> dict[str, Any]:
        if "input_ids" not in prompt:  # a speech model's sample is its audio features
            why = ("the runtimes' LLM runners take a text prompt, and this model's sample inputs hold none: "
                   f"{', '.join(sorted(prompt))}")
            return {"runner": {"checked": False, "why": why}}
        request = _request(folder, model, prompt, generation_config)
        start = time.perf_counter()
        try:
            got = package.run(folder, request)
        except RunnerUnavailable as unavailable:
            if package_asked and not unavailable.missing:
                raise ValidationError(
                    "the task (text-generation-with-past) asks for the runtime's LLM package, and "
                    f"{unavailable.why}; nothing was written", model=type(model).__name__,
                    remedy="`--task generation-components` writes the generation components `hfexport generate` runs; "
                    "or another --format makes its runtime's package") from unavailable
            if unavailable.missing:
                logger.warning("the export was not run in its runtime's LLM runner: %s", unavailable.why)
            return {"runner": {"checked": False, "why": unavailable.why}}
        except Exception as error:  # noqa: BLE001 - any failure of the runner on the folder refuses it, chained
            raise _refused(f"its runtime's LLM runner failed on it: {type(error).__name__}: {error}", model) from error
        if got is None:
            return {}
        seconds = time.perf_counter() - start
        entry = _compared(got, request, folder, model, generation_config, min_agreement)
        entry["seconds"] = round(seconds, 3)
        if not entry["passed"]:
            error = _refused(f"{got.runner} generated {list(got.tokens)} where {entry['against']} generated "
                             f"{entry['expected']} (prompt {list(request.prompt_ids)})", model)
            error.runner = entry
            raise error
        return {"runner": entry}

    return check


def _request(folder: Path, model: torch.nn.Module, prompt: dict[str, Any], generation_config: Any) -> RunnerRequest:
    """The sample prompt's first sequence (its padding left out), as many new tokens as the
    folder's cache holds up to `RUNNER_TOKENS`, the model's end tokens."""
    ids = prompt["input_ids"][0]
    mask = prompt.get("attention_mask")
    if mask is not None:
        ids = ids[mask[0].bool()]
    new_tokens = RUNNER_TOKENS
    bound = read_manifest(folder, verify=False).get("max_cache_len")  # the folder this export just wrote
    if bound:
        new_tokens = max(1, min(new_tokens, int(bound) - len(ids)))
    eos = getattr(generation_config, "eos_token_id", None)
    eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    return RunnerRequest(tuple(int(i) for i in ids), new_tokens, tuple(int(e) for e in eos))


def _compared(got: RunnerTokens, request: RunnerRequest, folder: Path, model: torch.nn.Module,
              generation_config: Any, min_agreement: float | None) -> dict[str, Any]:
    """The report's entry: the runner's tokens against eager's (fp32) or hfexport's runner's."""
    ids = torch.tensor([request.prompt_ids])
    if min_agreement is None:
        against = "eager generate()"
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=request.max_new_tokens,
                                 do_sample=False, generation_config=generation_config)
        expected = out[0, ids.shape[1]:].tolist()
    else:
        from ..generation.loop import GenerationRunner

        against = "hfexport's runner on the same folder"
        expected = list(GenerationRunner.load(folder, verify=False, engine="hfexport").generate(
            ids, max_new_tokens=request.max_new_tokens).tokens)  # verify=False: the folder it hashed a moment ago
    tokens = list(got.tokens)
    agreement = sum(a == b for a, b in zip(tokens, expected)) / max(len(tokens), len(expected), 1)
    equal = tokens == expected
    passed = equal if min_agreement is None else agreement >= min_agreement
    entry = {"checked": True, "runner": got.runner, "tokens_equal": equal, "tokens": len(tokens), "against": against,
             "passed": passed, "expected": expected}
    if min_agreement is not None:
        entry.update(agreement=round(agreement, 4), min_agreement=min_agreement)
    if passed:
        entry.pop("expected")
    return entry


def _refused(what: str, model: torch.nn.Module) -> ValidationError:
    return ValidationError(
        f"the export folder does not run as it should in its runtime's LLM runner: {what}; nothing was written",
        model=type(model).__name__,
        remedy="run the folder with hfexport generate to compare, and report this; or validate=False "
        "(--no-validate) to write it anyway")
