"""The ONNX static-cache decode graph: ORT fusions recorded, the cache written in place by
GroupQueryAttention, kept in ONNX Runtime's bound buffers between steps, int4 `MatMulNBits` after
fusion; each checked against eager `generate` or the base cache session."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

from hfexport import GenerationRunner, OnnxConfig, OnnxExporter, record_of  # noqa: E402
from hfexport.generation.loop import DecodeState  # noqa: E402
from hfexport.runner import CacheSession, runner_for  # noqa: E402

pytestmark = pytest.mark.slow

NEW_TOKENS = 24


def _ops(proto) -> list[str]:
    return [node.op_type for node in proto.graph.node]


def _details(directory) -> dict:
    """The decode component's record details, as the export's `report.json` holds them."""
    return json.loads((directory / "report.json").read_text())["components"]["decode"]["record"]


@pytest.fixture(scope="module")
def static_llama(saved_generation):
    """The static-cache Llama (multi-token decode) saved to ONNX, with its runner."""
    saved = saved_generation("onnx", "llama-static")
    return saved, GenerationRunner.load(saved.directory, engine="hfexport")  # its components, driven by the loop


def test_the_decode_graph_is_fused_and_says_what_did_not_fuse(static_llama):
    saved, _ = static_llama
    details = _details(saved.directory)["ort_fusions"]
    # 2 layers, 5 RMSNorms: the first alone, the 4 others each after a residual add
    assert details["fused"]["SimplifiedLayerNormalization"] == 1
    assert details["fused"]["SkipSimplifiedLayerNormalization"] == 4
    assert details["fused"]["GroupQueryAttention"] == 2 and "MultiHeadAttention" not in details["fused"]
    gqa = details["group_query_attention"]
    assert gqa["layers"] == 2 and gqa["packed_qkv"] == 0
    # the preset's head size is 8: ONNX Runtime's GQA rotates multiples of 16 only, so the rotary stays outside
    assert gqa["rotary"].startswith("kept outside") and "multiples of 16" in gqa["rotary"]
    assert not details["not_fused"]


def test_the_cache_is_written_by_group_query_attention_into_the_cache_input(static_llama):
    import onnx

    saved, _ = static_llama
    proto = onnx.load(saved.directory / "decode.onnx")
    ops = _ops(proto)
    assert ops.count("GroupQueryAttention") == 2 and "ScatterElements" not in ops and "ScatterND" not in ops
    writers = {output: node for node in proto.graph.node for output in node.output}
    node = writers["output.cache.0.keys"]
    assert node.op_type == "GroupQueryAttention" and node.input[3] == "input.cache.0.keys"
    assert writers["output.cache.0.values"] is node and node.input[4] == "input.cache.0.values"
    inputs = {i.name: i for i in proto.graph.input}
    mask = inputs["attention_mask"].type.tensor_type
    assert mask.elem_type == onnx.TensorProto.INT64 and len(mask.shape.dim) == 2  # genai's [batch, past + new]
    assert not any(name.endswith("cumulative_length") for name in inputs)  # GQA counts from the mask


def test_the_cache_stays_in_bound_buffers_and_tokens_equal_generate(static_llama):
    saved, runner = static_llama
    got = runner.generate(saved.inputs["input_ids"], max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                          eos_token_id=None)
    want, _ = saved.eager(NEW_TOKENS)
    assert got.tokens == want


def test_the_bound_cache_equals_the_base_sessions_after_the_same_steps(static_llama):
    saved, runner = static_llama
    decode = runner.runners["decode"]

    def after_steps(make_session):
        decode.cache_session = make_session
        try:
            state = DecodeState(runner, saved.inputs["input_ids"], None, {})
            ids = saved.inputs["input_ids"]
            for _ in range(6):
                ids = state.step(ids)[:, -1:].argmax(-1)
        finally:
            del decode.cache_session  # back to the class's
        return state.session[1]

    base = after_steps(lambda cache: CacheSession(decode, cache))
    bound = after_steps(type(decode).cache_session.__get__(decode))
    assert bound.in_place and bound.reason is None
    # the key/value buffers are aliased; the write counters, no longer in the graph, are counted by the session
    assert not bound.copied
    want, have = base.cache(), bound.cache()
    assert want.keys() == have.keys()
    for name in want:
        assert torch.equal(want[name], have[name]), name


def test_fusions_off_keeps_standard_onnx_ops():
    from hfexport.presets import build_preset

    model, inputs = build_preset("llama")
    program = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True, ort_fusions=False))
    record = record_of(program)
    assert "ort_fusions" not in record.details
    assert all(node.domain in ("", "ai.onnx") for node in program.model_proto.graph.node)
    got = runner_for(program, record).run(record.artifact_inputs(inputs))[0]
    with torch.no_grad():
        assert torch.allclose(got, model(**inputs).logits, atol=1e-4)


def test_int4_after_fusion_is_matmul_nbits_and_close_to_fp32_eager(tmp_path):
    """int4 weights on the fused static-cache decode graph: every projection and the LM head a
    `MatMulNBits`, and the prompt's next-token logits (the multi-token decode call on the empty
    cache) close to fp32 eager `generate`'s: cosine >= 0.97, a lossy scheme."""
    from transformers import GenerationConfig

    from hfexport.job.export import GenerationOptions, JudgingOptions, export_to_folder
    from hfexport.presets import build_preset
    from hfexport.quantization import OrtQuantizer

    model, inputs = build_preset("llama")
    config = OnnxConfig(dynamic=True, quantizer=OrtQuantizer("int4-weights"))
    export_to_folder((model, inputs), config, tmp_path / "q",
                     generation=GenerationOptions(generate=True, static_cache=32),
                     judging=JudgingOptions(validate=False))
    runner = GenerationRunner.load(tmp_path / "q")
    details = _details(tmp_path / "q")
    assert details["ort_fusions"]["fused"]["GroupQueryAttention"] == 2
    assert details["quantization"]["quantized_matmuls"] == 15 and details["quantization"]["float_matmuls"] == 0
    got = runner.generate(inputs["input_ids"], max_new_tokens=8, min_new_tokens=8, eos_token_id=None, output_logits=True)
    with torch.no_grad():
        eager = model.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False, output_logits=True,
                               return_dict_in_generate=True,
                               generation_config=GenerationConfig(cache_implementation="static", max_cache_len=32))
    first = torch.nn.functional.cosine_similarity(got.logits[0].flatten(), eager.logits[0].flatten(), dim=0)
    assert first >= 0.97, float(first)


