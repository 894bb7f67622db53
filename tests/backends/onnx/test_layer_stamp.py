"""Layer stamping of the ONNX graph (`backends/onnx/layer_stamp.py`): a decoder converted and
optimised as its first three layers, layer 2 stamped for the rest, must be the graph a conversion of
every layer gives (ops, attributes, wiring, every weight's bytes, interface; only the names of folded
constants differ), on drawn variations (model types, layer counts, head dims, kv heads, norms equal
across layers, which the optimizer merges into one initializer, or not), quantized to int4 after,
and the seed's interface (MultiHeadAttention, write counters; its nodes ordered apart).
Where layer 2 cannot stand for a later layer (its merged norm differs there), or the stamp fails, the
whole program is converted and the record says why. The CLI's LLM package of a stamped decoder
(validation, onnxruntime-genai in a new process) is in `tests/capture/test_stamp.py`."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from hfexport import OnnxConfig, OnnxExporter, record_of  # noqa: E402
from tests.harness import onnx_graph, tiny_decoder  # noqa: E402

#: drawn once: (model type, layers, head dim, kv heads, random norms: equal norms across layers are
#: merged by the optimizer into one initializer, which the copies share only where theirs are equal)
_DRAW = random.Random(5371)
VARIATIONS = [(_DRAW.choice(["llama", "phi3", "qwen2", "qwen3", "mistral"]), _DRAW.randint(4, 6),
               _DRAW.choice([8, 16]), _DRAW.choice([1, 2, 4]), _DRAW.choice([True, False])) for _ in range(2)]


class WholeConversion(OnnxExporter):
    """The ONNX exporter converting every layer (stamping off)."""

    stamp_layers = False


def _decode(exporter, model, inputs, validate: bool):
    from transformers import GenerationConfig

    config = OnnxConfig(dynamic=True, validate=validate, group_query_attention=True)
    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=32)
    return exporter.export_for_generation(model, inputs, config, generation_config=generation_config)["decode"]


def _model(model_type: str, layers: int, head_dim: int, kv_heads: int, random_norms: bool):
    model, inputs = tiny_decoder(model_type, layers, head_dim=head_dim, kv_heads=kv_heads, seed=layers)
    if random_norms:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "norm" in name:
                    parameter.normal_(1.0, 0.3)
    return model, inputs


@pytest.mark.slow
@pytest.mark.parametrize("variation", VARIATIONS, ids=str)
def test_a_stamped_graph_is_the_graph_of_every_layer_converted(variation):
    model_type, layers, head_dim, kv_heads, random_norms = variation
    model, inputs = _model(*variation)
    stamped = _decode(OnnxExporter(), model, inputs, validate=True)  # against eager, in ONNX Runtime
    whole = _decode(WholeConversion(), model, inputs, validate=False)
    entry = record_of(stamped).details["layer_stamping"]
    assert "stamped in the ONNX graph from layer 2" in entry["onnx"], entry
    assert onnx_graph(stamped, constant_names=False) == onnx_graph(whole, constant_names=False), variation
    assert record_of(stamped).details["ort_fusions"]["fused"]["GroupQueryAttention"] == layers
    assert record_of(stamped).input_names == record_of(whole).input_names
    assert record_of(stamped).details["in_place_cache"] == record_of(whole).details["in_place_cache"]


@pytest.mark.slow
def test_a_merged_weight_that_differs_in_a_later_layer_is_converted_whole():
    """Layers 0-2's norms are equal (the optimizer serves them from one initializer), layer 4's post
    norm is not: the copies cannot share it, so the whole program is converted, and it validates."""
    model, inputs = _model("llama", 5, 8, 2, random_norms=False)
    with torch.no_grad():
        model.model.layers[4].post_attention_layernorm.weight.normal_(1.0, 0.3)
    stamped = _decode(OnnxExporter(), model, inputs, validate=True)
    entry = record_of(stamped).details["layer_stamping"]
    assert entry["onnx"].startswith("not stamped, the whole program converted: layer 4's"), entry
    assert "stamped" in entry  # the capture still stamped its FX program
    whole = _decode(WholeConversion(), model, inputs, validate=False)
    assert onnx_graph(stamped) == onnx_graph(whole)


@pytest.mark.slow
def test_a_quantizer_of_the_converted_graph_quantizes_the_stamped_layers():
    """ONNX Runtime's int4 weight-only quantizer runs on the converted graph, so the capture and the
    graph are stamped as without it; every layer's MatMuls come out quantized, the same graph and
    packed weights as the whole conversion's."""
    from transformers import GenerationConfig

    from hfexport.quantization import OrtQuantizer

    model, inputs = _model("qwen2", 4, 8, 2, random_norms=True)
    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=32)

    def decode(exporter):
        config = OnnxConfig(dynamic=True, validate=False, group_query_attention=True,
                            quantizer=OrtQuantizer("int4-weights", block_size=16))
        return exporter.export_for_generation(model, inputs, config, generation_config=generation_config)["decode"]

    stamped, whole = decode(OnnxExporter()), decode(WholeConversion())
    entry = record_of(stamped).details["layer_stamping"]
    assert entry["stamped"].startswith("layers 2-3") and entry["onnx"].startswith("layer 3 stamped"), entry
    assert onnx_graph(stamped, constant_names=False) == onnx_graph(whole, constant_names=False)
    ops = [node.op_type for node in stamped.model_proto.graph.node]
    # q, k, v (head dim 8: the rotary outside GroupQueryAttention), o, gate, up, down a layer, and the head
    assert ops.count("MatMulNBits") == 4 * 7 + 1


