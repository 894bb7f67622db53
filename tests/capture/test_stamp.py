"""Layer stamping (`capture/stamp.py`): a decoder's layers traced two at a time and layer 1 stamped
for the rest must give the program a trace of the whole model gives. Checked on the ONNX graph
(ops, wiring, weights, interface: the same as with stamping off), on the program itself (the
Dynamo export of a stamped capture, validated against eager), through the CLI (the LLM package of
a 4-layer Llama, Qwen3 and Mistral, validation and the runner check on), and on drawn variations (model types, layer
counts, head dims, kv heads). Where a model's layers may differ, the
whole model is traced and the record says why."""

from __future__ import annotations

import json
import random

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from hfexport import DynamoConfig, DynamoExporter, ExportConfig, OnnxConfig, OnnxExporter, record_of  # noqa: E402
from hfexport.capture.stamp import LayerStack, NotStampable, shallow, stamp, stampable  # noqa: E402
from hfexport.capture.trace import capture  # noqa: E402
from hfexport.presets import build_preset  # noqa: E402
from tests.harness import onnx_graph, tiny_decoder  # noqa: E402

#: drawn once: (model type, layers, head dim, kv heads, static cache: the LLM package's decode; a
#: dynamic cache's layers each read their own cache's length through shape arithmetic the trace
#: shares, which the stamp's node-for-node check refuses: traced whole, the record says why)
_DRAW = random.Random(5347)
VARIATIONS = [(_DRAW.choice(["llama", "phi3", "qwen2", "qwen3", "mistral"]), _DRAW.randint(3, 5), _DRAW.choice([8, 16]),
               _DRAW.choice([1, 2, 4]), True)]


class WholeTrace(OnnxExporter):
    """The ONNX exporter tracing every layer (stamping off)."""

    stamp_layers = False


class WholeDynamo(DynamoExporter):
    """The Dynamo exporter tracing every layer."""

    stamp_layers = False


def _model(model_type: str, layers: int, head_dim: int = 8, kv_heads: int = 2, **extra):
    """A tiny decoder of `model_type` with `layers` layers, and a 5-token prompt."""
    return tiny_decoder(model_type, layers, head_dim=head_dim, kv_heads=kv_heads, **extra)


def _decode(exporter, model, inputs, static: bool, validate: bool):
    from transformers import GenerationConfig

    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=32) if static else None
    config = OnnxConfig(dynamic=True, validate=validate, group_query_attention=True if static else None)
    return exporter.export_for_generation(model, inputs, config, generation_config=generation_config)["decode"]


@pytest.mark.slow
@pytest.mark.parametrize("variation", VARIATIONS, ids=str)
def test_a_stamped_decode_is_the_graph_of_the_whole_trace(variation):
    model_type, layers, head_dim, kv_heads, static = variation
    model, inputs = _model(model_type, layers, head_dim, kv_heads)
    stamped = _decode(OnnxExporter(), model, inputs, static, validate=True)  # run against eager in ORT
    whole = _decode(WholeTrace(), model, inputs, static, validate=False)
    details = record_of(stamped).details
    assert "layer_stamping" not in record_of(whole).details
    # the same graph, but for the names of folded constants (the stamped layers' are named for them)
    assert onnx_graph(stamped, constant_names=False) == onnx_graph(whole, constant_names=False), variation
    assert static and "stamped" in details["layer_stamping"], details["layer_stamping"]
    if layers > 3:  # converted and optimised as three layers, the fourth on stamped in the graph (`layer_stamp.py`)
        assert details["layer_stamping"]["onnx"].startswith("layer"), details["layer_stamping"]
        assert "stamped in the ONNX graph" in details["layer_stamping"]["onnx"]
    assert details["ort_fusions"]["fused"]["GroupQueryAttention"] == layers


