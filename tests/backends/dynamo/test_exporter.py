"""DynamoExporter: the architecture panel, dynamic shapes, and the seed's snippets."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, validate
from hfexport.presets import build_preset
from tests.backends.panel import panel_params
from tests.harness import assert_close_to_eager, expected_cases, export_and_validate


def _shared(dynamic_llama, name: str, dynamic: bool):
    """The dynamic tiny Llama is the export the module's other tests read (`dynamic_llama`): the panel
    validates that one rather than exporting the same preset with the same config again."""
    return dynamic_llama("dynamo") if dynamic and name == "llama" else None


@pytest.mark.parametrize("name", panel_params("dynamo"))
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_panel_matches_eager(name, dynamic, dynamic_llama):
    program, report, _, inputs = export_and_validate(DynamoExporter(), DynamoConfig(dynamic=dynamic), name,
                                                     exported=_shared(dynamic_llama, name, dynamic))
    assert isinstance(program, torch.export.ExportedProgram)
    assert [c.label for c in report.cases] == expected_cases(inputs, dynamic)
    if dynamic and name in ("llama", "bert", "t5"):
        # the resized case really moved batch and sequence (1 -> 3, n -> n + 2)
        resized = report.cases[1].input_shapes["input_ids"]
        assert resized[0] == 3 and resized[1] == report.cases[0].input_shapes["input_ids"][1] + 2


def test_mistral_sliding_window_is_shorter_than_the_input():
    model, inputs = build_preset("mistral")
    assert model.config.sliding_window < inputs["input_ids"].shape[1]


def test_batch_one_capture_serves_batch_three_at_other_lengths(dynamic_llama):
    model, inputs, program = dynamic_llama("dynamo")
    assert inputs["input_ids"].shape[0] == 1
    module = program.module()
    for batch, length in [(3, 5), (3, 13), (2, 2)]:
        ids = torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(length))
        kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        with torch.no_grad():
            assert_close_to_eager(module(**kwargs).logits, model(**kwargs).logits, atol=1e-5)


def test_static_export_rejects_another_batch_size_and_validation_says_so():
    model, inputs = build_preset("llama")
    program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=False))
    report = validate(program, model, inputs, resized=False)
    assert report.passed
    from hfexport.validation import resize_inputs
    from hfexport import record_of

    assert resize_inputs(inputs, record_of(program)) is None  # static: nothing to resize
    ids = torch.randint(3, 128, (3, 8))
    with pytest.raises(Exception, match="Guard failed|Expected input"):
        program.module()(input_ids=ids, attention_mask=torch.ones_like(ids))


def test_seed_export_snippet():
    model, inputs = build_preset("qwen3")
    exporter = DynamoExporter()
    config = DynamoConfig(dynamic=True)
    exported = exporter.export(model, inputs, config=config)
    outputs = exported.module()(**inputs)
    with torch.no_grad():
        assert_close_to_eager(outputs.logits, model(**inputs).logits, atol=1e-5)


def test_saved_program_round_trips(tmp_path):
    program, _, model, inputs = export_and_validate(DynamoExporter(), DynamoConfig(dynamic=True), "gpt2")
    files = DynamoExporter().save(program, tmp_path)
    loaded = torch.export.load(files[0])
    report = validate(loaded, model, inputs)  # a loaded program carries its own shapes
    assert report.passed and [c.label for c in report.cases] == expected_cases(inputs, True), report.to_table()
