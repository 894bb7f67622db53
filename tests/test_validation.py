"""Validation: differences are measured per output, and failures are failures."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, validate
from hfexport.presets import build_preset
from hfexport.validation.compare import compare_output
from hfexport.validation.inputs import _tile


def test_report_lists_every_output_with_its_tolerance(dynamic_llama):
    model, inputs, program = dynamic_llama("dynamo")
    report = validate(program, model, inputs)
    names = [o.name for o in report.cases[0].outputs]
    assert names[0] == "logits" and "cache.1.values" in names
    data = report.to_dict()
    assert data["passed"] and data["atol"] == 1e-5 and "atol + rtol" in data["rule"]
    assert "tolerance: atol=1e-05" in report.to_table()


def test_a_quantized_rule_holds_the_cache_to_its_own_floor(dynamic_llama):
    """`min_cosine` judges the logits, `min_cache_cosine` the cache tensors (a quantized export's
    criteria): floors out of reach fail exactly the outputs they apply to."""
    model, inputs, program = dynamic_llama("dynamo")
    loose_cache = validate(program, model, inputs, resized=False, min_cosine=1.01, min_cache_cosine=0.5)
    loose_logits = validate(program, model, inputs, resized=False, min_cosine=0.5, min_cache_cosine=1.01)
    names = {o.name for o in loose_cache.cases[0].outputs}
    assert "logits" in names and "cache.1.values" in names
    assert {o.name for o in loose_cache.cases[0].outputs if not o.passed} == {"logits"}
    assert {o.name for o in loose_logits.cases[0].outputs if not o.passed} == names - {"logits"}
    assert "0.5 for cache tensors" in loose_cache.to_table() and loose_cache.to_dict()["min_cache_cosine"] == 0.5


def test_advisory_floors_report_what_is_under_them_and_fail_only_what_is_wrong(dynamic_llama):
    """`cosine_advisory` (the export job's, where its accuracy gate judges a quantized generation
    export): outputs under a floor are marked and reported, the report passes; a wrong shape still
    fails, and without a floor there is nothing to be advisory about."""
    model, inputs, program = dynamic_llama("dynamo")
    why = "the accuracy gate judges the logits"
    report = validate(program, model, inputs, resized=False, min_cosine=1.01, min_cache_cosine=0.5, cosine_advisory=why)
    assert report.passed and report.below_floor == ["sample/logits"]
    assert report.to_dict()["cosine_advisory"] == why and why in report.rule
    assert "below floor (advisory)" in report.to_table() and "PASSED" in report.to_table()
    binding = validate(program, model, inputs, resized=False, min_cosine=1.01, min_cache_cosine=0.5)
    assert not binding.passed and binding.below_floor == []

    wrong = compare_output("logits", torch.zeros(1, 2), torch.ones(1, 3), 0, 0, min_cosine=0.5, advisory=True)
    assert not wrong.passed and "shape" in wrong.error
    nan = compare_output("logits", torch.tensor([1.0, float("nan")]), torch.ones(2), 0, 0, min_cosine=0.5, advisory=True)
    assert not nan.passed and "non-finite" in nan.error
    with pytest.raises(ValueError, match="pass min_cosine too"):
        validate(program, model, inputs, resized=False, cosine_advisory=why)


@pytest.mark.parametrize("seed", range(4))
def test_compare_measures_the_finite_entries_as_a_direct_computation_does(seed):
    """`compare_output` skips its selection of finite entries when every entry is finite: drawn shapes,
    dtypes and non-finite entries (NaN and inf at the same places on both sides, or not) give the
    numbers a direct computation over the finite entries gives."""
    generator = torch.Generator().manual_seed(seed)
    shape = [int(n) for n in torch.randint(1, 9, (int(torch.randint(1, 5, (1,), generator=generator)),),
                                           generator=generator)]
    dtype = (torch.float32, torch.float16, torch.bfloat16, torch.float64)[seed]
    want = torch.randn(shape, generator=generator).to(dtype)
    got = (want.double() + 1e-3 * torch.randn(shape, generator=generator, dtype=torch.float64)).to(dtype)
    for blanks in ([], [float("nan")], [float("inf"), float("-inf")]):
        w, g = want.clone().flatten(), got.clone().flatten()
        for index, value in enumerate(blanks):
            w[index % w.numel()], g[index % g.numel()] = value, value
        w, g = w.view(shape), g.view(shape)
        finite = torch.isfinite(w.double())
        a, b = g.double()[finite], w.double()[finite]
        diff = compare_output("logits", g, w, 1e-2, 0)
        expected = float((a - b).abs().max()) if a.numel() else 0.0
        assert diff.max_abs == pytest.approx(expected, rel=1e-12, abs=0)
        assert diff.passed == (expected <= 1e-2)
        if a.numel() and float(a.norm() * b.norm()) > 0:
            assert diff.cosine == pytest.approx(float((a * b).sum() / (a.norm() * b.norm())), rel=1e-12)
        if blanks:  # the same non-finite value on one side only fails
            g.view(-1)[0] = 0.0
            one_sided = compare_output("logits", g, w, 1e-2, 0)
            assert not one_sided.passed and "non-finite" in one_sided.error


def test_a_wrong_weight_fails_validation():
    model, inputs = build_preset("bert")
    program = DynamoExporter().export(model, inputs, config=DynamoConfig())
    # give eager a changed copy of one weight; the program keeps the exported one
    dense = model.encoder.layer[0].intermediate.dense
    dense.weight = torch.nn.Parameter(dense.weight.detach() * 3)
    report = validate(program, model, inputs)
    assert not report.passed
    failing = [o for o in report.cases[0].outputs if not o.passed]
    assert failing and failing[0].max_abs > 1e-3


def test_a_specialised_dimension_fails_the_resized_case():
    model, inputs = build_preset("llama")
    program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=False))
    from hfexport import record_of

    record = record_of(program)
    record.input_shapes = [("b", "s"), ("b", "s")]  # claim dims that the program does not have
    record.symbol_ranges = {}
    report = validate(program, model, inputs, resized=True)
    assert report.cases[0].passed and not report.cases[1].passed
    assert report.cases[1].error  # the runtime refused the new shape: reported, not raised


def test_tile_keeps_values_and_reaches_the_shape():
    t = torch.arange(6).reshape(1, 6)
    out = _tile(t, (3, 8))
    assert out.shape == (3, 8) and torch.equal(out[2, :6], t[0]) and torch.equal(out[0, 6:], t[0, :2])


class _GuardsOnMoreThanOneToken(torch.nn.Module):
    """Takes a different path for one token (as a model's decode branch does): traced at 4 tokens,
    the program is guarded on more than one."""

    def forward(self, input_ids):
        scale = 2.0 if input_ids.shape[1] > 1 else 3.0
        return (input_ids.float() * scale,)


def test_the_smallest_case_catches_a_program_that_refuses_one_token():
    """Growing sizes cannot see a program that refuses fewer tokens than it was traced with."""
    module, inputs = _GuardsOnMoreThanOneToken(), {"input_ids": torch.ones(2, 4, dtype=torch.long)}
    program = DynamoExporter().export(module, inputs, config=DynamoConfig(dynamic=True))
    report = validate(program, module, inputs)
    assert [c.label for c in report.cases] == ["sample", "resized", "smallest"]
    assert report.cases[1].passed and not report.passed
    smallest = report.cases[2]
    assert smallest.input_shapes == {"input_ids": [1, 1]} and "Guard failed" in smallest.error


class _Doubles(torch.nn.Module):
    def forward(self, input_ids):
        return (input_ids.float() * 2,)


def test_the_smallest_case_is_skipped_when_the_sample_is_that_small():
    module, inputs = _Doubles(), {"input_ids": torch.ones(1, 1, dtype=torch.long)}
    program = DynamoExporter().export(module, inputs, config=DynamoConfig(dynamic=True))
    assert [c.label for c in validate(program, module, inputs).cases] == ["sample", "resized"]


def test_a_static_cache_mask_is_resized_as_a_causal_mask():
    """Tiling a causal mask's rows gave the padded row of a shorter prompt no key at all (the
    fuzzer's Gemma-3 and OLMoE static prefills on ONNX then differed from eager)."""
    from hfexport.generation.masks import causal_mask
    from hfexport.validation.inputs import _causal_mask

    padding = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    prefill = causal_mask(padding, 0, 4, 8)  # [2, 1, 4, 8]
    one = _causal_mask(prefill, (2, 1, 1, 8))
    assert torch.equal(one, causal_mask(torch.tensor([[1], [1]]), 0, 1, 8))  # the last (real) token kept
    longer = _causal_mask(prefill, (3, 1, 6, 10))
    assert torch.equal(longer[:2], causal_mask(torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]]), 0, 6, 10))
    decode = causal_mask(padding, 4, 2, 8)  # two tokens after four cached
    assert torch.equal(_causal_mask(decode, (2, 1, 1, 8)), causal_mask(padding, 4, 1, 8))


