"""The differential fuzzer (`hfexport.fuzz`): its strategy draws valid models, its reproductions
are runnable Python, its verdicts sort refusals from bugs, and a fixed seed finds no failure."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from hfexport import fuzz  # noqa: E402
from hfexport.fuzz import driver  # noqa: E402
from hfexport.fuzz.checks import _is_refusal  # noqa: E402
from hfexport.fuzz.example import _known_failure  # noqa: E402
from hfexport.errors import CaptureError, ConversionError, PrepareError, ValidationError  # noqa: E402

#: The CI run: a seed whose examples cover both parts, dynamic and static caches, both backends.
CI_SEED = 0
CI_EXAMPLES = 8

_STRATEGY_SETTINGS = settings(max_examples=200, deadline=None, database=None,
                              suppress_health_check=[HealthCheck.too_slow])


def _config(example: fuzz.Example):
    """The transformers config `build_preset` makes for `example` (no weights)."""
    import transformers

    from hfexport.presets import PRESETS

    preset = PRESETS[example.arch]
    return getattr(transformers, preset.config_class)(**{**preset.config, **example.overrides})


def _attention(example: fuzz.Example) -> tuple[int, int, int, int]:
    """(heads, key/value heads, head size, layers) of the example's config."""
    arch, config = fuzz.ARCHS[example.arch], _config(example)
    heads, layers = getattr(config, arch.heads), getattr(config, arch.layers)
    kv = getattr(config, arch.kv_heads) if arch.kv_heads else heads
    head_dim = getattr(config, arch.head_dim) if arch.head_dim else getattr(config, arch.hidden[0]) // heads
    if not arch.head_dim:
        assert all(getattr(config, key) == heads * head_dim for key in arch.hidden)
    return heads, kv, head_dim, layers


@_STRATEGY_SETTINGS
@given(fuzz.examples(backends=fuzz.BACKENDS, archs=(*fuzz.DEFAULT_ARCHS, "t5")))
def test_drawn_configs_are_valid_architectures(example):
    heads, kv, head_dim, layers = _attention(example)
    assert heads % kv == 0 and head_dim in (4, 8, 16, 64, 128) and 1 <= layers <= 3
    assert head_dim < 64 or heads <= 2  # real models' head sizes on few heads: the model stays small
    window = example.overrides.get("sliding_window")
    assert window is None or 2 <= window <= 8
    assert example.overrides.get("vocab_size", 128) >= 64


@_STRATEGY_SETTINGS
@given(fuzz.examples(backends=fuzz.BACKENDS, archs=(*fuzz.DEFAULT_ARCHS, "t5")))
def test_drawn_prompts_and_caches_fit(example):
    assert 1 <= example.batch <= 3 and 1 <= example.prompt_len <= 12 and 1 <= example.new_tokens <= 6
    assert example.padding < example.prompt_len and (example.batch > 1 or example.padding == 0)
    assert (example.other_batch, example.other_len) != (example.batch, example.prompt_len)
    if example.cache == "static":
        assert not fuzz.ARCHS[example.arch].seq2seq
        assert 16 <= example.max_cache_len <= 64
        assert example.max_cache_len > example.prompt_len + max(example.new_tokens, 3)  # decompose captures 3 steps
    else:
        assert example.max_cache_len is None
    assert not _known_failure(example.arch, example.backend, example.modes)
    mask = example.prompt()["attention_mask"]
    assert mask.shape == (example.batch, example.prompt_len) and int((mask == 0).sum()) == example.padding


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(fuzz.examples(archs=(*fuzz.DEFAULT_ARCHS, "t5")))
def test_drawn_models_build_and_run_eagerly(example):
    model, inputs = fuzz.build_example(example)
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape[:2] == (example.batch, inputs.get("decoder_input_ids", inputs["input_ids"]).shape[1])


def test_the_first_choice_of_every_draw_is_the_preset_itself():
    """What a shrunk example keeps is what matters: the simplest draw overrides nothing."""
    from hypothesis import find

    for name in ("llama", "qwen3", "gemma3_text", "gpt2", "falcon"):
        simplest = find(fuzz.config_overrides(fuzz.ARCHS[name]), lambda _: True)
        assert simplest == {}, name


def test_example_json_round_trip():
    example = fuzz.Example("qwen3", "onnx", {"sliding_window": 3, "rope_parameters": {"rope_type": "linear"}},
                           batch=2, padding=1, cache="static", max_cache_len=24, multi_token_decode=True,
                           modes=("generate",))
    assert fuzz.Example.from_json(example.to_json()) == example


# -- reproductions -----------------------------------------------------------------------------

_STATIC = fuzz.Example("qwen3", "onnx", {"num_hidden_layers": 1, "sliding_window": 3, "use_sliding_window": True,
                                          "max_window_layers": 0}, seed=2, batch=1, prompt_len=5, cache="static",
                       max_cache_len=20, multi_token_decode=True, new_tokens=3)