@pytest.mark.parametrize("asked", [None, False])
def test_the_seed_api_keeps_multi_head_attention_and_the_seeds_mask(asked):
    """Through the seed's `export_for_generation` (`group_query_attention=None`, the default) or
    with `group_query_attention=False`: the static decode keeps MultiHeadAttention, the
    scatter-written cache and the seed's interface (4-D boolean mask, write counters) that the
    seed's ONNX Runtime loop feeds; an export folder (the fixture above) has GroupQueryAttention."""
    from transformers import GenerationConfig

    from hfexport.presets import build_preset

    model, inputs = build_preset("llama")
    config = OnnxConfig(dynamic=True, group_query_attention=asked)
    decode = OnnxExporter().export_for_generation(
        model, inputs, config=config, multi_token_decode=True,
        generation_config=GenerationConfig(cache_implementation="static", max_cache_len=32))["decode"]
    details = record_of(decode).details
    assert details["ort_fusions"]["fused"]["MultiHeadAttention"] == 2
    assert details["ort_fusions"]["group_query_attention"]["kept"].startswith("not asked")
    assert "graph_interface" not in details
    graph = decode.model_proto.graph
    mask = next(i for i in graph.input if i.name == "attention_mask").type.tensor_type
    assert len(mask.shape.dim) == 4 and "input.cache.0.cumulative_length" in [i.name for i in graph.input]
    assert _ops(decode.model_proto).count("ScatterElements") == 4


