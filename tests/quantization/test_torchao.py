"""`TorchaoQuantizer` (8da4w: int8 dynamic activations, int4 grouped weights) on ExecuTorch.

One saved export of the tiny Llama's static-cache decode graph (module-scoped: an ExecuTorch
lowering takes ~100 s here) is run through `GenerationRunner` from its folder, as `hfexport
generate` does. int4 is lossy, so the bars are against fp32 eager, measured on this model
(torchao 0.17, executorch 1.4.1, 2026-12-01): first-step logits cosine >= 0.97 (measured 0.995),
greedy tokens agreeing with `generate` on >= 60% of 20 steps (a random tiny model has near-tied
logits; measured 100%)."""

from __future__ import annotations

import json

import pytest
import torch

from hfexport import AutoExportConfig, GenerationRunner
from hfexport.errors import QuantizationError
from hfexport.quantization import CLI_SCHEMES, TorchaoQuantizer, quantizer_for
from tests.harness import require_backend

NEW_TOKENS = 20
MAX_CACHE_LEN = 32


@pytest.fixture(scope="module")
def saved_8da4w(tmp_path_factory):
    """The tiny Llama's multi-token decode graph, 8da4w-quantized, saved; with its eager model."""
    from hfexport.job import export_to_folder
    from hfexport.presets import build_preset
    from transformers import GenerationConfig

    require_backend("executorch")
    pytest.importorskip("torchao")
    model, inputs = build_preset("llama")
    config = AutoExportConfig.from_dict({"export_format": "executorch", "dynamic": True,
                                         "quantizer": {"quantizer": "torchao", "scheme": "int8-dynamic-int4-weights"}})
    directory = tmp_path_factory.mktemp("et-8da4w") / "export"
    export_to_folder((model, inputs), config, directory, generate=True, static_cache=MAX_CACHE_LEN, validate=False)
    return directory, model, inputs, GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)


@pytest.mark.slow
def test_8da4w_decode_follows_fp32_generate(saved_8da4w):
    directory, model, inputs, generation_config = saved_8da4w
    result = GenerationRunner.load(directory).generate(inputs["input_ids"], max_new_tokens=NEW_TOKENS,
                                                       min_new_tokens=NEW_TOKENS, output_logits=True,
                                                       attention_mask=inputs["attention_mask"])
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                              generation_config=generation_config, output_logits=True, return_dict_in_generate=True)
    tokens = want.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    cosine = torch.nn.functional.cosine_similarity(result.logits[0].flatten().double(),
                                                   want.logits[0].flatten().double(), dim=0)
    assert cosine >= 0.97, f"first-step logits cosine {float(cosine):.4f}"
    agreement = sum(a == b for a, b in zip(result.tokens, tokens)) / NEW_TOKENS
    assert agreement >= 0.6, f"{result.tokens} vs generate {tokens}"


@pytest.mark.slow
def test_8da4w_linears_run_in_xnnpack(saved_8da4w):
    """Every linear (7 per layer x 2, and the lm_head) is quantized and taken by the delegate."""
    report = json.loads((saved_8da4w[0] / "report.json").read_text())
    quantization = report["components"]["decode"]["record"]["quantization"]
    assert quantization["delegated_quantized_matmuls"] == 15 and quantization["scheme"] == "int8-dynamic-int4-weights"


def test_the_scheme_is_on_the_executorch_cli_and_round_trips_json():
    quantizer = quantizer_for("executorch", "int8-dynamic-int4-weights")
    assert isinstance(quantizer, TorchaoQuantizer) and "int8-dynamic-int4-weights" in CLI_SCHEMES["executorch"]
    config = AutoExportConfig.from_dict({"export_format": "executorch"})
    config.quantizer = TorchaoQuantizer("int8-dynamic-int4-weights", group_size=64, embedding_bits=8)
    again = AutoExportConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again.quantizer.to_dict() == {"quantizer": "torchao", "scheme": "int8-dynamic-int4-weights",
                                         "group_size": 64, "embedding_bits": 8}


@pytest.mark.parametrize(("options", "message"), [
    ({"group_size": 24}, "power of two"), ({"group_size": 8}, "power of two"),
    ({"embedding_bits": 2}, "4, 8 or None"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        TorchaoQuantizer("int8-dynamic-int4-weights", **options)


def test_other_formats_are_refused_before_tracing():
    with pytest.raises(QuantizationError, match="does not work with the onnx exporter"):
        TorchaoQuantizer("int8-dynamic-int4-weights").check("onnx")


def test_a_layer_off_the_group_size_is_quantized_per_channel_and_recorded():
    """In features 48 with groups of 32: one int4 scale per row, named in `details()`."""
    pytest.importorskip("torchao")

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 48), torch.nn.Linear(48, 8)

        def forward(self, x):
            return self.b(self.a(x))

    torch.manual_seed(0)
    model, x = Two().eval(), torch.randn(3, 64)
    module = torch.export.export(model, (x,)).module()
    quantizer = TorchaoQuantizer("int8-dynamic-int4-weights")
    quantized = quantizer.quantize_program(module, [])
    assert quantizer.details() == {"per_channel": ["b.weight"], "group_size": 32}
    assert type(quantized.a.weight).__name__ == "IntxUnpackedToInt8Tensor"
    with torch.no_grad():
        got, want = quantized(x), model(x)
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) >= 0.97
