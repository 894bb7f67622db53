"""OpenVINOExporter: the panel in the OpenVINO CPU plugin, precision, names, the seed's snippets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ov = pytest.importorskip("openvino")

from hfexport import OpenVINOConfig, OpenVINOExporter, validate  # noqa: E402
from hfexport.errors import ConversionError, SerializationError  # noqa: E402
from hfexport.presets import build_preset  # noqa: E402
from tests.backends.panel import panel_params  # noqa: E402
from tests.harness import expected_cases, export_and_validate, padded_batch, without  # noqa: E402

pytestmark = pytest.mark.slow  # every test exports to OpenVINO

ATOL = 1e-4


def _shared(dynamic_llama, name: str, dynamic: bool):
    """The dynamic tiny Llama is the export the module's other tests read (`dynamic_llama`): the panel
    validates that one rather than exporting the same preset with the same config again."""
    return dynamic_llama("openvino") if dynamic and name == "llama" else None


@pytest.mark.parametrize("name", panel_params("openvino"))
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_panel_matches_eager_in_openvino(name, dynamic, dynamic_llama):
    model, report, _, inputs = export_and_validate(OpenVINOExporter(), OpenVINOConfig(dynamic=dynamic), name,
                                                   steps=(2, 5), exported=_shared(dynamic_llama, name, dynamic))
    assert isinstance(model, ov.Model)
    assert report.precision == "f32 (CPU plugin INFERENCE_PRECISION_HINT)"  # what the compiled model ran in
    assert [c.label for c in report.cases] == expected_cases(inputs, dynamic, steps=(2, 5))


@pytest.fixture(scope="module")
def llama_ov(dynamic_llama):
    return dynamic_llama("openvino")


def test_seed_snippet_save_and_plain_compile_model(llama_ov, tmp_path):
    model, inputs, ov_model = llama_ov
    ov_model.save(tmp_path / "model.xml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin", "model.xml"]
    compiled = ov.Core().compile_model(ov_model, "CPU")
    ov_inputs = {k: v.numpy() for k, v in inputs.items()}
    outputs = compiled(ov_inputs)
    with torch.no_grad():
        expected = model(**inputs).logits.numpy()
    assert np.abs(outputs[compiled.outputs[0]] - expected).max() < ATOL
    # the plain call runs fp32 even on CPUs whose plugin default is bf16
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32
    reloaded = ov.Core().compile_model(ov.Core().read_model(tmp_path / "model.xml"), "CPU")
    assert reloaded.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32


def test_explicit_user_precision_wins(llama_ov):
    _, _, ov_model = llama_ov
    core = ov.Core()
    default = core.get_property("CPU", "INFERENCE_PRECISION_HINT")
    compiled = core.compile_model(ov_model, "CPU", {"INFERENCE_PRECISION_HINT": default})
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == default


def test_inputs_are_named_and_dynamic(llama_ov):
    _, _, ov_model = llama_ov
    assert [p.get_any_name() for p in ov_model.inputs] == ["input_ids", "attention_mask"]
    assert all(p.get_partial_shape().is_dynamic for p in ov_model.inputs)
    assert ov_model.outputs[0].get_any_name() == "logits"
    assert ov_model.outputs[1].get_any_name() == "output.cache.0.keys"


def test_save_refuses_missing_parent_and_with_overwrite_false_an_existing_file(llama_ov, tmp_path):
    _, _, ov_model = llama_ov
    with pytest.raises(SerializationError, match="does not exist"):
        ov_model.save(tmp_path / "nope" / "model.xml")
    (tmp_path / "model.xml").write_text("keep")
    with pytest.raises(SerializationError, match="already exists"):
        ov_model.save(tmp_path / "model.xml", overwrite=False)
    assert (tmp_path / "model.xml").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.xml"]


def test_fix_cat_empty_legacy_input_is_needed():
    """Minimal reproduction: a cat with a legacy empty 1-D tensor, as DynamicLayer does."""
    from hfexport.workarounds import FX_NODE_FIXES

    class CatEmpty(torch.nn.Module):
        def forward(self, x):
            return torch.cat([torch.tensor([]), x], dim=-2) * 2

    module, inputs = CatEmpty(), {"x": torch.randn(1, 2, 3, 4)}
    assert validate(OpenVINOExporter().export(module, inputs), module, inputs).passed
    with without(FX_NODE_FIXES, "fix_cat_empty_legacy_input"), pytest.raises(ConversionError, match="aten.cat"):
        OpenVINOExporter().export(module, inputs)


def test_moe_needs_the_batched_mm_switch():
    from hfexport.workarounds import PATCHES

    model, inputs = build_preset("qwen3_moe")
    with without(PATCHES, "patch_transformers_experts_interface"), pytest.raises(ConversionError, match="histc|grouped_mm"):
        OpenVINOExporter().export(model, inputs)


def test_left_padded_batch_gives_no_nan_in_real_tokens():
    """Minimal reproduction for `patch_torch_sdpa_fully_masked_rows`: without it OpenVINO turns a
    left-padded row into NaN everywhere (PyTorch returns 0 for fully masked attention rows)."""
    from hfexport.workarounds import PATCHES

    model, _ = build_preset("llama")
    inputs = padded_batch()
    assert validate(OpenVINOExporter().export(model, inputs), model, inputs).passed
    with without(PATCHES, "patch_torch_sdpa_fully_masked_rows"):
        report = validate(OpenVINOExporter().export(model, inputs), model, inputs)
    assert not report.passed and "non-finite" in (report.cases[0].outputs[0].error or "")
