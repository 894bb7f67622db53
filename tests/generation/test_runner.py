"""GenerationRunner: greedy tokens through every backend's saved export equal eager generate()."""

from __future__ import annotations

import json

import pytest
import torch

from hfexport import GenerationExport, GenerationRunner
from tests.harness import known_failure_marks, require_backend

from .conftest import CASES, FORMATS
from .exports import IMAGE_CASES

NEW_TOKENS = 8


def _params():
    """Every format x text case (the image-text cases generate from an image:
    test_multimodal_generate.py); a case's preset listed in `KNOWN_FAILURES` for `generate` on that
    format is a strict xfail, so a fix shows up as an unexpected pass."""
    for fmt in FORMATS:
        for case, (preset, _) in CASES.items():
            if case in IMAGE_CASES:
                continue
            yield pytest.param(fmt, case, id=f"{fmt}-{case}", marks=known_failure_marks(preset, fmt, "generate"))


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "case"), list(_params()))
def test_greedy_tokens_from_the_loaded_export_equal_generate(saved_generation, fmt, case):
    require_backend(fmt)
    saved = saved_generation(fmt, case)
    runner = GenerationRunner.load(saved.directory)
    result = runner.generate(saved.inputs["input_ids"], max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             attention_mask=saved.inputs.get("attention_mask"), output_logits=True)
    tokens, logits = saved.eager(NEW_TOKENS)
    assert result.tokens == tokens
    # every step's logits too: a tiny random T5 repeats one token, so tokens alone would not show
    # a cache fed back wrong
    for step, (got, want) in enumerate(zip(result.logits, logits)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=lambda m, s=step: f"step {s}: {m}")
    assert result.time_to_first_token_s > 0 and result.tokens_per_s > 0


@pytest.mark.slow
def test_a_loaded_export_has_every_component_with_its_record(saved_generation):
    require_backend("onnx")
    saved = saved_generation("onnx", "t5")
    export = GenerationExport.load(saved.directory)
    assert export.format == "onnx" and list(export.components) == ["encoder", "prefill", "decode"]
    manifest = json.loads((saved.directory / "manifest.json").read_text())
    for name, component in export.components.items():
        assert component.record.input_names == [i["name"] for i in manifest["components"][name]["inputs"]]
        assert component.record.output_names == manifest["components"][name]["outputs"]
    assert export.config.model_type == "t5" and export.generation_config.decoder_start_token_id is not None
    assert manifest["cache"] == "dynamic"


@pytest.mark.slow
def test_the_executorch_t5_folder_plans_its_sequences_at_n_positions(saved_generation):
    """The export job's T5 folder (validation on): every sequence bounded at the config's
    `n_positions` (128), not the 4096 fallback whose encoder plan was 10 GiB, every component loads
    in ExecuTorch's runtime with a plan of a few MiB, and a prompt far longer than the sample's
    generates eager's tokens. The prefill's and decode's `encoder_outputs` were bounded at twice the
    sample (14) before; that folder generated these tokens too, so the bounds are what this checks."""
    require_backend("executorch")
    saved = saved_generation("executorch", "t5")
    limit = saved.model.config.n_positions
    records = {name: entry["record"]
               for name, entry in json.loads((saved.directory / "report.json").read_text())["components"].items()}
    assert list(records) == ["encoder", "prefill", "decode"]
    for name, record in records.items():
        sequences = {axis: bound for axis, bound in record["dim_bounds"].items()
                     if axis.endswith(("(sequence)", "(encoder_sequence)", "(cache_length)"))}
        assert sequences and all(bound == f"<= {limit}: the model config's n_positions"
                                 for bound in sequences.values()), (name, sequences)
        assert record["planned_memory"].endswith(" MiB"), (name, record["planned_memory"])  # measured 0.8-10.4
    for name in ("prefill", "decode"):  # the encoder's states they read: `(dim) <= 14: twice the sample` before
        assert records[name]["dim_bounds"].get("encoder_outputs.0[1] (encoder_sequence)") == \
            f"<= {limit}: the model config's n_positions", records[name]["dim_bounds"]
    runner = GenerationRunner.load(saved.directory)
    assert list(runner.export.components) == list(records)  # each loads in the runtime
    prompt = torch.randint(3, saved.model.config.vocab_size, (1, limit - 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        eager = saved.model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    assert runner.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS).tokens == eager[0, 1:].tolist()


@pytest.mark.slow
def test_a_static_export_records_its_cache(saved_generation):
    manifest = json.loads((saved_generation("dynamo", "llama-static").directory / "manifest.json").read_text())
    assert manifest["cache"] == "static" and manifest["max_cache_len"] == 32
    assert list(manifest["components"]) == ["decode"]  # the decode graph prefills too
    assert set(manifest["initial_cache"].values()) == {0}  # write counters start at 0


@pytest.mark.slow
def test_sampling_with_a_seed_is_reproducible(saved_generation):
    runner = GenerationRunner.load(saved_generation("dynamo", "llama").directory)
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=True, temperature=1.5,
                   top_k=50, top_p=0.95, repetition_penalty=1.2)
    first = runner.generate([1, 2, 3, 4], seed=0, **options).tokens
    assert runner.generate([1, 2, 3, 4], seed=0, **options).tokens == first
    assert runner.generate([1, 2, 3, 4], seed=1, **options).tokens != first  # deterministic given the seeds
    greedy = runner.generate([1, 2, 3, 4], max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS).tokens
    assert greedy != first


@pytest.mark.slow
def test_a_prompt_longer_than_the_static_cache_is_refused(saved_generation):
    from hfexport.errors import ExportError

    runner = GenerationRunner.load(saved_generation("dynamo", "llama-static").directory)
    with pytest.raises(ExportError, match="do not fit the static cache of 32"):
        runner.generate(list(range(1, 30)), max_new_tokens=8, min_new_tokens=8)


def test_a_folder_without_a_manifest_gets_a_clear_error(tmp_path):
    from hfexport.errors import SerializationError

    with pytest.raises(SerializationError, match="holds no manifest.json"):
        GenerationRunner.load(tmp_path)