#: (model type, layers, head dim, kv heads, prompt length, group_query_attention, config overrides): the
#: three configs that broke (session 34's note; a Qwen2 whose later layers slide), then drawn variations
_DRAW = random.Random(5351)
SEPARATE_PREFILL = [
    ("qwen3", 2, 8, 2, 5, None, {}), ("mistral", 2, 8, 2, 5, True, {}),
    ("qwen2", 3, 8, 2, 7, None, {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
] + [(_DRAW.choice(["qwen2", "qwen3", "mistral"]), _DRAW.randint(2, 3), _DRAW.choice([8, 16]), _DRAW.choice([1, 2, 4]),
      _DRAW.randint(2, 9), _DRAW.choice([None, True]), {}) for _ in range(2)]


@pytest.mark.parametrize("variation", SEPARATE_PREFILL, ids=str)
def test_a_static_prefill_of_a_mask_per_attention_kind_takes_the_mask(tmp_path, variation):
    """The seed's `export_for_generation` with a static cache and a prefill of its own. Qwen2's and
    Qwen3's `generate` passes the prefill `{"full_attention": None}` (SDPA's causal skip): its graph
    took no mask, SDPA's `is_causal` fixed by the sample, and validation's 1-token prefill attended
    every slot of the cache in eager and refused the export; a Qwen2 whose later layers slide was
    passed a 4-D sliding mask beside it, whose head axis the trace kept dynamic (a capture error).
    Mistral's default window (4096, over the 32-slot cache) with GroupQueryAttention asked crashed
    the window check on the decode's 1-row mask.
    Now each component takes the 4-D mask, passes validation (its smallest case among the cases) in
    ONNX Runtime, and the saved folder generates what `generate()` does, in hfexport's runner and
    in the seed's ONNX Runtime loop (`examples/decode_loop_onnxruntime.py`) in a new process."""
    from transformers import GenerationConfig

    from hfexport import FolderContents, save_folder
    from tests.harness import tiny_decoder

    model_type, layers, head_dim, kv_heads, prompt_length, gqa, overrides = variation
    model, inputs = tiny_decoder(model_type, layers, head_dim=head_dim, kv_heads=kv_heads, prompt=prompt_length,
                                 **overrides)
    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=32)
    export_config = OnnxConfig(dynamic=True, validate=True, group_query_attention=gqa)
    exporter = OnnxExporter()
    artifacts = exporter.export_for_generation(model, inputs, export_config, generation_config=generation_config)
    assert set(artifacts) == {"prefill", "decode"}
    for name, artifact in artifacts.items():
        record = record_of(artifact)
        assert "attention_mask" in record.input_names, name
        assert len(record.input_shapes[record.input_names.index("attention_mask")]) == 4, name
        assert record.details["validation"]["passed"], name
    if gqa:
        assert record_of(artifacts["decode"]).details["ort_fusions"]["fused"].get("GroupQueryAttention") == layers
    save_folder(exporter, artifacts, tmp_path / "export",
                FolderContents("generation", model=model, generation_config=generation_config, export_config=export_config))
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                              generation_config=generation_config)[0, prompt_length:].tolist()
    got = GenerationRunner.load(tmp_path / "export", engine="hfexport").generate(
        inputs["input_ids"], max_new_tokens=8, min_new_tokens=8)
    assert list(got.tokens) == want
    # the folder as ONNX Runtime's user runs it: the seed's example loop, prompt through prefill.onnx, in a new process
    loop = Path(__file__).resolve().parents[3] / "examples" / "decode_loop_onnxruntime.py"
    done = subprocess.run([sys.executable, str(loop), str(tmp_path / "export" / "decode.onnx"), "--prefill",
                           str(tmp_path / "export" / "prefill.onnx"), "--max-cache-len", "32", "--max-new-tokens", "8",
                           "--prompt-ids", ",".join(map(str, inputs["input_ids"][0].tolist()))],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == want