_EXPECTED_CALL = {
    "export": "artifact = exporter.export(model, inputs, config=config)",
    "validate": "hfexport.validate(artifact, model, inputs, steps=(2, 5))",
    "other-shape": "runner_for(artifact, record).run(record.artifact_inputs(other))",
    "decompose": "decompose_for_generation(model, inputs, generation_config=generation_config, "
                 "multi_token_decode=True)",
    "export-components": "artifacts = exporter.export_components(components, config)",
    "validate-components": "hfexport.validate_components(artifacts, components)",
    "save": "hfexport.save_folder(exporter, artifacts, directory, contents)",
    "runner": "hfexport.GenerationRunner.load(directory).generate(prompt, max_new_tokens=3",
    "decode-loop": "drive_decode_loop(decode.runner(), prompt[0].tolist(), want_tokens, max_cache_len=20)",
}


@pytest.mark.parametrize("stage", list(_EXPECTED_CALL))
def test_reproduction_is_python_with_the_example_and_the_failing_call(stage):
    code = fuzz.reproduction(_STATIC, stage)
    compile(code, f"<reproduction of {stage}>", "exec")
    assert "build_preset('qwen3', seed=2, num_hidden_layers=1, sliding_window=3" in code
    assert "'input_ids': torch.tensor([[" in code and '"export_format": "onnx", "dynamic": True' in code
    assert _EXPECTED_CALL[stage] in code
    if stage in fuzz.GENERATE_STAGES:
        assert "GenerationConfig(cache_implementation='static', max_cache_len=20)" in code
    later = [s for s in fuzz.GENERATE_STAGES if fuzz.GENERATE_STAGES.index(s) > fuzz.GENERATE_STAGES.index(stage)] \
        if stage in fuzz.GENERATE_STAGES else ["decompose"]
    assert not any(_EXPECTED_CALL[s] in code for s in later if s != "decode-loop" or stage != "runner")


def test_reproduction_of_a_decomposition_runs():
    """The printed script is ready to paste: run it (up to decompose, which exports nothing)."""
    example = dataclasses.replace(_STATIC, arch="llama", overrides={"num_hidden_layers": 1}, backend="dynamo")
    namespace: dict = {}
    exec(compile(fuzz.reproduction(example, "decompose"), "<reproduction>", "exec"), namespace)
    assert set(namespace["components"]) == {"decode"}  # a static cache with multi-token decode: one graph


def test_reproduction_keeps_padding_and_the_other_shape():
    example = fuzz.Example("llama", "dynamo", {}, batch=3, prompt_len=4, padding=2, other_batch=2, other_len=6)
    code = fuzz.reproduction(example, "other-shape")
    assert "'attention_mask': torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]])" in code
    assert "other = {'input_ids': torch.tensor([[" in code and "[0, 0, 1, 1, 1, 1]]" in code


def test_finding_markdown_holds_the_error_and_reproduction():
    failure = fuzz.Failure("runner", "mismatch", "step 1 logits: max abs 0.3", "qwen3: later step logits")
    text = fuzz.Finding(failure.key(), _STATIC, failure, found_at=4).markdown(seed=7)
    assert text.startswith("### runner mismatch: qwen3 on onnx")
    assert "step 1 logits: max abs 0.3" in text and "```python" in text and "--replay '" in text
    assert "`hfexport fuzz --seed 7`" in text


# -- verdicts ----------------------------------------------------------------------------------


def test_refusals_are_export_errors_with_a_real_remedy():
    declined = CaptureError("a dimension you marked dynamic cannot be dynamic", remedy="make that dimension static")
    assert _is_refusal("export", declined) and _is_refusal("export-components", declined)
    assert not _is_refusal("runner", declined)  # at run time, a declared limit is still a failure
    assert not _is_refusal("export", CaptureError("torch.export failed", remedy="rerun with --debug ..."))
    assert not _is_refusal("export", ConversionError("plan", remedy="... please report the model to hfexport"))
    assert not _is_refusal("export", ValidationError("differs", remedy="pass --tolerance"))
    assert not _is_refusal("export", PrepareError("no remedy"))
    assert not _is_refusal("export", RuntimeError("boom"))


def test_signature_blanks_sizes_symbols_and_model_names():
    a = fuzz.signature("AssertionError: Guard failed: s12 + input_ids.size()[1] <= 40 in LlamaForCausalLM\nmore")
    b = fuzz.signature("AssertionError: Guard failed: s7 + input_ids.size()[1] <= 9 in Qwen3ForCausalLM")
    assert a == b == "AssertionError: Guard failed: s? + input_ids.size()[N] <= N in <model>"