def test_positions_are_resized_as_a_runtime_numbers_the_query():
    """Each row's positions run on from its first, as the resized masks place the query; tiled, a
    query of three sat at one position three times, which eager takes and a GroupQueryAttention
    graph rotating the query itself cannot (a Llama of head dim 16 through the API then failed its
    resized case)."""
    from hfexport.validation.inputs import _positions

    assert torch.equal(_positions(torch.tensor([[5]]), (1, 3)), torch.tensor([[5, 6, 7]]))
    assert torch.equal(_positions(torch.tensor([[4, 5, 6], [2, 3, 4]]), (3, 1)), torch.tensor([[4], [2], [4]]))
    assert torch.equal(_positions(torch.tensor([[0, 1]]), (2, 4)), torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]]))


def test_a_static_cache_resize_keeps_the_query_inside_the_cache():
    """ExecuTorch bounds a static cache's length at `max_cache_len`, so the resized case moved it
    down while the query grew: 12 tokens written + 4 new in a cache of 15, which eager refuses
    (the fuzzer's Gemma-3 static multi-token decode on ExecuTorch, seed 203)."""
    from hfexport.capture.record import ExportRecord
    from hfexport.validation import resize_inputs

    names = ["input_ids", "attention_mask", "position_ids", "past_key_values.0.cumulative_length",
             "past_key_values.0.keys", "past_key_values.0.values"]
    shapes = [("batch", "query"), ("batch", 1, "query", "cache_length"), ("batch", "query"), (),
              ("batch", 2, "cache_length", 16), ("batch", 2, "value_length", 16)]  # as torch.export gave them
    record = ExportRecord("executorch", "Gemma3ForCausalLM", names, ["logits"], shapes,
                          {"batch": (1, 8), "query": (1, 128), "cache_length": (1, 16), "value_length": (1, 16)})
    inputs = {"input_ids": torch.ones(1, 2, dtype=torch.long),
              "attention_mask": torch.ones(1, 1, 2, 16, dtype=torch.bool),
              "position_ids": torch.tensor([[12, 13]]),
              "past_key_values.0.cumulative_length": torch.tensor(12),
              "past_key_values.0.keys": torch.zeros(1, 2, 16, 16), "past_key_values.0.values": torch.zeros(1, 2, 16, 16)}
    resized = resize_inputs(inputs, record)
    assert resized["input_ids"].shape == (3, 4)
    assert resized["past_key_values.0.keys"].shape == resized["past_key_values.0.values"].shape == (3, 2, 16, 16)
    assert torch.equal(resized["position_ids"], torch.tensor([[12, 13, 14, 15]] * 3))  # after the 12 written
    written = 12
    inputs["past_key_values.0.cumulative_length"] = torch.tensor(written + 2)  # 14 + 4 would not fit either
    resized = resize_inputs(inputs, record)
    assert resized["input_ids"].shape == (3, 1) and resized["attention_mask"].shape == (3, 1, 1, 16)


