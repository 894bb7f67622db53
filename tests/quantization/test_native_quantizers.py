"""Quantizers built from the runtimes' own objects: a torchao PT2E `Quantizer` a user configures,
on every format whose converter takes the quantized graph, run in its runtime against fp32 eager
(cosine >= 0.98 on held-out prompts; measured 0.9999 with X86InductorQuantizer, 0.999 with XNNPACK's dynamic
per-channel config, on the random Llama of test_quantizers.py)."""

from __future__ import annotations

import pytest

from hfexport import AutoExportConfig, AutoHfExporter, record_of
from hfexport.errors import QuantizationError
from tests.harness import require_backend
from tests.quantization.test_quantizers import CALIBRATION, _model, held_out_cosines

pytest.importorskip("torchao")


def _x86():
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    return X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())


def _xnnpack_dynamic():
    pytest.importorskip("executorch")
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    # NOTE: a static config on a rotary decoder keeps int8 on the linears only (ExecuTorch 1.4.1
    # crashes on the rest, pytorch/executorch#21568), tested with the seed's static recipe in
    # test_quantizers.py. A dynamic per-tensor config is not delegated ("Missing out variants:
    # quantized_decomposed::quantize_per_tensor"). The user's dynamic per-channel config runs.
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "build"), [("dynamo", _x86), ("onnx", _x86), ("executorch", _xnnpack_dynamic)],
                         ids=["dynamo-x86inductor", "onnx-x86inductor", "executorch-xnnpack-dynamic"])
def test_a_users_pt2e_quantizer_runs_in_each_runtime(fmt, build):
    from hfexport.quantization import PT2EQuantizer

    require_backend(fmt)
    model = _model()
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    config.quantizer = PT2EQuantizer(build(), calibration=CALIBRATION)
    artifact = AutoHfExporter.from_config(config).export(model, CALIBRATION[0], config=config)
    record = record_of(artifact)
    quantization = record.details["quantization"]
    assert quantization["scheme"] == "custom" and quantization["calibrated_on"] == "calibration="
    if fmt != "executorch":  # XNNPACK's delegate holds the quantized linears
        assert quantization["quantized_matmuls"] >= 14, quantization  # 2 layers x 7 projections
    for cosine in held_out_cosines(artifact, model):
        assert cosine >= 0.98, cosine


def test_openvino_refuses_a_pt2e_quantizer_object_before_tracing():
    from hfexport.quantization import PT2EQuantizer

    quantizer = PT2EQuantizer(_x86())
    with pytest.raises(QuantizationError, match="NNCFQuantizer"):
        quantizer.check("openvino")
    quantizer.check("onnx")  # no error


def test_a_pt2e_quantizer_takes_a_quantizer_object_or_a_scheme_name():
    from hfexport.quantization import PT2EQuantizer

    with pytest.raises(TypeError, match="torchao PT2E Quantizer"):
        PT2EQuantizer(object())
    quantizer = PT2EQuantizer(_x86())
    assert quantizer.to_dict()["pt2e_quantizer"] == "X86InductorQuantizer"
    assert quantizer.to_dict()["calibrated_on"] == "the export sample (1 input)"
    with pytest.raises(ValueError, match="cannot be rebuilt from a config file"):
        AutoExportConfig.from_dict({"export_format": "onnx", "quantizer": quantizer.to_dict()})


def test_hfexport_quantizers_is_hfexport_quantization():
    import hfexport.quantization
    import hfexport.quantizers
    from hfexport.quantizers import NNCFQuantizer

    assert hfexport.quantizers is hfexport.quantization
    assert NNCFQuantizer is hfexport.quantization.NNCFQuantizer