def test_the_stamped_program_runs_as_the_whole_model():
    """The Dynamo program of a stamped capture (the Dynamo exporter stamps too): every layer's
    weights in its state dict, each layer's cache written, its outputs equal to eager's
    (validation), node for node the whole trace, and retraced as it."""
    from transformers import GenerationConfig

    model, inputs = _model("llama", 4)
    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=32)
    config = DynamoConfig(dynamic=True, validate=True)
    program = DynamoExporter().export_for_generation(model, inputs, config, generation_config=generation_config)["decode"]
    whole = WholeDynamo().export_for_generation(model, inputs, DynamoConfig(dynamic=True, validate=False),
                                                   generation_config=generation_config)["decode"]
    assert "stamped" in record_of(program).details["layer_stamping"]
    assert {f"model.model.layers.{i}.mlp.down_proj.weight" for i in range(4)} <= set(program.state_dict)
    assert program.state_dict["model.model.layers.3.mlp.down_proj.weight"] is model.model.layers[3].mlp.down_proj.weight
    assert len(program.graph_signature.user_inputs_to_mutate) == len(whole.graph_signature.user_inputs_to_mutate)
    assert [n.target for n in program.graph.nodes] == [n.target for n in whole.graph.nodes]
    assert record_of(program).input_names == record_of(whole).input_names
    # a retrace (ExecuTorch's to_edge, torch.onnx's decomposition) takes it as the whole trace: each
    # stamped input a fake tensor of its own, not one aliased with layer 1's
    assert [n.target for n in program.run_decompositions({}).graph.nodes] == [
        n.target for n in whole.run_decompositions({}).graph.nodes]
    # the same shapes; each stamped layer's cache length is layer 1's symbol (a whole trace gives
    # each its own, every valid call sizes them alike: `names.py`'s note)
    assert [[d if isinstance(d, int) else "sym" for d in shape] for shape in record_of(program).input_shapes] == [
        [d if isinstance(d, int) else "sym" for d in shape] for shape in record_of(whole).input_shapes]