def test_a_static_cache_that_holds_the_writes_is_still_resized():
    """The cache length moves when the writes fit it (a one-token decode on ExecuTorch, whose cache
    length is bounded at the sample's): keeping it there left every input at the sample's shape
    (the fuzzer's Llama, static cache of 48, seed 206)."""
    from hfexport.capture.record import ExportRecord
    from hfexport.validation import resize_inputs

    names = ["input_ids", "attention_mask", "position_ids", "past_key_values.0.cumulative_length",
             "past_key_values.0.keys", "past_key_values.0.values"]
    shapes = [(2, 1), (2, 1, 1, "cache_length"), (2, 1), (), (2, 2, "cache_length", 16), (2, 2, "cache_length", 16)]
    record = ExportRecord("executorch", "LlamaForCausalLM", names, ["logits"], shapes, {"cache_length": (1, 48)})
    inputs = {"input_ids": torch.ones(2, 1, dtype=torch.long), "attention_mask": torch.ones(2, 1, 1, 48, dtype=torch.bool),
              "position_ids": torch.ones(2, 1, dtype=torch.long), "past_key_values.0.cumulative_length": torch.tensor(1),
              "past_key_values.0.keys": torch.zeros(2, 2, 48, 16), "past_key_values.0.values": torch.zeros(2, 2, 48, 16)}
    resized = resize_inputs(inputs, record)
    assert resized["past_key_values.0.keys"].shape == (2, 2, 47, 16) and resized["attention_mask"].shape == (2, 1, 1, 47)


