"""The validation lines `hfexport export` prints by default (`hfexport.cli.verdict`): one per component,
naming the output nearest its bound, not merely the largest difference."""

from __future__ import annotations

from hfexport.cli.verdict import component_line, failing_rows
from hfexport.validation import CaseReport, OutputDiff, ValidationReport


def _report(outputs: list[OutputDiff], **floors) -> ValidationReport:
    return ValidationReport("onnx", "LlamaForCausalLM", "ONNX Runtime", "float32", 1e-4, 1e-4,
                            [CaseReport("sample", {}, outputs[:1]), CaseReport("resized", {}, outputs[1:])], **floors)


def test_the_worst_output_is_the_one_nearest_its_tolerance():
    # logits: 2e-4 off in values of 30 (bound 3.1e-3); a cache value 8e-5 off in values of 0.01 (bound 1.01e-4)
    report = _report([OutputDiff("logits", [1, 2, 8], 2e-4, 2e-4 / 30, True),
                      OutputDiff("cache.0.keys", [1, 2, 3, 4], 8e-5, 8e-5 / 0.01, True)])
    assert component_line("decode", report) == ("    decode:       passed; worst output cache.0.keys (resized case): "
                                                 "max abs 8e-05 (tolerance atol=0.0001, rtol=0.0001)")


def test_a_failing_output_comes_first_and_its_rows_are_cut_at_ten():
    outputs = [OutputDiff("logits", [1], 1e-6, 1e-6, True)] + [
        OutputDiff(f"cache.{i}.keys", [1], 0.5, 0.5, False) for i in range(12)]
    report = _report(outputs)
    assert component_line("decode", report).startswith(
        "    decode:       FAILED (12 of 13 outputs); worst output cache.0.keys (resized case): max abs 0.5 ")
    rows = failing_rows(report)
    assert len(rows) == 11 and all("FAIL" in row for row in rows[:10])
    assert rows[10] == "  ... 2 more failing (--verbose prints every output)"


def test_under_a_cosine_floor_the_worst_is_the_lowest_cosine_against_its_own_floor():
    report = _report([OutputDiff("logits", [1], 0.1, 0.1, True, cosine=0.996),
                      OutputDiff("cache.0.values", [1], 0.3, 0.3, True, cosine=0.97)],
                     min_cosine=0.995, min_cache_cosine=0.95)
    assert component_line("decode", report) == ("    decode:       passed; worst output logits (sample case): "
                                                 "cosine 0.996000 (floor 0.995)")


def test_a_case_that_did_not_run_is_named():
    report = ValidationReport("onnx", "M", "ONNX Runtime", "float32", 1e-4, 1e-4,
                              [CaseReport("resized", {}, [], error="RuntimeError: shape")])
    assert component_line("model", report) == ("    model:        FAILED; the resized case did not run: "
                                                "RuntimeError: shape")
