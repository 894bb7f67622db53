"""`TorchaoQuantizer` (8da4w: int8 dynamic activations, int4 grouped weights, by default the LM head
and a fifth of the other linears at int8) on ExecuTorch.

Two saved LLM-runner programs (module-scoped: an ExecuTorch lowering takes ~100 s here): the
preset Llama's and a drawn one's with a tokenizer. They are compared teacher-forced, step by
step: with fp32 eager (int4 is lossy: each step's logits cosine >= 0.97, greedy tokens equal to
`generate`'s on >= 60% of 20 steps; a random tiny model has near-tied logits, which a
free-running comparison reads as garbage once one flips) and with torchao's eager model quantized
by the same rule (cosine >= 0.999); ExecuTorch's own `TextLLMRunner` runs the drawn one in a fresh
process."""

from __future__ import annotations

import json

import pytest
import torch

from hfexport import AutoExportConfig, GenerationRunner
from hfexport.errors import QuantizationError
from hfexport.quantization import CLI_SCHEMES, TorchaoQuantizer, quantizer_for
from tests.harness import both_llm_runners, require_backend, tiny_bpe_tokenizer

NEW_TOKENS = 20
MAX_CACHE_LEN = 32


@pytest.fixture(scope="module")
def saved_8da4w(tmp_path_factory):
    """The tiny Llama's multi-token decode graph, 8da4w-quantized, saved; with its eager model."""
    from hfexport.job.export import GenerationOptions, JudgingOptions, export_to_folder
    from hfexport.presets import build_preset
    from transformers import GenerationConfig

    require_backend("executorch")
    pytest.importorskip("torchao")
    model, inputs = build_preset("llama")
    config = AutoExportConfig.from_dict({"export_format": "executorch", "dynamic": True,
                                         "quantizer": {"quantizer": "torchao", "scheme": "int8-dynamic-int4-weights"}})
    directory = tmp_path_factory.mktemp("et-8da4w") / "export"
    export_to_folder((model, inputs), config, directory,
                     generation=GenerationOptions(generate=True, static_cache=MAX_CACHE_LEN),
                     judging=JudgingOptions(validate=False))
    return directory, model, inputs, GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)


@pytest.mark.slow
def test_8da4w_decode_follows_fp32_generate(saved_8da4w):
    """Teacher-forced on fp32 `generate`'s tokens (a free-running comparison reads any near-tie
    the quantized model flips as garbage at every later step, `test_an_int8_head_flips_...`)."""
    directory, model, inputs, generation_config = saved_8da4w
    ids = inputs["input_ids"][:1]
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                              generation_config=generation_config, output_logits=True, return_dict_in_generate=True)
    tokens = want.sequences[0, ids.shape[1]:].tolist()
    got = GenerationRunner.load(directory).score(ids, tokens)
    cosines = [float(_cosine(g, w[0])) for g, w in zip(got, want.logits)]
    assert min(cosines) >= 0.97, f"steps' logits cosines {cosines}"
    agreement = sum(int(g.argmax()) == t for g, t in zip(got, tokens)) / NEW_TOKENS
    assert agreement >= 0.6, f"{[int(g.argmax()) for g in got]} vs generate {tokens}"


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
                                         "group_size": 64, "embedding_bits": 8, "ratio": 0.8}


@pytest.mark.parametrize(("options", "message"), [
    ({"group_size": 24}, "power of two"), ({"group_size": 8}, "power of two"),
    ({"embedding_bits": 2}, "4, 8 or None"), ({"ratio": 1.5}, "in \\[0, 1\\]"),
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
    quantizer = TorchaoQuantizer("int8-dynamic-int4-weights", ratio=1.0)
    quantized = quantizer.quantize_program(module, [])
    assert quantizer.details() == {"per_channel": ["b.weight"], "group_size": 32}
    assert type(quantized.a.weight).__name__ == "IntxUnpackedToInt8Tensor"
    with torch.no_grad():
        got, want = quantized(x), model(x)
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) >= 0.97


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0)


