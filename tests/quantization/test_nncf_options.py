"""`NNCFQuantizer` takes NNCF's own parameters: checked against NNCF, kept in JSON, applied.

The applied cases run the OpenVINO artifact in the CPU plugin against fp32 eager on held-out
prompts (the random Llama and the bars of `test_quantizers.py`: logits cosine >= 0.97 for int4
weights, >= 0.98 for int8 static).
"""

from __future__ import annotations

import pytest

from hfexport import AutoExportConfig, OpenVINOConfig, record_of
from hfexport.errors import QuantizationError
from hfexport.quantization import NNCFQuantizer
from tests.quantization.test_quantizers import CALIBRATION, _export, _model, _require, held_out_cosines

nncf = pytest.importorskip("nncf")


def test_nncf_parameters_round_trip_through_json_with_enums_by_name():
    quantizer = NNCFQuantizer("int4-weights", mode=nncf.CompressWeightsMode.INT4_ASYM, ratio=0.8, group_size=64,
                              all_layers=True, ignored_scope=nncf.IgnoredScope(names=["lm_head"]),
                              advanced_parameters=nncf.AdvancedCompressionParameters(
                                  group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST))
    data = quantizer.to_dict()
    assert data["mode"] == "INT4_ASYM" and data["ratio"] == 0.8 and data["group_size"] == 64
    assert data["ignored_scope"]["names"] == ["lm_head"]
    assert data["advanced_parameters"]["group_size_fallback_mode"] == "ADJUST"
    config = OpenVINOConfig(dynamic=True, quantizer=quantizer)
    again = AutoExportConfig.from_json(config.to_json()).quantizer
    assert again.options["mode"] is nncf.CompressWeightsMode.INT4_ASYM
    assert again.options["ignored_scope"] == quantizer.options["ignored_scope"]
    assert again.options["advanced_parameters"].group_size_fallback_mode is nncf.GroupSizeFallbackMode.ADJUST
    assert again.to_dict() == data


def test_the_scheme_follows_an_nncf_mode_and_a_mismatch_is_refused():
    assert NNCFQuantizer(mode=nncf.CompressWeightsMode.INT8_SYM).scheme == "int8-weights"
    assert NNCFQuantizer(mode="NF4").scheme == "int4-weights"
    with pytest.raises(ValueError, match="not one of this scheme's nncf.CompressWeightsMode: INT8_ASYM, INT8_SYM"):
        NNCFQuantizer("int8-weights", mode=nncf.CompressWeightsMode.INT4_SYM)
    with pytest.raises(ValueError, match="is not a CompressWeightsMode; choose one of INT8_SYM"):
        NNCFQuantizer("int4-weights", mode="INT5")


def test_an_unknown_nncf_parameter_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown NNCF parameters \['ration'\] for nncf.compress_weights; "
                                         r"valid: mode, ratio, group_size"):
        NNCFQuantizer("int4-weights", ration=0.8)
    with pytest.raises(ValueError, match=r"unknown NNCF parameters \['ratio'\] for nncf.quantize; valid: mode, preset"):
        NNCFQuantizer("int8-static", CALIBRATION, ratio=0.8)


@pytest.mark.parametrize("group_size", [0, -2, 3.5, True])
def test_a_bad_group_size_is_refused(group_size):
    with pytest.raises(ValueError, match="is not a group size; pass a positive int"):
        NNCFQuantizer("int4-weights", group_size=group_size)


def test_a_group_size_on_per_channel_int8_is_refused():
    with pytest.raises(ValueError, match="per-channel in NNCF"):
        NNCFQuantizer("int8-weights", group_size=32)


def test_data_aware_compression_without_calibration_fails_before_tracing():
    quantizer = NNCFQuantizer("int4-weights", awq=True)
    assert quantizer.needs_calibration
    with pytest.raises(QuantizationError, match="needs calibration data"):
        quantizer.check("openvino")


APPLIED = [
    pytest.param(lambda: NNCFQuantizer(mode=nncf.CompressWeightsMode.INT4_ASYM, ratio=0.8, group_size=64,
                                       all_layers=True), 0.97, id="int4-asym-ratio-group-all-layers"),
    pytest.param(lambda: NNCFQuantizer("int4-weights", calibration=CALIBRATION, ratio=0.8, awq=True,
                                       scale_estimation=True,
                                       sensitivity_metric=nncf.SensitivityMetric.MAX_ACTIVATION_VARIANCE),
                 0.97, id="int4-data-aware"),
    pytest.param(lambda: NNCFQuantizer("int8-static", CALIBRATION, smooth_quant=False,
                                       preset=nncf.QuantizationPreset.MIXED, fast_bias_correction=False),
                 0.98, id="int8-static-preset"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("make", "min_cosine"), APPLIED)
def test_nncf_parameters_reach_nncf_and_the_artifact_stays_close_to_fp32_eager(make, min_cosine, tmp_path):
    quantizer = make()
    _require("openvino", quantizer)
    model = _model()
    artifact, _, _ = _export("openvino", model, quantizer, tmp_path, "quantized")
    quantization = record_of(artifact).details["quantization"]
    assert quantizer.to_dict().items() <= quantization.items()  # the record says what ran
    # counted in the OpenVINO model: int4/int8 weight constants, or FakeQuantize ops for int8-static
    assert quantization["low_precision_constants"] + quantization["fake_quantize_ops"] >= 14, quantization
    cosines = held_out_cosines(artifact, model)
    assert min(cosines) >= min_cosine, cosines
    if quantizer.options.get("ratio") == 0.8:  # the mixed-precision split happened: int4 and int8 weights
        types = {c.get_element_type().get_type_name() for c in artifact.get_ops() if c.get_type_name() == "Constant"}
        assert "u8" in types and types & {"u4", "i4"}, types
