"""`--dtype` / `JobOptions(dtype=...)`: the model is loaded in the dtype asked (`auto`: the
checkpoint's), exported and validated in it against eager in the same dtype with a tolerance that
fits it (`validation.default_tolerance`), and the report says it; a format whose runtime cannot run
a dtype refuses it (exit 2) naming one that works."""

from __future__ import annotations

import json

import pytest
import torch

from hfexport import AutoExportConfig
from hfexport.job.batch import OPTIONS
from hfexport.cli.main import main
from hfexport.errors import DtypeRefusedError
from hfexport.job.export import LoadingOptions, export_to_folder
from hfexport.loading import DTYPES, dtype_name, load_model
from hfexport.presets import build_preset
from hfexport.capture.record import record_of
from hfexport.runner import runner_for
from hfexport.validation import DEFAULT_TOLERANCE, default_tolerance

FORMATS = ("dynamo", "onnx", "openvino", "executorch")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_preset_loads_in_the_dtype_asked_with_its_float_inputs_cast(dtype):
    loaded = load_model("tiny:llama", dtype=dtype)
    assert {p.dtype for p in loaded.model.parameters()} == {getattr(torch, dtype)}
    assert dtype_name(loaded.model) == dtype
    assert loaded.inputs["input_ids"].dtype == torch.long  # token ids stay integers


def test_float_sample_inputs_follow_the_model_dtype():
    from hfexport.loading import LoadedModel, _in_dtype

    model, inputs = build_preset("llama")
    loaded = _in_dtype(LoadedModel(model, {**inputs, "pixels": torch.ones(2)}, "x"), "bfloat16")
    assert loaded.inputs["pixels"].dtype == torch.bfloat16 and loaded.inputs["input_ids"].dtype == torch.long


def test_auto_is_the_checkpoint_dtype_and_float32_stays_the_default(tmp_path):
    model, _ = build_preset("llama")
    model.to(torch.float16).save_pretrained(tmp_path / "half")
    assert dtype_name(load_model(str(tmp_path / "half"), dtype="auto").model) == "float16"
    assert dtype_name(load_model(str(tmp_path / "half")).model) == "float32"  # the default casts, as before
    assert dtype_name(load_model("tiny:llama", dtype="auto").model) == "float32"  # a preset's config names none


def test_an_unknown_dtype_is_refused_before_loading():
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, float16, bfloat16"):
        load_model("tiny:llama", dtype="float64")
    with pytest.raises(SystemExit) as exit_:
        main(["export", "tiny:llama", "-o", "unused", "--dtype", "int8"])
    assert exit_.value.code == 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_tolerance_of_a_16_bit_dtype_is_derived_from_its_epsilon(fmt):
    assert default_tolerance(fmt, torch.float32) == DEFAULT_TOLERANCE[fmt]
    half, bf16 = default_tolerance(fmt, torch.float16), default_tolerance(fmt, torch.bfloat16)
    assert half == (16 * 2**-10, 16 * 2**-10) and bf16 == (16 * 2**-7, 16 * 2**-7)


def test_export_many_takes_dtype():
    assert "dtype" in OPTIONS


def _refused() -> list[tuple[str, str]]:
    return [(fmt, dtype) for fmt in FORMATS for dtype in DTYPES[1:]
            if AutoExportConfig.from_dict({"export_format": fmt}).dtype_refusal(dtype)]


@pytest.mark.parametrize("fmt,dtype", _refused() or [pytest.param("-", "-", marks=pytest.mark.skip("none refused"))])
def test_a_dtype_the_runtime_cannot_run_is_refused_naming_one_that_works(fmt, dtype, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", "tiny:llama", "-f", fmt, "--dtype", dtype, "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"cannot export in {dtype}" in err and "--dtype float32" in err
    assert not out.exists()  # refused before any work: nothing written
    model, inputs = build_preset("llama")  # a model given loaded is refused in its own dtype
    with pytest.raises(DtypeRefusedError, match=dtype):
        export_to_folder((model.to(getattr(torch, dtype)), inputs), AutoExportConfig.from_dict({"export_format": fmt}),
                         tmp_path / "api")
    assert not (tmp_path / "api").exists()


def _supported() -> list[tuple[str, str]]:
    return [(fmt, dtype) for fmt in FORMATS for dtype in ("float16", "bfloat16")
            if not AutoExportConfig.from_dict({"export_format": fmt}).dtype_refusal(dtype)]


@pytest.mark.slow
@pytest.mark.parametrize("fmt,dtype", _supported())
def test_tiny_llama_exports_and_matches_eager_in_the_dtype(fmt, dtype, tmp_path):
    """The README's job in a 16-bit dtype: every case of the validation (sample, resized, smallest)
    against eager in that dtype, within its eps-derived tolerance; the artifact takes the dtype's
    tensors and the report names it."""
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    result = export_to_folder("tiny:llama", config, tmp_path / "out", loading=LoadingOptions(dtype=dtype))
    _check(result, fmt, dtype)


#: One drawn variation per format: other head dims, kv heads and prompt lengths than tiny:llama's.
VARIATIONS = {"dynamo": dict(head_dim=16, num_key_value_heads=1), "onnx": dict(head_dim=4, num_key_value_heads=4),
              "openvino": dict(head_dim=16, num_key_value_heads=2), "executorch": dict(head_dim=4, num_key_value_heads=1)}


@pytest.mark.slow
@pytest.mark.parametrize("fmt,dtype", [(fmt, dtype) for fmt, dtype in _supported() if dtype == "float16"]
                         or [pytest.param("-", "-", marks=pytest.mark.skip("no format runs float16"))])
def test_a_drawn_variation_matches_eager_in_float16(fmt, dtype, tmp_path):
    model, inputs = build_preset("llama", 1, **VARIATIONS[fmt])
    inputs = {"input_ids": torch.randint(3, 120, (1, 5)), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    result = export_to_folder((model.to(torch.float16), inputs), config, tmp_path / "out")
    _check(result, fmt, dtype)


def _check(result, fmt: str, dtype: str) -> None:
    report = result.reports["model"]
    atol, rtol = default_tolerance(fmt, getattr(torch, dtype))
    assert (report.atol, report.rtol) == (atol, rtol)
    assert [case.label for case in report.cases] == ["sample", "resized", "smallest"] and report.passed, report.to_table()
    for case in report.cases:
        logits = next(o for o in case.outputs if o.name == "logits")
        assert logits.max_rel <= 2 * rtol and logits.cosine > 0.999, report.to_table()
    # the artifact itself computes in the dtype: its logits come back in it, not cast to another
    record = record_of(result.artifacts["model"])
    logits = runner_for(result.artifacts["model"], record).run(record.artifact_inputs(result.inputs))[0]
    assert torch.as_tensor(logits).dtype == getattr(torch, dtype)
    saved = json.loads((result.directory / "report.json").read_text())
    assert saved["dtype"] == result.report["dtype"] == dtype
    assert dtype_name(result.model) == dtype


@pytest.mark.slow
def test_the_cli_exports_in_the_dtype_and_its_summary_says_so(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", "tiny:llama", "--task", "forward", "--dtype", "bfloat16", "-o", str(out), "-q"]) == 0
    stdout = capsys.readouterr().out
    assert "  dtype:          bfloat16" in stdout.splitlines() and stdout.splitlines()[-1] == "result: PASSED"
    assert json.loads((out / "report.json").read_text())["dtype"] == "bfloat16"
