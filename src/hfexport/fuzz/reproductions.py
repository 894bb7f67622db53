"""Ready-to-paste reproductions of a failure: a Python script per failing stage (`reproduction`)
and the shell line that replays an example (`replay_command`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .checks import STEP_ATOL, STEP_RTOL, VALIDATE_STEPS
from .example import ARCHS, Example, build_example, sample_inputs


def _literal(tensor: torch.Tensor) -> str:
    return f"torch.tensor({tensor.tolist()})"


def _inputs_literal(inputs: dict[str, torch.Tensor]) -> str:
    return "{" + ", ".join(f"{name!r}: {_literal(value)}" for name, value in inputs.items()) + "}"


def _prelude(example: Example, model: torch.nn.Module) -> list[str]:
    overrides = "".join(f", {key}={value!r}" for key, value in example.overrides.items())
    inputs = sample_inputs(example, model)
    return [
        "import torch",
        "",
        "import hfexport",
        "from hfexport import AutoExportConfig, AutoHfExporter",
        "from hfexport.presets import build_preset",
        "",
        f"model, _ = build_preset({example.arch!r}, seed={example.seed}{overrides})",
        f"inputs = {_inputs_literal(inputs)}",
        f'config = AutoExportConfig.from_dict({{"export_format": "{example.backend}", "dynamic": True}})',
        "exporter = AutoHfExporter.from_config(config)",
    ]


def _snip_export(example: Example, model: torch.nn.Module) -> list[str]:
    return ["artifact = exporter.export(model, inputs, config=config)"]


def _snip_validate(example: Example, model: torch.nn.Module) -> list[str]:
    return [f"report = hfexport.validate(artifact, model, inputs, steps={VALIDATE_STEPS!r})",
            "print(report.to_table())", "assert report.passed"]


def _snip_other_shape(example: Example, model: torch.nn.Module) -> list[str]:
    from ..validation.compare import DEFAULT_TOLERANCE

    atol, rtol = DEFAULT_TOLERANCE.get(example.backend, (1e-4, 1e-4))
    keep = "" if ARCHS[example.arch].seq2seq else '[other["attention_mask"].bool()]'
    return [
        "from hfexport.runner import runner_for",
        "",
        f"other = {_inputs_literal(sample_inputs(example, model, other=True))}",
        "record = hfexport.record_of(artifact)",
        'got = torch.as_tensor(runner_for(artifact, record).run(record.artifact_inputs(other))'
        '[record.output_names.index("logits")])',
        "with torch.no_grad():",
        "    want = model(**other).logits",
        f"torch.testing.assert_close(got{keep}, want{keep}, atol={atol}, rtol={rtol})  # padding left out",
    ]


def _snip_decompose(example: Example, model: torch.nn.Module) -> list[str]:
    config = (f"GenerationConfig(cache_implementation='static', max_cache_len={example.max_cache_len})"
              if example.cache == "static" else "None  # the model's own: a dynamic cache")
    lines = ["from transformers import GenerationConfig", "from hfexport.utils import decompose_for_generation", "",
             f"generation_config = {config}"]
    if ARCHS[example.arch].seq2seq:
        lines.append('inputs = {k: v for k, v in inputs.items() if not k.startswith("decoder_")}')
    return lines + ["components = decompose_for_generation(model, inputs, generation_config=generation_config, "
                    f"multi_token_decode={example.multi_token_decode})"]


def _snip_export_components(example: Example, model: torch.nn.Module) -> list[str]:
    return ["artifacts = exporter.export_components(components, config)"]


def _snip_validate_components(example: Example, model: torch.nn.Module) -> list[str]:
    return ["reports = hfexport.validate_components(artifacts, components)",
            "for report in reports.values():", "    print(report.to_table())",
            "assert all(report.passed for report in reports.values())"]


def _snip_save(example: Example, model: torch.nn.Module) -> list[str]:
    return ["import tempfile", "", 'directory = tempfile.mkdtemp() + "/export"',
            'contents = hfexport.FolderContents("generation", model=model, generation_config=generation_config, '
            "export_config=config)",
            "hfexport.save_folder(exporter, artifacts, directory, contents)"]


def _snip_eager_generate(example: Example, model: torch.nn.Module) -> list[str]:
    start = "1" if ARCHS[example.arch].seq2seq else "prompt.shape[1]"
    return [
        'prompt, mask = inputs["input_ids"][:1], inputs["attention_mask"][:1]  # the runner drives one sequence',
        "with torch.no_grad():",
        f"    out = model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens={example.new_tokens}, "
        f"min_new_tokens={example.new_tokens}, do_sample=False, generation_config=generation_config, "
        "output_logits=True, return_dict_in_generate=True)",
        f"want_tokens = out.sequences[0, {start}:].tolist()",
    ]


def _snip_runner(example: Example, model: torch.nn.Module) -> list[str]:
    mask = ", attention_mask=mask" if ARCHS[example.arch].seq2seq else ""
    return [
        f"result = hfexport.GenerationRunner.load(directory).generate(prompt, max_new_tokens={example.new_tokens}, "
        f"min_new_tokens={example.new_tokens}, output_logits=True{mask})",
        'print("runner:", result.tokens, "generate():", want_tokens)',
        "for step, (got, want) in enumerate(zip(result.logits, out.logits)):",
        f"    torch.testing.assert_close(got, want, atol={STEP_ATOL}, rtol={STEP_RTOL}, msg=f'step {{step}}')",
        "assert result.tokens == want_tokens",
    ]


def _snip_decode_loop(example: Example, model: torch.nn.Module) -> list[str]:
    return [
        "from hfexport.fuzz import drive_decode_loop  # the docs' loop: prompt in one call, then one token per call",
        "",
        'decode = hfexport.GenerationExport.load(directory).components["decode"]',
        "print([i for i in decode.record.input_names if not i.startswith('cache.')])  # the docs' loop feeds "
        "input_ids, attention_mask, position_ids",
        "logits = drive_decode_loop(decode.runner(), prompt[0].tolist(), want_tokens, "
        f"max_cache_len={example.max_cache_len})",
        "for step, (got, want) in enumerate(zip(logits, out.logits)):",
        f"    torch.testing.assert_close(got, want[0], atol={STEP_ATOL}, rtol={STEP_RTOL}, msg=f'step {{step}}')",
    ]


_SNIPPETS: dict[str, list[Callable[[Example, torch.nn.Module], list[str]]]] = {
    "export": [_snip_export],
    "validate": [_snip_export, _snip_validate],
    "other-shape": [_snip_export, _snip_other_shape],
    "decompose": [_snip_decompose],
    "export-components": [_snip_decompose, _snip_export_components],
    "validate-components": [_snip_decompose, _snip_export_components, _snip_validate_components],
    "save": [_snip_decompose, _snip_export_components, _snip_save],
    "runner": [_snip_decompose, _snip_export_components, _snip_save, _snip_eager_generate, _snip_runner],
    "decode-loop": [_snip_decompose, _snip_export_components, _snip_save, _snip_eager_generate, _snip_decode_loop],
}


def reproduction(example: Example, stage: str) -> str:
    """A ready-to-paste Python script that builds `example`'s model and inputs and replays its
    calls up to `stage`, the failing one (its last line fails as the fuzzer saw)."""
    if stage not in _SNIPPETS:
        raise ValueError(f"unknown stage {stage!r}; one of {', '.join(_SNIPPETS)}")
    model, _ = build_example(example)
    lines = _prelude(example, model)
    for snippet in _SNIPPETS[stage]:
        lines += ["", *snippet(example, model)]
    return "\n".join(lines) + "\n"


def replay_command(example: Example) -> str:
    """The shell line that runs `example` alone again."""
    return f"python -m hfexport.fuzz --replay '{example.to_json()}'"