@pytest.mark.parametrize("preset, weight_format", [("llama", None), ("qwen3", None), ("mistral", None), ("llama", "int4")])
def test_the_cli_package_of_a_stamped_decoder_passes_its_checks(tmp_path, preset, weight_format, capsys):
    """`hfexport export FOLDER -f onnx [--weight-format int4]`: the LLM package of a 4-layer decoder
    (Qwen3's q/k norms, Mistral's sliding window among them), validated against eager (int4: the
    accuracy gate) and run in onnxruntime-genai (the runner check), says its layers were stamped."""
    from hfexport.cli.main import main
    from tests.harness import genai_tokens_in_a_new_process, tiny_bpe_tokenizer

    model, _ = build_preset(preset, num_hidden_layers=4, vocab_size=320)
    model.save_pretrained(tmp_path / "model")
    tiny_bpe_tokenizer().save_pretrained(tmp_path / "model")
    quantize = ["--weight-format", weight_format] if weight_format else []
    assert main(["export", str(tmp_path / "model"), "-f", "onnx", "-o", str(tmp_path / "out"), "--quiet", *quantize]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    decode = report["components"]["decode"]
    assert decode["record"]["layer_stamping"]["stamped"].startswith("layers 2-3 of model.model.layers")
    assert decode["record"]["layer_stamping"]["onnx"].startswith("layer 3 stamped in the ONNX graph")
    assert decode["validation"]["passed"] is True
    assert report["runner"]["passed"] is True
    # the folder as its runtime's docs run it: onnxruntime-genai in a fresh process
    prompt = [5, 17, 42, 9, 33]
    og = genai_tokens_in_a_new_process(tmp_path / "out", prompt, 8)
    if weight_format is None:  # eager's tokens
        assert report["runner"]["tokens_equal"] is True
        with torch.no_grad():
            eager = model.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
        assert og == eager[0, len(prompt):].tolist()
    else:  # int4: the gate held it to fp32 eager; og's tokens are hfexport's own loop's on the same graph
        assert report["accuracy"]["passed"] is True
        assert decode["record"]["quantization"]["stage"] == "model"
        capsys.readouterr()
        assert main(["generate", str(tmp_path / "out"), "--prompt-ids", ",".join(map(str, prompt)),
                     "--max-new-tokens", "8", "--engine", "hfexport", "--json"]) == 0
        assert og == json.loads(capsys.readouterr().out)["tokens"]


def test_layers_that_may_differ_are_traced_whole():
    from transformers import DynamicCache, StaticCache

    llama, _ = _model("llama", 3)
    ids = torch.ones(1, 1, dtype=torch.long)
    static = {"input_ids": ids, "past_key_values": StaticCache(config=llama.config, max_cache_len=8)}
    assert stampable(llama, ExportConfig(), static)[0] is not None
    # a quantizer of the converted model leaves the capture as it is; one of the traced program annotates it
    from hfexport.quantization import OrtQuantizer, PT2EQuantizer

    assert stampable(llama, OnnxConfig(quantizer=OrtQuantizer("int4-weights")), static, "onnx")[0] is not None
    pt2e = OnnxConfig(quantizer=PT2EQuantizer("int8-dynamic"))
    assert "a quantizer annotates" in stampable(llama, pt2e, static, "onnx")[1]
    assert "a quantizer annotates" in stampable(llama, OnnxConfig(quantizer=OrtQuantizer("int4-weights")), static)[1]
    dynamic = {"input_ids": ids, "past_key_values": DynamicCache(config=llama.config)}
    assert "a dynamic cache" in stampable(llama, ExportConfig(), dynamic)[1]
    assert "no cache among the inputs" in stampable(llama, ExportConfig(), {"input_ids": ids})[1]
    two, _ = _model("llama", 2)
    assert "2 layers" in stampable(two, ExportConfig(), static)[1]
    mixed, _ = _model("qwen2", 4, use_sliding_window=True, sliding_window=4, max_window_layers=2)
    assert "kinds" in stampable(mixed, ExportConfig(), static)[1]
    gpt2, _ = build_preset("gpt2", n_layer=3)
    assert "model type 'gpt2'" in stampable(gpt2, ExportConfig(), static)[1]
    hidden, _ = _model("llama", 3, output_hidden_states=True)
    assert "output_hidden_states asked" in stampable(hidden, ExportConfig(), static)[1]
    llama.model.layers[2].self_attn.scaling = 0.5  # an attribute one layer computes apart
    assert "layer 2 differs" in stampable(llama, ExportConfig(), static)[1]
    hooked, _ = _model("llama", 3)
    hooked.model.layers[1].register_forward_pre_hook(lambda module, args: None)
    assert "layer 1 differs" in stampable(hooked, ExportConfig(), static)[1]


def test_the_record_says_why_a_capture_was_not_stamped():
    model, inputs = _model("llama", 3)
    captured = capture(model, inputs, ExportConfig(dynamic=True), backend="dynamo", stamp_layers=True)
    assert captured.layer_stamping["not_stamped"].startswith("no cache among the inputs")


def test_two_layers_that_trace_apart_are_not_stamped():
    """The stamp checks layer 1's nodes against layer 0's, argument for argument: a layer whose
    attention scales apart (what the attribute check would have refused) fails it."""
    model, inputs = _model("llama", 3)
    stack = LayerStack("model.layers", model.model.layers)
    model.model.layers[1].self_attn.scaling = 0.5
    program = capture(shallow(model, stack), inputs, ExportConfig(dynamic=True), backend="dynamo").program
    with pytest.raises(NotStampable, match="layer 1's .* is not layer 0's"):
        stamp(program, model, stack)


def test_a_stamp_that_fails_falls_back_to_the_whole_trace(monkeypatch, caplog):
    """A bug in the stamp costs the whole trace's time, not the export: the program is the whole
    trace's, validated against eager, and the record and a warning say what failed."""
    import hfexport.capture.stamp as stamp_module
    from transformers import GenerationConfig

    def broken(program, model, stack):
        raise KeyError("a node the stamp did not expect")

    monkeypatch.setattr(stamp_module, "stamp", broken)
    model, inputs = _model("llama", 3)
    program = DynamoExporter().export_for_generation(
        model, inputs, DynamoConfig(dynamic=True, validate=True),
        generation_config=GenerationConfig(cache_implementation="static", max_cache_len=32))["decode"]
    why = record_of(program).details["layer_stamping"]["not_stamped"]
    assert why.startswith("the stamp failed (KeyError") and "please report it" in why
    assert "model.model.layers.2.mlp.down_proj.weight" in program.state_dict
    assert "the stamp failed" in caplog.text
