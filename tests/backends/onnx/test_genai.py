"""The ONNX static-cache generation folder as onnxruntime-genai runs it: GroupQueryAttention with the
rotary inside and packed QKV on a shared past/present buffer, `genai_config.json`, and the same
greedy tokens from eager `generate`, `GenerationRunner` and onnxruntime-genai's `Generator`.

The model is a random Llama whose head size, key/value heads and prompt length are drawn
(`HFEXPORT_TEST_SEED`, default 0; the draw is in the fixture's id): head sizes are multiples of
16, the sizes ONNX Runtime's GroupQueryAttention rotates (the presets' 8 keeps the rotary outside,
`test_decode.py`). A random Gemma-3 with a drawn sliding window on one layer checks the window
(GQA's `local_window_size`) the same way, and a random Gemma-2 with a drawn attention softcap on
a sliding and a full layer checks GQA's `softcap` with the window.
"""

from __future__ import annotations

import json
import os
import random

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

from tests.harness import genai_tokens_in_a_new_process  # noqa: E402

pytestmark = pytest.mark.slow

CACHE, NEW_TOKENS = 48, 16
_DRAW = random.Random(int(os.environ.get("HFEXPORT_TEST_SEED", "0")))
HEADS = _DRAW.choice([2, 4])
KV_HEADS = _DRAW.choice([h for h in (1, 2, 4) if HEADS % h == 0])
HEAD_DIM = _DRAW.choice([16, 32, 64])
PROMPT = _DRAW.randint(3, 12)


@pytest.fixture(scope="module", ids=[f"heads{HEADS}-kv{KV_HEADS}-d{HEAD_DIM}-prompt{PROMPT}"], params=[None])
def exported(tmp_path_factory, request):
    """The drawn Llama exported to ONNX (`--generate --static-cache 48`), validated against eager."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hfexport import AutoExportConfig
    from hfexport.job.export import GenerationOptions, export_to_folder

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=HEADS * HEAD_DIM, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    prompt = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(PROMPT))
    folder = tmp_path_factory.mktemp("genai") / "llama"
    export_config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True})
    export_to_folder((model, {"input_ids": prompt}), export_config, folder,
                     generation=GenerationOptions(generate=True, static_cache=CACHE))
    return model, prompt, folder


def _eager_tokens(model, prompt) -> list[int]:
    from transformers import GenerationConfig

    config = GenerationConfig(cache_implementation="static", max_cache_len=CACHE)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             generation_config=config)
    return out[0, prompt.shape[1]:].tolist()


def test_the_graph_is_onnxruntimes_llm_graph(exported):
    """One GroupQueryAttention per layer rotating q/k itself (cos/sin caches as initializers) on
    packed QKV, writing the cache input it reads; genai's 2-D mask, no counters."""
    import onnx

    _, _, folder = exported
    proto = onnx.load(folder / "decode.onnx")
    ops = [node.op_type for node in proto.graph.node]
    attentions = [node for node in proto.graph.node if node.op_type == "GroupQueryAttention"]
    assert len(attentions) == 2 and "MultiHeadAttention" not in ops and "ScatterElements" not in ops
    initializers = {i.name for i in proto.graph.initializer}
    for layer, node in enumerate(attentions):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes["do_rotary"] == 1 and attributes["num_heads"] == HEADS
        assert attributes["kv_num_heads"] == KV_HEADS
        assert node.input[1] == node.input[2] == ""  # packed QKV in the query
        assert node.input[3] == f"input.cache.{layer}.keys" and node.output[1] == f"output.cache.{layer}.keys"
        assert {node.input[7], node.input[8]} <= initializers  # cos/sin caches
    inputs = [i.name for i in proto.graph.input]
    assert inputs[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert not any(name.endswith("cumulative_length") for name in inputs)
    record = json.loads((folder / "report.json").read_text())["components"]["decode"]["record"]
    gqa = record["ort_fusions"]["group_query_attention"]
    assert gqa["rotary"].startswith("inside") and gqa["packed_qkv"] == 2
    assert record["ort_fusions"]["fused"]["SkipSimplifiedLayerNormalization"] == 4


def test_hfexport_generate_gives_eagers_tokens(exported):
    from hfexport import GenerationRunner

    model, prompt, folder = exported
    runner = GenerationRunner.load(folder)
    got = runner.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)  # eos suppressed, as eager
    assert got.tokens == _eager_tokens(model, prompt)


