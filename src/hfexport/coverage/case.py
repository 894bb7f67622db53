"""One coverage case, run as `python -m hfexport.coverage.case ARCH BACKEND MODE`.

Prints `STAGE <name>` lines as it goes (the parent reports where a crash happened) and one final
`RESULT <json>` line. Never raises: every failure becomes a status with the error's first line.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
import traceback
from typing import Any

import numpy as np
import torch

from hfexport.errors import first_line

NEW_TOKENS = 4
#: Greedy tokens per clip in the `generate-audio` mode: enough that each preset's tokens differ
#: between its two clips (`audio_clips`); Whisper's, a tone's and a chirp's, first differ at the sixth
AUDIO_TOKENS = 12


def _stage(name: str) -> None:
    print(f"STAGE {name}", flush=True)


def _judge(report: Any) -> tuple[str, str | None]:
    """A validation report -> (status, detail)."""
    for case in report.cases:
        if case.error:
            return "runtime failure", f"{case.label}: {case.error.splitlines()[0][:300]}"
        for output in case.outputs:
            if output.error:
                return "runtime failure", f"{case.label} {output.name}: {output.error[:300]}"
            if not output.passed:
                return "mismatch", f"{case.label} {output.name}: max abs {output.max_abs:.3g}"
    return "ok", None


def _main_output(report: Any) -> dict[str, Any]:
    sample = report.cases[0]
    resized = next((c for c in report.cases if c.label == "resized"), None)
    main = sample.outputs[0] if sample.outputs else None
    return {"output": main.name if main else None, "max_abs": main.max_abs if main else None,
            "dynamic_checked": resized is not None}


class _Stages:
    """The job's progress as `STAGE` lines (the parent reports where a crash happened)."""

    total = None

    @contextlib.contextmanager
    def step(self, label: str):
        _stage(label)
        yield


def _job(arch: str, backend: str, out: str, *, generate: bool = False) -> tuple[Any, dict[str, Any] | None]:
    """`(job result, None)`, or `(reports or None, result)` when the export or its validation failed."""
    from hfexport import AutoExportConfig, ValidationError
    from hfexport.job import GenerationOptions, JobOptions, export_to_folder

    config = AutoExportConfig.from_dict({"export_format": backend, "dynamic": True})
    options = JobOptions(generation=GenerationOptions(generate=generate), progress=_Stages())
    try:
        return export_to_folder(f"tiny:{arch}", config, out, options), None
    except ValidationError as error:
        for name, report in getattr(error, "reports", {}).items():
            status, detail = _judge(report)
            if status != "ok":
                prefix = f"{name}: " if generate else ""
                return None, {"status": status, "detail": f"{prefix}{detail}",
                              **({} if generate else _main_output(report))}
        return None, {"status": "runtime failure", "detail": first_line(error)}
    except Exception as error:  # noqa: BLE001 - reported, not raised
        return None, {"status": "export failure", "detail": first_line(error)}


def run_export(arch: str, backend: str) -> dict[str, Any]:
    """The whole model as one graph, `dynamic=True`, checked at the sample and other shapes."""
    with tempfile.TemporaryDirectory() as tmp:
        result, failed = _job(arch, backend, f"{tmp}/export")
    if failed is not None:
        return failed
    return {"status": "ok", "detail": None, **_main_output(result.reports["model"])}


def run_generate(arch: str, backend: str, mode: str = "generate") -> dict[str, Any]:
    """The generation components, each against its eager submodule, then greedy tokens from the
    saved export through `GenerationRunner` against `model.generate`: an image-text model's tokens
    only in the `generate-image` mode, from its prompt's image; a model's tokens from audio clips
    only in the `generate-audio` mode (`audio_tokens`), an audio-text model's only there."""
    from hfexport import GenerationRunner
    from hfexport.coverage.matrix import reads_audio
    from hfexport.presets import PRESETS

    with tempfile.TemporaryDirectory() as tmp:
        result, failed = _job(arch, backend, f"{tmp}/export", generate=True)
        if failed is not None:
            return failed
        summary: dict[str, Any] = {"components": list(result.artifacts)}
        if mode == "generate-audio":
            return {**summary, **audio_tokens(arch, result)}
        if PRESETS[arch].kind == "multimodal" and mode != "generate-image":
            tokens_mode = "generate-audio" if reads_audio(arch) else "generate-image"
            return {**summary, "status": "ok", "tokens": f"in the {tokens_mode} mode"}
        _stage("tokens")
        prompt = {k: v for k, v in result.inputs.items() if not k.startswith("decoder_")}
        runner = GenerationRunner.load(result.directory, engine="hfexport")  # the components, as exported
        encoder_inputs = {k: v for k, v in prompt.items() if k not in ("input_ids", "attention_mask")}
        ids = prompt.get("input_ids", torch.tensor([[0]]))
        try:
            got = runner.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  attention_mask=prompt.get("attention_mask"), **encoder_inputs).tokens
        except Exception as error:  # noqa: BLE001
            return {**summary, "status": "runtime failure", "detail": f"runner: {first_line(error)}"}
    want = _new_tokens(result.model, prompt, NEW_TOKENS)
    if got != want:
        return {**summary, "status": "mismatch", "detail": f"greedy tokens {got} != generate() {want}"}
    return {**summary, "status": "ok", "tokens": "match"}