def test_a_cache_leaf_is_masked_by_slot_even_when_its_heads_equal_the_prompt_length():
    """Fuzz seed 303: a GPT-J key cache `[2, 4, 4, 8]` under a 2 x 4 padding mask was masked along
    its heads (they equal the prompt length), so its padded slot was compared with eager."""
    from hfexport.validation.compare import _padding_keep

    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    keep = _padding_keep((2, 4, 4, 8), mask, cache=True)
    assert keep.shape == (2, 1, 4, 1) and not keep[1, 0, 0, 0] and keep[1, 0, 1, 0] and keep[0].all()
    assert _padding_keep((2, 4, 4, 8), mask).shape == (2, 4, 1, 1)  # not a cache: [batch, query, ...]


def test_a_cache_longer_than_a_mask_over_the_written_slots_is_masked_by_slot():
    """A static mask over the written slots only (`generation/attended.py`) is narrower than the
    cache: its padded slot is still left out, and the later slots are free (fuzz seed
    `test_a_fixed_seed_finds_no_failure`: a padded prefill's resized key cache [2, 3, 18, 8]
    under a [2, 1, 10, 10] mask compared its padded slot)."""
    from hfexport.generation.masks import causal_mask
    from hfexport.validation.compare import _padding_keep

    padding = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    mask = causal_mask(padding, 0, 4, 4)  # [2, 1, 4, 4]: the written slots only
    keep = _padding_keep((2, 3, 9, 8), mask, cache=True)
    assert keep.shape == (2, 1, 9, 1)
    assert keep[:, 0, :, 0].tolist() == [[True] * 9, [False] + [True] * 8]


def test_an_advisory_report_that_fails_names_the_wrong_output_not_a_floor(dynamic_llama, monkeypatch, tmp_path):
    """The export job's refusal when validation's floors were advisory: it names the output that is
    wrong (a shape here) and does not offer a cosine floor as the remedy."""
    import hfexport.validation.driver as driver
    from hfexport.errors import ValidationError
    from hfexport.job.export import _validated

    model, inputs, program = dynamic_llama("dynamo")
    report = validate(program, model, inputs, resized=False, min_cosine=0.5, cosine_advisory="the gate judges")
    logits = report.cases[0].outputs[0]
    report.cases[0].outputs[0] = dataclasses.replace(logits, shape=[9], passed=False, cosine=None,
                                                     error="shape [9] but eager gives " + str(logits.shape))
    monkeypatch.setattr(driver, "validate_components", lambda *args, **kwargs: {"decode": report})
    with pytest.raises(ValidationError, match=r"sample case, logits: shape \[9\]") as caught:
        _validated({"decode": program}, {}, tmp_path / "out")
    assert "no cosine floor accepts" in str(caught.value) and "--min-cosine" not in str(caught.value)