def test_onnxruntime_genai_runs_the_folder_with_eagers_tokens(exported):
    og = pytest.importorskip("onnxruntime_genai", reason="needs onnxruntime-genai: pip install 'hfexport[genai]'")
    model, prompt, folder = exported
    genai_config = json.loads((folder / "genai_config.json").read_text())
    assert genai_config["search"]["past_present_share_buffer"] and genai_config["model"]["context_length"] == CACHE
    assert json.loads((folder / "manifest.json").read_text())["runtime_package"] == {
        "runner": "onnxruntime-genai", "ready": True, "why": None, "settings": {},
        "files": sorted(["genai_config.json", *(p.name for p in folder.glob("decode.onnx*"))])}
    assert _genai_tokens(og, folder, prompt) == _eager_tokens(model, prompt)
    # the export job ran the folder in onnxruntime-genai too, on the drawn heads and prompt (runner_check)
    runner = json.loads((folder / "report.json").read_text())["runner"]
    assert runner["checked"] and runner["tokens_equal"], runner


def test_a_prompt_ending_with_the_pad_token_is_checked_as_onnxruntime_genai_serves_it(exported):
    """og takes a prompt's trailing pad tokens for right padding and masks them, where `generate()`
    attends to them: the export's runner check runs og and eager on the prompt without them (an
    export whose sample prompt ended with its end token, the pad where the model has none, was
    refused); `hfexport generate` runs such a prompt in its own loop (`test_engine.py`)."""
    pytest.importorskip("onnxruntime_genai", reason="needs onnxruntime-genai: pip install 'hfexport[genai]'")
    from transformers import GenerationConfig

    from hfexport.backends.onnx.package import OnnxRuntimePackage
    from hfexport.job.runner_check import runner_check

    model, prompt, folder = exported
    pad = json.loads((folder / "genai_config.json").read_text())["model"]["pad_token_id"]
    assert pad == model.config.pad_token_id
    padded = torch.cat([prompt, torch.full((1, 2), pad)], dim=1)
    config = GenerationConfig.from_model_config(model.config)
    config.cache_implementation, config.max_cache_len = "static", CACHE
    entry = runner_check(OnnxRuntimePackage(None), model, {"input_ids": padded}, config)(folder)["runner"]
    assert entry["passed"] and entry["tokens_equal"] and entry["prompt_ids"] == prompt[0].tolist(), entry


def _genai_tokens(og, folder, prompt) -> list[int]:
    """NEW_TOKENS greedy tokens from onnxruntime-genai's `Generator` on `folder`."""
    genai_model = og.Model(str(folder))
    params = og.GeneratorParams(genai_model)
    length = prompt.shape[1] + NEW_TOKENS
    params.set_search_options(max_length=length, do_sample=False, min_length=length)
    generator = og.Generator(genai_model, params)
    generator.append_tokens(prompt.tolist())
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


WINDOW = _DRAW.randint(3, 8)


