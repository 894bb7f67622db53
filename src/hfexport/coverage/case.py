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

import torch

from hfexport.errors import first_line

NEW_TOKENS = 4


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


def run_generate(arch: str, backend: str, image: bool = False) -> dict[str, Any]:
    """The generation components, each against its eager submodule, then greedy tokens from the
    saved export through `GenerationRunner` against `model.generate`: an image-text model's
    tokens only with `image` (the `generate-image` mode), from its prompt's image."""
    from hfexport import GenerationRunner
    from hfexport.presets import PRESETS

    with tempfile.TemporaryDirectory() as tmp:
        result, failed = _job(arch, backend, f"{tmp}/export", generate=True)
        if failed is not None:
            return failed
        summary: dict[str, Any] = {"components": list(result.artifacts)}
        # an image-text model's tokens are the generate-image mode's; an audio-text model's, from its clip, here
        if PRESETS[arch].kind == "multimodal" and "audio_config" not in PRESETS[arch].config and not image:
            return {**summary, "status": "ok", "tokens": "in the generate-image mode"}
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
    with torch.no_grad():
        out = result.model.generate(**prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                    output_logits=True, return_dict_in_generate=True)
    # the new tokens are the last ones, one per step (Whisper's sequences leave its start token out)
    want = out.sequences[0, -len(out.logits):].tolist()
    if got != want:
        return {**summary, "status": "mismatch", "detail": f"greedy tokens {got} != generate() {want}"}
    return {**summary, "status": "ok", "tokens": "match"}


def main(argv: list[str]) -> int:
    """Run one case (`ARCH BACKEND MODE`), print its `RESULT` line; always 0."""
    arch, backend, mode = argv
    torch.manual_seed(0)
    start = time.perf_counter()
    try:
        result = run_export(arch, backend) if mode == "export" else run_generate(arch, backend, mode == "generate-image")
    except Exception as error:  # noqa: BLE001 - a case never raises; the traceback goes to stderr
        traceback.print_exc()
        result = {"status": "runtime failure", "detail": first_line(error)}
    result["seconds"] = round(time.perf_counter() - start, 1)
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
