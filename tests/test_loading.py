"""Loading a GGUF file (`loading.load_gguf`): the tiny GGUF written in the test loads through
transformers' GGUF support, dequantized to float32, with its tokenizer and chat template and a
record of its quantization; an architecture transformers cannot read gets its error, named."""

from __future__ import annotations

import pytest
import torch

from hfexport.errors import PrepareError
from hfexport.loading import load_model

from .gguf_files import CHAT_TEMPLATE, write_tiny_llama_gguf

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny-Q4_1.gguf")


def test_a_gguf_file_loads_dequantized_with_its_tokenizer_and_quantization(tiny_gguf):
    loaded = load_model(str(tiny_gguf))
    model = loaded.model
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    # an ordinary float32 model: nothing says "quantized", so its config saves as a plain checkpoint's
    assert model.hf_quantizer is None and not hasattr(model.config, "quantization_config")
    assert "quantization_config" not in model.config.to_dict()
    # the weights are the file's blocks dequantized (Q4_1 here), not a re-quantization or a copy
    reader = gguf.GGUFReader(str(tiny_gguf))
    (down,) = [t for t in reader.tensors if t.name == "blk.1.ffn_down.weight"]
    expected = torch.from_numpy(gguf.quants.dequantize(down.data, down.tensor_type).copy())
    assert torch.equal(model.model.layers[1].mlp.down_proj.weight, expected.reshape(model.model.layers[1].mlp.down_proj.weight.shape))
    assert loaded.weights_from == {"format": "gguf", "file": "tiny-Q4_1.gguf", "architecture": "llama",
                                   "quantization": "Q4_1", "tensor_types": {"Q4_1": 14, "F32": 6, "Q8_0": 1},
                                   "dequantized_to": "float32"}
    assert loaded.tokenizer.chat_template == CHAT_TEMPLATE
    assert loaded.inputs["input_ids"].tolist() == [loaded.tokenizer("Hello, world!")["input_ids"]]
    # a folder and the file's name load the same model
    again = load_model(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    assert torch.equal(again.model.lm_head.weight, model.lm_head.weight) and again.weights_from == loaded.weights_from


def test_an_architecture_transformers_cannot_read_gets_its_error_named(tmp_path):
    path = write_tiny_llama_gguf(tmp_path / "odd.gguf", architecture="notallama")
    with pytest.raises(PrepareError) as caught:
        load_model(str(path))
    message = str(caught.value)
    assert "cannot load odd.gguf (architecture 'notallama', Q4_1)" in message
    assert "GGUF model with architecture notallama is not supported yet" in message  # transformers' own words
    assert "llama" in message.split("What to do:")[1] and "config.json" in message


def test_gguf_without_its_packages_names_the_pip_line(tiny_gguf, monkeypatch):
    from hfexport import _versions

    monkeypatch.setattr(_versions, "is_importable", lambda name: name != "accelerate")
    with pytest.raises(ImportError, match=r'loading a GGUF file needs accelerate.*pip install "hfexport\[gguf\]"'):
        load_model(str(tiny_gguf))


def test_a_missing_gguf_file_or_folder_is_a_clear_error(tiny_gguf):
    with pytest.raises(PrepareError, match="there is no GGUF file at"):
        load_model(str(tiny_gguf.parent / "absent.gguf"))
    with pytest.raises(PrepareError, match="is not a folder"):
        load_model(str(tiny_gguf), gguf_file="tiny-Q4_1.gguf")


def test_tiny_llama_carries_a_tokenizer_and_chat_template_that_fit_its_unchanged_model():
    """`tiny:llama` (the README's main job) loads with a tokenizer of exactly its vocabulary, BOS and
    EOS the config's and generation config's, a chat template that ends each turn with that EOS (so
    `hfexport chat` stops), built the same each time; its weights and inputs are the preset's own."""
    from hfexport.presets import build_preset, tiny_tokenizer

    loaded = load_model("tiny:llama")
    tokenizer, config = loaded.tokenizer, loaded.model.config
    assert len(tokenizer) == config.vocab_size == 128
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (config.bos_token_id, config.eos_token_id)
    assert loaded.model.generation_config.eos_token_id == tokenizer.eos_token_id
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    turn = tokenizer(text, add_special_tokens=False).input_ids
    assert turn.count(tokenizer.eos_token_id) == 1 and max(turn) < config.vocab_size
    assert tokenizer.backend_tokenizer.to_str() == tiny_tokenizer("tiny:llama").backend_tokenizer.to_str()
    model, inputs = build_preset("llama")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.model.state_dict().values()))
    assert all(torch.equal(inputs[k], loaded.inputs[k]) for k in inputs)
    assert load_model("tiny:qwen3").tokenizer is None and tiny_tokenizer("qwen3") is None
