"""The OpenVINO generation export is an OpenVINO GenAI `LLMPipeline` folder: the pipeline, on both of
its attention backends, generates eager's greedy tokens, as `GenerationRunner` does."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

ov = pytest.importorskip("openvino")
ov_genai = pytest.importorskip("openvino_genai")
pytest.importorskip("openvino_tokenizers")

from hfexport import GenerationRunner, OpenVINOConfig  # noqa: E402
from hfexport.backends.openvino.genai import GENAI_PROPERTIES  # noqa: E402
from hfexport.job.export import GenerationOptions, LoadingOptions, export_to_folder  # noqa: E402

pytestmark = pytest.mark.slow  # exports to OpenVINO and generates

NEW_TOKENS = 12
CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, this is a tiny tokenizer",
          "openvino genai runs the exported model"]
#: a Llama drawn beyond the presets (head size, key/value heads, layers), reproducibly
DRAW = random.Random(32)
VARIATION = {"head_dim": DRAW.choice([8, 16, 32]), "num_key_value_heads": DRAW.choice([1, 2, 4]),
             "num_hidden_layers": DRAW.choice([1, 2, 3])}


def _tokenizer():
    """A byte-level BPE tokenizer trained here, offline, on `CORPUS` (300 tokens), padding on the left."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS * 10, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    # left padding, as decoder LLMs' tokenizers pad (the converted tokenizer pads a batch so too)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", padding_side="left")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny random Llama with its tokenizer, saved as transformers does and exported by the CLI's job."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         bos_token_id=0, eos_token_id=1, max_position_embeddings=256, **VARIATION)
    model = LlamaForCausalLM(config).eval()
    root = tmp_path_factory.mktemp("ov-genai")
    model.save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    # validated, and run by LLMPipeline, as the CLI exports it
    export_to_folder(str(root / "hf"), OpenVINOConfig(dynamic=True), root / "export",
                     generation=GenerationOptions(generate=True), loading=LoadingOptions(prompt="hello world"))
    return root / "export", model, tokenizer


def _eager(model, ids: torch.Tensor) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def _config(**options):
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = NEW_TOKENS
    config.do_sample = False
    for key, value in options.items():
        setattr(config, key, value)
    return config


def test_the_folder_is_an_llm_pipeline_folder(exported):
    directory, _, _ = exported
    manifest = json.loads((directory / "manifest.json").read_text())
    entry = manifest["runtime_package"]
    assert entry["runner"] == "LLMPipeline" and entry["ready"] is True, entry
    assert entry["settings"]["properties"] == GENAI_PROPERTIES
    assert {"openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml"} <= set(entry["files"]), entry
    for name in ("openvino_model", "openvino_tokenizer", "openvino_detokenizer"):
        assert (directory / f"{name}.xml").is_file() and (directory / f"{name}.bin").is_file()
    assert (directory / "config.json").is_file() and (directory / "generation_config.json").is_file()


@pytest.mark.parametrize("backend", ["SDPA", "PA"])
def test_llm_pipeline_generates_the_tokens_of_eager_and_of_the_runner(exported, backend):
    directory, model, tokenizer = exported
    prompt = "the quick brown fox"
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    eager = _eager(model, ids)
    assert GenerationRunner.load(directory).generate(ids, max_new_tokens=NEW_TOKENS,
                                                     min_new_tokens=NEW_TOKENS).tokens == eager, VARIATION
    pipe = ov_genai.LLMPipeline(str(directory), "CPU", ATTENTION_BACKEND=backend, **GENAI_PROPERTIES)
    assert list(pipe.get_tokenizer().encode(prompt).input_ids.data[0]) == ids[0].tolist()  # converted tokenizer
    tokens = ov_genai.TokenizedInputs(ov.Tensor(ids.numpy()), ov.Tensor(np.ones(ids.shape, np.int64)))
    assert list(pipe.generate(tokens, _config()).tokens[0]) == eager, VARIATION
    assert pipe.generate(prompt, _config()) == tokenizer.decode(eager, skip_special_tokens=True)


def test_a_padded_batch_gives_each_prompt_its_own_tokens(exported):
    """Two prompts of different lengths in one call: the shorter one is left-padded, its padded
    positions' attention rows are fully masked (`patches.fully_masked_rows_left_unzeroed`)."""
    directory, model, tokenizer = exported
    prompts = ["hello world, this is a tiny", "the lazy dog"]
    pipe = ov_genai.LLMPipeline(str(directory), "CPU", ATTENTION_BACKEND="SDPA", **GENAI_PROPERTIES)
    texts = pipe.generate(prompts, _config()).texts
    for prompt, text in zip(prompts, texts):
        eager = _eager(model, tokenizer(prompt, return_tensors="pt")["input_ids"])
        assert text == tokenizer.decode(eager, skip_special_tokens=True), (prompt, VARIATION)


@pytest.mark.parametrize(("preset", "overrides", "bound", "refused"), [
    ("llama", {}, None, False),
    ("qwen3", {"sliding_window": 4}, None, False),  # use_sliding_window=False: every layer attends everything
    ("gemma3_text", {}, None, True),
    ("gemma3_text", {}, 4, False),  # the state never holds more than the window
    ("mistral", {}, 32, True),
    ("phi3", {"sliding_window": 16}, 64, True),
    ("phi3", {"sliding_window": 2047, "max_position_embeddings": 2048}, None, True),
    ("phi3", {"sliding_window": 2047, "max_position_embeddings": 2048}, 2047, False),
])
def test_a_window_shorter_than_the_state_refuses_the_llm_pipeline_folder(preset, overrides, bound, refused):
    """`window_refusal`: a sliding window some layer attends, shorter than the tokens the state may
    hold (the bound, else the model's positions), refuses the folder and names the remedy."""
    from hfexport.backends.openvino.genai import window_refusal
    from hfexport.presets import build_preset

    model, _ = build_preset(preset, **overrides)
    why = window_refusal(model.config, bound)
    assert (why is not None) == refused, why
    if refused:
        assert f"sliding window of {model.config.sliding_window} tokens" in why and "--static-cache N" in why
