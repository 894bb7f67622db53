"""The seed's static-cache multi-token loop on the model of the "dynamic means dynamic" report:
a Qwen3 whose generation config has `pad_token_id=0` and no `eos_token_id`. `generate` hands
such a model a dict of masks (`{"full_attention": ...}`), which no preset produced; the decode
graph kept that dict's single row and every backend rejected the prompt."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .exports import load_example

MAX_CACHE_LEN = 64
PROMPT = [5, 17, 42, 9, 77]
NEW_TOKENS = 6


def _qwen3():
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=1000)
    model = Qwen3ForCausalLM(config).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model, GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)


def _export(fmt: str, directory: Path):
    from hfexport import AutoExportConfig, AutoHfExporter, FolderContents, save_folder

    model, generation_config = _qwen3()
    inputs = {"input_ids": torch.tensor([PROMPT]), "attention_mask": torch.ones(1, len(PROMPT), dtype=torch.long)}
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    exporter = AutoHfExporter.from_config(config)
    artifacts = exporter.export_for_generation(model, inputs, config=config, generation_config=generation_config,
                                               multi_token_decode=True)
    save_folder(exporter, artifacts, directory,
                FolderContents("generation", model=model, generation_config=generation_config, export_config=config))
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             generation_config=generation_config)
    return out[0, len(PROMPT):].tolist()


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "loop"), [
    ("dynamo", lambda path: load_example("decode_loop_dynamo").generate(str(path / "decode.pt2"), PROMPT, NEW_TOKENS)),
    ("onnx", lambda path: load_example("decode_loop_onnxruntime").generate_cpu(str(path / "decode.onnx"), PROMPT,
                                                                           NEW_TOKENS, MAX_CACHE_LEN)),
    ("executorch", lambda path: load_example("decode_loop_executorch").generate(str(path / "decode.pte"), PROMPT,
                                                                            NEW_TOKENS)),
])
def test_the_seed_loop_generates_what_generate_does(tmp_path, fmt, loop):
    """The whole prompt in one call on an empty cache, then one token per call, as the seed's
    loop does it (the examples are those loops), equals `generate()` token for token."""
    pytest.importorskip({"dynamo": "torch", "onnx": "onnxruntime", "executorch": "executorch"}[fmt])
    want = _export(fmt, tmp_path / "export")
    assert loop(tmp_path / "export") == want