def test_compare_steps_allows_a_near_tie_only():
    want = [torch.tensor([0.0, 1.0, 1.0 - 1e-7]), torch.tensor([2.0, 0.0, 0.0])]
    assert fuzz.compare_steps([1, 0], want, [1, 0], want) is None
    assert fuzz.compare_steps([2], [want[0] + 1e-8], [1, 0], want[:1]) is None  # tied: either token is right
    message, what = fuzz.compare_steps([1, 0], [want[0], want[1] + 0.5], [1, 0], want)
    assert what == "later step logits" and message.startswith("step 1 logits")
    _, what = fuzz.compare_steps([0], want[:1], [1], want[:1])
    assert what == "token"  # same logits, another token: a processor differs
    _, what = fuzz.compare_steps([1], want[:1], [1, 0], want)
    assert what == "steps"


def test_summary_line_counts_by_category():
    summary = fuzz.FuzzSummary()
    example = fuzz.Example("llama", "dynamo", {})
    summary.count(example, fuzz.Outcome(seconds=2.0))
    summary.count(example, fuzz.Outcome(refusals=[fuzz.Failure("export", "error", "m", "s")], seconds=1.0))
    summary.count(example, fuzz.Outcome(failures=[fuzz.Failure("runner", "mismatch", "m", "s"),
                                                  fuzz.Failure("validate", "mismatch", "m", "s")], seconds=3.0))
    summary.count(example, fuzz.Outcome(invalid="eager fails"))
    line = summary.line()
    assert "4 examples run: 1 passed, 1 refused (export 1), 1 failed (" in line
    assert "runner mismatch 1" in line and "validate mismatch 1" in line and "1 invalid" in line
    assert "dynamo 2.0 s" in line


def test_the_cli_takes_the_fuzz_options():
    from hfexport.cli.main import _parser

    args = _parser().parse_args(["fuzz", "--examples", "3", "--backends", "dynamo,onnx", "--seed", "5",
                                 "--archs", "llama,qwen3", "--no-shrink"])
    options = fuzz.options_from_args(args)
    assert (options.examples, options.backends, options.seed, options.archs, options.shrink) == (
        3, ("dynamo", "onnx"), 5, ("llama", "qwen3"), False)
    with pytest.raises(ValueError, match="unknown backend"):
        fuzz.fuzz(dataclasses.replace(options, backends=("tflite",)))


def _fake_run(example: fuzz.Example) -> fuzz.Outcome:
    """Two planted bugs: long prompts break the one-graph export, static caches break the runner."""
    failures = []
    if "export" in example.modes and example.prompt_len > 6:
        failures.append(fuzz.Failure("other-shape", "mismatch", "logits differ", f"{example.arch}: logits"))
    if "generate" in example.modes and example.cache == "static":
        failures.append(fuzz.Failure("runner", "error", "RuntimeError: boom", "RuntimeError: boom", "RuntimeError"))
    return fuzz.Outcome(failures=failures, seconds=0.01)


def test_the_driver_shrinks_each_distinct_failure_and_runs_the_whole_budget(monkeypatch, tmp_path):
    import io

    monkeypatch.setattr(driver, "run_example", _fake_run)  # the name the session calls
    out, report = io.StringIO(), tmp_path / "findings.md"
    options = fuzz.FuzzOptions(examples=30, seed=3, shrink_budget=500, report=str(report), progress=False)
    summary = fuzz.fuzz(options, out=out)
    assert summary.run == 30 and summary.failed_examples > 0 and summary.shrink_runs > 0
    by_stage = {finding.failure.stage: finding.example for finding in summary.findings.values()}
    assert set(by_stage) == {"other-shape", "runner"}
    long_prompt, static = by_stage["other-shape"], by_stage["runner"]
    assert long_prompt.modes == ("export",) and long_prompt.prompt_len == 7  # shrunk to the boundary
    assert long_prompt.cache == "dynamic" and long_prompt.new_tokens == 4  # what export does not read: reset
    assert static.modes == ("generate",) and static.cache == "static" and static.prompt_len == 1
    assert out.getvalue().count("=== failure:") == len(summary.findings) == report.read_text().count("### ")
    assert "python -m hfexport.fuzz --replay '" in out.getvalue()


# -- a fixed seed, exporting ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_fixed_seed_finds_no_failure(capsys):
    """Dynamo and ONNX, a few examples of both parts: every export matches eager (refusals allowed)."""
    options = fuzz.FuzzOptions(examples=CI_EXAMPLES, backends=("dynamo", "onnx"), seed=CI_SEED, shrink=False)
    summary = fuzz.fuzz(options)
    printed = capsys.readouterr()
    assert summary.run == CI_EXAMPLES and summary.passed + sum(summary.refused.values()) > 0
    assert summary.failed_examples == 0, f"{summary.line()}\n{printed.out}"