@pytest.fixture(scope="module", ids=[f"window{WINDOW}"], params=[None])
def windowed(tmp_path_factory, request):
    """A random Gemma-3 whose first layer attends a drawn sliding window and whose second attends
    everything, exported as `exported` is, with a prompt longer than the window."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from hfexport import AutoExportConfig
    from hfexport.job.export import GenerationOptions, export_to_folder

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                              sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                              bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = Gemma3ForCausalLM(config).eval()
    prompt = torch.randint(3, 128, (1, WINDOW + 4), generator=torch.Generator().manual_seed(WINDOW))
    folder = tmp_path_factory.mktemp("genai") / "gemma3"
    export_config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True})
    export_to_folder((model, {"input_ids": prompt}), export_config, folder,
                     generation=GenerationOptions(generate=True, static_cache=CACHE))
    return model, prompt, folder


def test_a_sliding_window_is_groupqueryattentions_local_window(windowed):
    """The window the graph computed from the mask is the windowed layer's `local_window_size`
    (ONNX Runtime 1.32 attends that many keys, up to the query's own); the full layer's is -1."""
    import onnx

    _, _, folder = windowed
    proto = onnx.load(folder / "decode.onnx")
    windows = [onnx.helper.get_attribute_value(a) for node in proto.graph.node if node.op_type == "GroupQueryAttention"
               for a in node.attribute if a.name == "local_window_size"]
    assert windows == [WINDOW, -1]
    record = json.loads((folder / "report.json").read_text())["components"]["decode"]["record"]
    assert record["ort_fusions"]["group_query_attention"]["local_window_size"] == [WINDOW, -1]


def test_a_sliding_window_generates_eagers_tokens_in_both_runners(windowed):
    """Past the window on every step: `hfexport generate` and onnxruntime-genai give eager's tokens."""
    _both_runners_give_eagers_tokens(*windowed)


SOFTCAP, SOFTCAP_WINDOW, SOFTCAP_SCALAR = _DRAW.choice([0.5, 1.0, 2.0]), _DRAW.randint(3, 8), _DRAW.choice([1, 2, 3])


@pytest.fixture(scope="module", ids=[f"softcap{SOFTCAP}-window{SOFTCAP_WINDOW}-scalar{SOFTCAP_SCALAR}"], params=[None])
def softcapped(tmp_path_factory, request):
    """A random Gemma-2 (attention logits softcapped at a drawn cap, scale `query_pre_attn_scalar ** -0.5`)
    whose first layer attends a drawn sliding window and whose second attends everything, exported as
    `exported` is, with a prompt longer than the window. Its weights are large enough (initializer
    range 0.08, untied embeddings) for the cap to change eager's greedy tokens."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from hfexport import AutoExportConfig
    from hfexport.job.export import GenerationOptions, export_to_folder

    def build(cap):
        torch.manual_seed(0)
        config = Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                              sliding_window=SOFTCAP_WINDOW, layer_types=["sliding_attention", "full_attention"],
                              attn_logit_softcapping=cap, query_pre_attn_scalar=SOFTCAP_SCALAR, initializer_range=0.08,
                              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        return Gemma2ForCausalLM(config).eval()

    model = build(SOFTCAP)
    prompt = torch.randint(3, 128, (1, SOFTCAP_WINDOW + 4), generator=torch.Generator().manual_seed(SOFTCAP_WINDOW))
    assert _eager_tokens(model, prompt) != _eager_tokens(build(None), prompt), "the cap must matter to the tokens"
    folder = tmp_path_factory.mktemp("genai") / "gemma2"
    export_config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True})
    export_to_folder((model, {"input_ids": prompt}), export_config, folder,
                     generation=GenerationOptions(generate=True, static_cache=CACHE))
    return model, prompt, folder


def test_a_softcap_is_groupqueryattentions_softcap(softcapped):
    """Every layer is GroupQueryAttention with the model's cap and scale (ONNX Runtime 1.32 caps
    `scale * q k^T`, `softcap.py`), the sliding layer with its window."""
    import onnx

    _, _, folder = softcapped
    proto = onnx.load(folder / "decode.onnx")
    ops = [node.op_type for node in proto.graph.node]
    assert ops.count("Tanh") == 1  # the final logits' softcap (Gemma-2's final_logit_softcapping), no other
    assert not {"MultiHeadAttention", "Softmax", "ScatterElements"} & set(ops)
    attributes = [{a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                  for node in proto.graph.node if node.op_type == "GroupQueryAttention"]
    assert [a["local_window_size"] for a in attributes] == [SOFTCAP_WINDOW, -1]
    assert [a["softcap"] for a in attributes] == pytest.approx([SOFTCAP] * 2)
    assert [a["scale"] for a in attributes] == pytest.approx([SOFTCAP_SCALAR ** -0.5] * 2, rel=1e-7)
    assert all(a["do_rotary"] == 1 for a in attributes)
    gqa = json.loads((folder / "report.json").read_text())["components"]["decode"]["record"]["ort_fusions"][
        "group_query_attention"]
    assert gqa["layers"] == 2 and gqa["softcap"] == pytest.approx([SOFTCAP] * 2)
    assert gqa["local_window_size"] == [SOFTCAP_WINDOW, -1]


def test_a_softcap_generates_eagers_tokens_in_both_runners(softcapped):
    """Past the window on every step: `hfexport generate` and onnxruntime-genai give eager's tokens."""
    _both_runners_give_eagers_tokens(*softcapped)


def _both_runners_give_eagers_tokens(model, prompt, folder) -> None:
    from hfexport import GenerationRunner

    want = _eager_tokens(model, prompt)
    got = GenerationRunner.load(folder).generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    assert got.tokens == want
    og = pytest.importorskip("onnxruntime_genai", reason="needs onnxruntime-genai: pip install 'hfexport[genai]'")
    assert _genai_tokens(og, folder, prompt) == want


