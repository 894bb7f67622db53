"""One coverage case, run as `python -m hfexport.coverage.case ARCH BACKEND MODE`.

Prints `STAGE <name>` lines as it goes (the parent reports where a crash happened) and one final
`RESULT <json>` line. Never raises: every failure becomes a status with the error's first line.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
from typing import Any

import torch

NEW_TOKENS = 4


def _stage(name: str) -> None:
    print(f"STAGE {name}", flush=True)


def _first_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)[:300]


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


def run_export(arch: str, backend: str) -> dict[str, Any]:
    from hfexport import AutoExportConfig, AutoHfExporter, validate
    from hfexport.presets import build_preset

    model, inputs = build_preset(arch)
    config = AutoExportConfig.from_dict({"export_format": backend, "dynamic": True})
    _stage("export")
    try:
        artifact = AutoHfExporter.from_config(config).export(model, inputs, config=config)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        return {"status": "export failure", "detail": _first_line(error)}
    _stage("run")
    report = validate(artifact, model, inputs)
    status, detail = _judge(report)
    return {"status": status, "detail": detail, **_main_output(report)}


def run_generate(arch: str, backend: str) -> dict[str, Any]:
    from hfexport import (AutoExportConfig, AutoHfExporter, GenerationRunner, save_generation_export,
                          validate_components)
    from hfexport.presets import PRESETS, build_preset
    from hfexport.utils import decompose_for_generation

    model, inputs = build_preset(arch)
    prompt = {k: v for k, v in inputs.items() if not k.startswith("decoder_")}
    config = AutoExportConfig.from_dict({"export_format": backend, "dynamic": True})
    exporter = AutoHfExporter.from_config(config)
    _stage("export")
    try:  # export_for_generation, keeping the components to validate against
        components = decompose_for_generation(model, prompt)
        artifacts = exporter.export_components(components, config)
    except Exception as error:  # noqa: BLE001
        return {"status": "export failure", "detail": _first_line(error)}
    _stage("run")
    result: dict[str, Any] = {"components": list(artifacts)}
    for name, report in validate_components(artifacts, components).items():
        status, detail = _judge(report)
        if status != "ok":
            return {**result, "status": status, "detail": f"{name}: {detail}"}
    if PRESETS[arch].kind == "multimodal":
        return {**result, "status": "ok", "tokens": "not run (the runner drives text models)"}
    _stage("tokens")
    with tempfile.TemporaryDirectory() as tmp:
        save_generation_export(exporter, artifacts, f"{tmp}/export", model=model, export_config=config)
        runner = GenerationRunner.load(f"{tmp}/export")
        encoder_inputs = {k: v for k, v in prompt.items() if k not in ("input_ids", "attention_mask")}
        ids = prompt.get("input_ids", torch.tensor([[0]]))
        try:
            got = runner.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  attention_mask=prompt.get("attention_mask"), **encoder_inputs).tokens
        except Exception as error:  # noqa: BLE001
            return {**result, "status": "runtime failure", "detail": f"runner: {_first_line(error)}"}
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    # the new tokens are the last ones, one per step (Whisper's sequences leave its start token out)
    want = out.sequences[0, -len(out.logits):].tolist()
    if got != want:
        return {**result, "status": "mismatch", "detail": f"greedy tokens {got} != generate() {want}"}
    return {**result, "status": "ok", "tokens": "match"}


def main(argv: list[str]) -> int:
    arch, backend, mode = argv
    torch.manual_seed(0)
    start = time.perf_counter()
    try:
        result = (run_export if mode == "export" else run_generate)(arch, backend)
    except Exception as error:  # noqa: BLE001 - a case never raises; the traceback goes to stderr
        traceback.print_exc()
        result = {"status": "runtime failure", "detail": _first_line(error)}
    result["seconds"] = round(time.perf_counter() - start, 1)
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