@pytest.mark.slow
def test_a_stamp_that_fails_converts_the_whole_program(monkeypatch, caplog):
    """A bug in the graph stamp (any error but `NotStampable`) costs the whole conversion's time, not
    the export: the record says it failed and asks for a report, and the export validates."""
    from hfexport.backends.onnx import exporter

    def broken(*args, **kwargs):
        raise RuntimeError("a copy read the wrong value")

    monkeypatch.setattr(exporter, "stamp_graph", broken)
    model, inputs = _model("llama", 4, 8, 2, random_norms=True)
    with caplog.at_level("WARNING", logger="hfexport"):
        decode = _decode(OnnxExporter(), model, inputs, validate=True)
    entry = record_of(decode).details["layer_stamping"]
    assert entry["onnx"].startswith("not stamped, the whole program converted: the stamp failed (RuntimeError"), entry
    assert "please report it" in caplog.text
    assert record_of(decode).details["ort_fusions"]["fused"]["GroupQueryAttention"] == 4


@pytest.mark.slow
def test_the_seed_interface_decode_with_write_counters_is_stamped_too():
    """`export_for_generation`'s default decode (MultiHeadAttention, the cache written by scatter, a
    write counter a layer: the seed's interface) stamps its later layers too, their counters' scalar
    outputs included; the graph holds the whole conversion's ops, weights and interface (a counter's
    increment sits elsewhere among its layer's nodes), and validates against eager."""
    from collections import Counter

    from transformers import GenerationConfig

    model, inputs = _model("llama", 5, 16, 2, random_norms=True)
    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=32)

    def decode(exporter, validate):
        config = OnnxConfig(dynamic=True, validate=validate)
        return exporter.export_for_generation(model, inputs, config, generation_config=generation_config)["decode"]

    stamped, whole = decode(OnnxExporter(), True), decode(WholeConversion(), False)
    assert record_of(stamped).details["layer_stamping"]["onnx"].startswith("layers 3-4 stamped")
    assert "MultiHeadAttention" in record_of(stamped).details["ort_fusions"]["fused"]
    mine, theirs = onnx_graph(stamped, constant_names=False), onnx_graph(whole, constant_names=False)
    for key in ("initializers", "inputs", "outputs", "opsets"):
        assert mine[key] == theirs[key], key
    assert Counter(str(op[:3]) for op in mine["ops"]) == Counter(str(op[:3]) for op in theirs["ops"])
    assert record_of(stamped).details["in_place_cache"] == record_of(whole).details["in_place_cache"]