def test_an_int4_export_with_a_tied_head_runs_in_onnxruntime_genai(tmp_path):
    """A tied head whose table is too large for onnxscript to fold its transpose (SmolLM2's case,
    here 32768 x 64) is read through `FusedMatMul`; the int4 export quantizes it (8 bits, the
    record's `tied_head`), passes its own validation, and onnxruntime-genai runs the folder with
    the tokens `hfexport generate` gives."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hfexport import AutoExportConfig, GenerationRunner
    from hfexport.job.export import GenerationOptions, export_to_folder

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32768, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                         max_position_embeddings=256, bos_token_id=1, eos_token_id=2)).eval()
    prompt = torch.randint(3, 32768, (1, 8), generator=torch.Generator().manual_seed(1))
    folder = tmp_path / "export"
    result = export_to_folder((model, {"input_ids": prompt}), AutoExportConfig.from_dict(
        {"export_format": "onnx", "dynamic": True}), folder,
        generation=GenerationOptions(generate=True, static_cache=CACHE), quantize="int4-weights")
    quantization = result.report["components"]["decode"]["record"]["quantization"]
    assert quantization["tied_head"] == {"weights": ["model.lm_head.weight"], "bits": 8}
    assert quantization["float_matmuls"] == 0
    got = GenerationRunner.load(folder).generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    og = pytest.importorskip("onnxruntime_genai", reason="needs onnxruntime-genai: pip install 'hfexport[genai]'")
    assert _genai_tokens(og, folder, prompt) == got.tokens


@pytest.mark.parametrize(("names", "says"), [
    (["encoder", "prefill", "decode"], "this encoder-decoder export has ['decode', 'encoder', 'prefill'], which "
                                       "`hfexport generate` runs"),
    (["prefill", "decode"], "(export with --multi-token-decode --static-cache N)"),
    (["image_encoder", "decode"], "`hfexport generate --image` runs the folder"),
])
def test_why_a_folder_is_not_onnxruntime_genais_names_what_the_export_is(names, says):
    """The manifest's why for a folder og does not open gives advice that fits the model: a
    decoder's components can become og's graph (`--multi-token-decode --static-cache N`), an
    encoder-decoder's (T5, Whisper) or an image-text model's cannot."""
    from hfexport.backends.onnx.genai import genai_status

    assert says in genai_status(dict.fromkeys(names), None)


#: onnxruntime-genai's own Generator on a folder, in a process of its own (no hfexport imported):
#: argv folder, prompt ids as JSON, new tokens; prints the generated ids as JSON
def _cli_package(model, tmp_path_factory):
    """`(model, folder)`: `model` saved as a model folder and exported by the CLI with no task (its
    onnxruntime-genai package), validated and checked by og against eager."""
    from hfexport.cli.main import main

    root = tmp_path_factory.mktemp("genai")
    model.save_pretrained(root / "model")
    assert main(["export", str(root / "model"), "-f", "onnx", "-o", str(root / "out"), "--quiet"]) == 0
    return model, root / "out"


GPT2_HEADS, GPT2_HEAD_DIM, GPT2_PROMPT = _DRAW.choice([2, 4]), _DRAW.choice([16, 32]), _DRAW.randint(3, 12)


@pytest.fixture(scope="module", ids=[f"heads{GPT2_HEADS}-d{GPT2_HEAD_DIM}"], params=[None])
def gpt2_package(tmp_path_factory, request):
    """A random GPT-2 of drawn heads and head size, saved as a model folder and exported by the CLI
    with no task (its onnxruntime-genai package), validated and checked by the runner."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_embd=GPT2_HEADS * GPT2_HEAD_DIM, n_layer=2, n_head=GPT2_HEADS,
                        n_positions=64, bos_token_id=1, eos_token_id=2, initializer_range=0.1)
    return _cli_package(GPT2LMHeadModel(config).eval(), tmp_path_factory)