def _torchao_eager(model: torch.nn.Module, ratio: float = 0.8, group_size: int = 32):
    """`model` with torchao's 8da4w on its linears, each linear's bits chosen by the quantizer's
    own rule (`linear_bits`); and the paths of the 8-bit ones."""
    import copy

    from torchao.quantization import quantize_

    from hfexport.quantization.torchao import linear_bits, linear_config

    eager = copy.deepcopy(model)
    linears = {path: m for path, m in eager.named_modules() if isinstance(m, torch.nn.Linear)}
    embedding_rows = [m.weight.shape[0] for m in eager.modules() if isinstance(m, torch.nn.Embedding)]
    bits = linear_bits({path: m.weight for path, m in linears.items()}, embedding_rows, group_size, ratio)
    for path, linear in linears.items():
        quantize_(linear, linear_config(linear.in_features, bits[path], group_size),
                  filter_fn=lambda module, _, target=linear: module is target)
    return eager, sorted(path for path, b in bits.items() if b == 8)


def test_the_mixed_rule_keeps_the_head_and_the_linears_nncf_ranks_first_at_8_bits():
    """The head (output size = the embedding's rows) is 8-bit; of the others, NNCF's data-free
    pick (the smallest int8 error, the largest row's mean square: here the linear with the
    smallest weights) up to `1 - ratio` of their parameters; `ratio=1.0` is every linear int4.
    `details()` names them with the reason."""
    pytest.importorskip("torchao")

    class Lm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(100, 64)
            self.a, self.b, self.c = (torch.nn.Linear(64, 64, bias=False) for _ in range(3))
            self.head = torch.nn.Linear(64, 100, bias=False)

        def forward(self, ids):
            return self.head(self.c(self.b(self.a(self.embed(ids)))))

    torch.manual_seed(0)
    model = Lm().eval()
    with torch.no_grad():
        model.b.weight *= 0.1
    module = torch.export.export(model, (torch.tensor([[1, 2, 3]]),)).module()
    quantizer = TorchaoQuantizer("int8-dynamic-int4-weights", ratio=0.6)
    quantized = quantizer.quantize_program(module, [])
    int8 = quantizer.details()["int8_weights"]
    assert int8["linears"] == ["b.weight", "head.weight"] and int8["ratio"] == 0.6
    assert "head.weight" in int8["why"] and "33%" in int8["why"]  # b: a third of the body's parameters
    assert [getattr(quantized, n).weight.target_dtype for n in ("a", "b", "head")] == [torch.int4, torch.int8,
                                                                                       torch.int8]
    ids = torch.tensor([[4, 5, 6]])
    with torch.no_grad():
        assert _cosine(quantized(ids), model(ids)) >= 0.99
    assert "int8_weights" not in TorchaoQuantizer("int8-dynamic-int4-weights", ratio=1.0).details()


def test_an_int8_head_flips_a_near_tie_of_the_tiny_llama_which_free_running_comparisons_read_as_garbage():
    """The failure once reported for an int8 LM head on ExecuTorch (the tiny Llama's program
    matched fp32 eager for three steps, cosine -0.35 from the fourth): torchao's own eager model
    with that head picks the other of two near-tied tokens at step 3 (fp32 0.2651 vs 0.2600), so
    fp32 `generate` and the program read different sequences from there. The program itself
    follows torchao's eager model at every teacher-forced step (`test_the_mixed_program_...`)."""
    pytest.importorskip("torchao")
    from hfexport.presets import build_preset

    model, inputs = build_preset("llama")
    sequence = torch.tensor([inputs["input_ids"][0].tolist() + [18, 45]])  # fp32's and the program's first two
    with torch.no_grad():
        fp32 = model(sequence).logits[0, -1]
        mixed = _torchao_eager(model, ratio=0.8)[0](sequence).logits[0, -1]
    assert fp32.topk(2).indices.tolist() == [108, 36] and float(fp32[108] - fp32[36]) < 0.01
    assert int(mixed.argmax()) == 36 and _cosine(mixed, fp32) >= 0.99