def audio_clips(extractor: Any) -> dict[str, np.ndarray]:
    """The clips of the `generate-audio` mode, float32 mono at `extractor`'s sampling rate, as long as
    the export job's sample clip (`audio_input.sample_clip`): that clip (a tone with noise), and a
    chirp from 100 Hz to 4 kHz. Each preset's eager tokens differ between them (a test holds them
    to it), so a runner that lost the audio on the way could not match both."""
    from hfexport.generation.audio_input import sample_clip

    tone = sample_clip(extractor)
    rate, length = int(extractor.sampling_rate), tone.shape[0]
    hertz = np.linspace(100.0, 4000.0, length)
    chirp = 0.5 * np.sin(2 * np.pi * np.cumsum(hertz) / rate)
    return {"tone": tone, "chirp": chirp.astype(np.float32)}


def eager_audio_tokens(model: torch.nn.Module, processor: Any, clip: np.ndarray, new_tokens: int = AUDIO_TOKENS,
                       audio_text: bool = False) -> list[int]:
    """Eager `model.generate`'s greedy tokens for `clip` as the model's own `processor` prepares it:
    a speech encoder-decoder's `input_features` (its feature extractor), or with `audio_text` an
    audio-text LLM's prompt and features (the processor on the default prompt, formatted as
    `generate_from_audio` formats it)."""
    from hfexport.generation.audio_input import audio_prompt_text

    rate = int(processor.feature_extractor.sampling_rate)
    if audio_text:
        inputs = dict(processor(text=[audio_prompt_text(processor, None)], audio=[clip], sampling_rate=rate,
                                return_tensors="pt"))
    else:
        inputs = {"input_features": processor.feature_extractor(clip, sampling_rate=rate,
                                                                 return_tensors="pt")["input_features"]}
    return _new_tokens(model, inputs, new_tokens)


def audio_tokens(arch: str, result: Any) -> dict[str, Any]:
    """The `generate-audio` mode's comparison: for each of `audio_clips`, `generate_from_audio` on the
    saved export (its saved processor) against `eager_audio_tokens` (the processor the preset's
    model came with), `AUDIO_TOKENS` greedy tokens each."""
    from hfexport import GenerationRunner
    from hfexport.presets import PRESETS, tiny_processor

    runner = GenerationRunner.load(result.directory, engine="hfexport")
    processor = tiny_processor(arch)
    if processor is None or getattr(processor, "feature_extractor", None) is None:
        return {"status": "runtime failure", "detail": f"tiny:{arch} carries no feature extractor to read a clip with"}
    audio_text, clips = PRESETS[arch].kind == "multimodal", audio_clips(processor.feature_extractor)
    for name, clip in clips.items():
        _stage(f"tokens ({name})")
        try:
            got = runner.generate_from_audio(clip, max_new_tokens=AUDIO_TOKENS, min_new_tokens=AUDIO_TOKENS).tokens
        except Exception as error:  # noqa: BLE001
            return {"status": "runtime failure", "detail": f"runner, the {name}: {first_line(error)}"}
        want = eager_audio_tokens(result.model, processor, clip, audio_text=audio_text)
        if got != want:
            return {"status": "mismatch", "detail": f"the {name}: greedy tokens {got} != generate() {want}"}
    return {"status": "ok", "tokens": "match", "clips": list(clips)}


def _new_tokens(model: torch.nn.Module, inputs: dict[str, Any], new_tokens: int) -> list[int]:
    """Eager greedy `model.generate(**inputs)`'s `new_tokens` new tokens (none of them the end)."""
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    # the new tokens are the last ones, one per step (Whisper's sequences leave its start token out)
    return out.sequences[0, -len(out.logits):].tolist()


def main(argv: list[str]) -> int:
    """Run one case (`ARCH BACKEND MODE`), print its `RESULT` line; always 0."""
    arch, backend, mode = argv
    torch.manual_seed(0)
    start = time.perf_counter()
    try:
        result = run_export(arch, backend) if mode == "export" else run_generate(arch, backend, mode)
    except Exception as error:  # noqa: BLE001 - a case never raises; the traceback goes to stderr
        traceback.print_exc()
        result = {"status": "runtime failure", "detail": first_line(error)}
    result["seconds"] = round(time.perf_counter() - start, 1)
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