def test_a_gpt2_conv1d_model_is_onnxruntime_genais_package(gpt2_package):
    """GPT-2 reads its attention's output as `[batch * length, hidden]` (`Conv1D`, a `Gemm`);
    onnxscript's attention fusion (0.7.2) hands that `Gemm` its 3-D output, which ONNX Runtime
    refused, so the flagless export kept the unfused graph and wrote no onnxruntime-genai folder
    (`fusions.fix_mha_flattened_output`). Now the folder is og's, its runner check passed (og's
    tokens equal eager's), and both runners give eager's tokens on a drawn prompt."""
    import onnx

    model, folder = gpt2_package
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["runtime_package"]["ready"], manifest["runtime_package"]
    report = json.loads((folder / "report.json").read_text())
    assert report["runner"]["checked"] and report["runner"]["tokens_equal"], report["runner"]
    ops = [node.op_type for node in onnx.load(folder / "decode.onnx").graph.node]
    assert ops.count("GroupQueryAttention") == 2 and "MultiHeadAttention" not in ops
    prompt = torch.randint(3, 128, (1, GPT2_PROMPT), generator=torch.Generator().manual_seed(GPT2_PROMPT))
    _both_runners_give_eagers_tokens(model, prompt, folder)
    assert genai_tokens_in_a_new_process(folder, prompt[0].tolist(), NEW_TOKENS) == _eager_tokens(model, prompt)


MOE_EXPERTS, MOE_TOP, MOE_PROMPT = _DRAW.choice([4, 8]), _DRAW.choice([1, 2]), _DRAW.randint(3, 12)


@pytest.fixture(scope="module", ids=[f"experts{MOE_EXPERTS}-top{MOE_TOP}"], params=[None])
def moe_package(tmp_path_factory, request):
    """A random Mixtral of drawn experts and experts per token, exported by the CLI with no task."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                           num_local_experts=MOE_EXPERTS, num_experts_per_tok=MOE_TOP, bos_token_id=1,
                           eos_token_id=2, pad_token_id=0)
    return _cli_package(MixtralForCausalLM(config).eval(), tmp_path_factory)


def test_a_mixture_of_experts_is_onnxruntime_genais_package(moe_package):
    """A mixture of experts sizes its token dispatch from the 4-D mask's shape (torch.export names
    the query length after the first input that has it), so the GroupQueryAttention rewrite, which
    drops that mask, was given up ("the 4-D attention_mask is still read") and no og folder was
    written (Mixtral, Qwen3-MoE, OLMoE, Falcon). The size is now read from `input_ids`
    (`gqa._read_sizes_elsewhere`): the folder is og's, its runner check passed, and both runners
    give eager's tokens on a drawn prompt."""
    import onnx

    model, folder = moe_package
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["runtime_package"]["ready"], manifest["runtime_package"]
    assert json.loads((folder / "report.json").read_text())["runner"]["tokens_equal"]
    ops = [node.op_type for node in onnx.load(folder / "decode.onnx").graph.node]
    assert ops.count("GroupQueryAttention") == 2 and "attention_mask__4d" not in {
        value for node in onnx.load(folder / "decode.onnx").graph.node for value in node.input}
    prompt = torch.randint(3, 128, (1, MOE_PROMPT), generator=torch.Generator().manual_seed(MOE_PROMPT))
    _both_runners_give_eagers_tokens(model, prompt, folder)
    assert genai_tokens_in_a_new_process(folder, prompt[0].tolist(), NEW_TOKENS) == _eager_tokens(model, prompt)


@pytest.mark.parametrize(("preset", "why"), [
    ("bloom", "the decode graph has no GroupQueryAttention"),  # ALiBi: no rotary attention to rewrite
    ("qwen3", "the model names no end token"),  # no eos_token_id, no tokenizer: og refuses eos -1
])
def test_a_folder_that_cannot_be_onnxruntime_genais_is_components_that_say_why(preset, why, tmp_path, capsys):
    """Where the ONNX folder cannot be onnxruntime-genai's, the flagless export writes the components
    (`hfexport generate` runs them), the manifest and the report saying why, as a refused package of
    any runtime does (tests/generation/test_llm_package.py). A model naming no end token failed in og
    ("eos_token_id (-1) must be in range", exit 3 asking to report it) before its why was written."""
    from hfexport.cli.main import main

    out = tmp_path / "out"
    assert main(["export", f"tiny:{preset}", "-f", "onnx", "-o", str(out), "--quiet"]) == 0
    entry = json.loads((out / "manifest.json").read_text())["runtime_package"]
    assert entry["runner"] == "onnxruntime-genai" and not entry["ready"] and why in entry["why"], entry
    assert not (out / "genai_config.json").exists()
    report = json.loads((out / "report.json").read_text())
    assert not report["runner"]["checked"] and why in report["runner"]["why"], report["runner"]