@pytest.fixture(scope="module")
def drawn_8da4w(tmp_path_factory):
    """A tiny Llama with drawn key/value heads and head size, its LLM-runner program mixed 8da4w,
    exported with a tokenizer (the folder holds the `tokenizer.json` ExecuTorch's runner reads)."""
    import random

    from hfexport import ExecutorchConfig
    from hfexport.job.export import GenerationOptions, JudgingOptions, export_to_folder
    from hfexport.loading import LoadedModel
    from hfexport.presets import build_preset

    require_backend("executorch")
    pytest.importorskip("torchao")
    draw = random.Random(29)
    tokenizer = tiny_bpe_tokenizer()
    model, inputs = build_preset("llama", 1, num_key_value_heads=draw.choice([1, 2, 4]), head_dim=draw.choice([8, 16]),
                                 vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=1)
    directory = tmp_path_factory.mktemp("et-mixed") / "export"
    config = ExecutorchConfig(dynamic=True, quantizer=TorchaoQuantizer("int8-dynamic-int4-weights"))
    export_to_folder(LoadedModel(model, inputs, "llama", tokenizer=tokenizer), config, directory,
                     generation=GenerationOptions(generate=True, static_cache=MAX_CACHE_LEN),
                     judging=JudgingOptions(validate=False), llm_runner=True)
    return directory, model, inputs, tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["saved_8da4w", "drawn_8da4w"])
def test_the_mixed_program_follows_torchaos_eager_model_at_every_step(exported, request):
    """The LLM-runner program (`decode.pte`, its cache inside) with the default mixed recipe gives
    the logits of torchao's eager model quantized by the same rule, teacher-forced over 20 decode
    steps: cosine >= 0.999 at each (measured 1.0000 on the preset Llama, where an int8 head had
    been read as garbage from step 4); `details()` names the same 8-bit linears, the head among
    them, and XNNPACK runs every linear."""
    directory, model, inputs, _ = request.getfixturevalue(exported)
    record = json.loads((directory / "report.json").read_text())["components"]["decode"]["record"]["quantization"]
    eager, int8 = _torchao_eager(model)
    assert sorted(name.removeprefix("model.").removesuffix(".weight") for name in record["int8_weights"]["linears"]) \
        == int8 and "lm_head" in int8 and len(int8) > 1
    assert record["delegated_quantized_matmuls"] == record["quantized_matmuls"] == 15
    ids = inputs["input_ids"][:1]
    tokens = torch.randint(3, model.config.vocab_size, (NEW_TOKENS,), generator=torch.Generator().manual_seed(2))
    got = GenerationRunner.load(directory).score(ids, tokens.tolist())
    with torch.no_grad():
        want = eager(torch.cat([ids, tokens[None]], 1)).logits[0, ids.shape[1] - 1:-1]
    cosines = [float(_cosine(g, w)) for g, w in zip(got, want)]
    assert len(cosines) == NEW_TOKENS and min(cosines) >= 0.999, cosines


@pytest.mark.slow
def test_executorchs_own_llm_runner_runs_the_mixed_program_in_a_fresh_process(drawn_8da4w):
    """ExecuTorch's `TextLLMRunner` loads the mixed 8da4w `decode.pte` (int8 and int4 linears in
    XNNPACK) with the folder's `tokenizer.json` in a fresh process and writes the text of the
    tokens `GenerationRunner` generates from the same program (to the EOS id it stops at)."""
    directory, _, _, tokenizer = drawn_8da4w
    prompt = "once upon a time"
    got = both_llm_runners(directory, prompt, tokenizer(prompt).input_ids, NEW_TOKENS)
    assert len(got["ours"]) == NEW_TOKENS
    stop = next((i + 1 for i, token in enumerate(got["ours"]) if token == 1), NEW_TOKENS)
    assert got["pieces"] == [tokenizer.decode([token]) for token in got["ours"]][:stop]
