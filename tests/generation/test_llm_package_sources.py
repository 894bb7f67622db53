"""The flagless export of a model folder as found is its runtime's LLM package, checked by the
vendor's runner (issue 50): in `--dtype float16` (item 3) and from a `config.json` that names no
end token while its tokenizer does (item 6). Each export runs through the CLI with validation and
the runner check on, so a package that is not made, or that its runner refuses, fails here."""

from __future__ import annotations

import json

import pytest

from hfexport.cli.main import main
from hfexport.loading import LoadedModel, with_end_token
from hfexport.presets import build_preset
from tests.harness import tiny_bpe_tokenizer

from .exports import LLM_PROMPT, LLM_RUNTIMES

#: runtime -> the file of its package that only the package has
PACKAGE_FILE = {"onnx": "genai_config.json", "openvino": "openvino_model.xml", "executorch": "decode.pte"}


def _source(folder, *, end_token: bool) -> str:
    """Save the tiny Llama with the offline tokenizer (`</s>` is id 1) into `folder`, its configs
    naming the end token or not."""
    tokenizer = tiny_bpe_tokenizer()
    eos = 1 if end_token else None
    model, _ = build_preset("llama", vocab_size=len(tokenizer), bos_token_id=0 if end_token else None,
                            eos_token_id=eos)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _export(source: str, runtime: str, out, *flags: str) -> dict:
    """`hfexport export SOURCE -f RUNTIME FLAGS -o OUT` (the package: no --generate); its report."""
    for module in LLM_RUNTIMES[runtime][0]:
        pytest.importorskip(module)
    assert main(["export", source, "-f", runtime, "-o", str(out), "--prompt", LLM_PROMPT, "-q", *flags]) == 0
    return json.loads((out / "report.json").read_text())


def test_the_tokenizers_end_token_is_the_models_where_its_configs_name_none():
    """Where neither the config nor the generation config names `eos_token_id`, the tokenizer's is
    the generation config's (what every runner and the saved generation config read), and the
    report says where it came from; a model that names one keeps it."""
    tokenizer = tiny_bpe_tokenizer()
    model, inputs = build_preset("llama", vocab_size=len(tokenizer), eos_token_id=None)
    model.generation_config.eos_token_id = None
    loaded = with_end_token(LoadedModel(model, inputs, "folder", tokenizer))
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == 1
    assert loaded.end_token["eos_token_id"] == 1 and "'</s>'" in loaded.end_token["from"]
    named, _ = build_preset("llama", vocab_size=len(tokenizer), eos_token_id=7)
    kept = with_end_token(LoadedModel(named, inputs, "folder", tokenizer))
    assert kept.end_token is None and named.generation_config.eos_token_id == 7


@pytest.mark.slow  # one export, checked by onnxruntime-genai
def test_a_folder_without_an_end_token_packages_with_the_tokenizers(tmp_path):
    """onnxruntime-genai refused the package ("eos_token_id (-1) must be in range"), so the export
    exited 3; now `genai_config.json` and the saved generation config name `</s>`, and the runner
    check passes."""
    report = _export(_source(tmp_path / "source", end_token=False), "onnx", tmp_path / "out")
    assert report["runner"]["checked"] and report["runner"]["passed"], report["runner"]
    assert report["end_token"]["eos_token_id"] == 1
    genai = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    assert genai["model"]["eos_token_id"] == 1 and genai["model"]["pad_token_id"] == 1
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text())["eos_token_id"] == 1


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    return _source(tmp_path_factory.mktemp("llama-source"), end_token=True)


def _sixteen_bit() -> list:
    """(runtime, dtype) for every 16-bit dtype a runtime's config does not refuse (those it refuses
    exit 2 before any work: tests/test_dtype.py)."""
    from hfexport import AutoExportConfig

    return [(runtime, dtype) for runtime in PACKAGE_FILE for dtype in ("float16", "bfloat16")
            if not AutoExportConfig.from_dict({"export_format": runtime}).dtype_refusal(dtype)]


@pytest.mark.slow  # one export per runtime and dtype, each checked by the vendor's runner
@pytest.mark.parametrize("runtime, dtype", _sixteen_bit())
def test_a_16_bit_dtype_makes_the_runtimes_package_checked_by_its_runner(source, runtime, dtype, tmp_path):
    """`--dtype float16` (bfloat16 where the runtime has it) without other flags: the package fp32
    makes (ONNX: its attention was not rewritten as GroupQueryAttention and no `genai_config.json`
    was written, exit 0; OpenVINO: `LLMPipeline` refused float16 logits; ExecuTorch: the
    LLM-runner program failed in its custom ops), in that dtype, run by the vendor's runner with
    eager's greedy tokens."""
    out = tmp_path / "out"
    report = _export(source, runtime, out, "--dtype", dtype)
    assert report["dtype"] == dtype and report["task"]["name"] == "text-generation-with-past", report["task"]
    assert (out / PACKAGE_FILE[runtime]).is_file(), sorted(p.name for p in out.iterdir())
    runner = report["runner"]
    assert runner["checked"] and runner["passed"] and runner["tokens_equal"], runner


@pytest.mark.slow  # one export, checked by onnxruntime-genai
def test_a_sample_prompt_ending_with_the_end_token_is_checked_as_onnxruntime_genai_serves_it(source, tmp_path):
    """A sample prompt ending with `</s>` (as a tokenizer that appends its end token gives it), which
    `genai_config.json` names as the pad where the model has none: og masks trailing pad tokens as
    right padding, so the export was refused (og's tokens differed from eager's from the first).
    The runner check now runs og and eager on the prompt without them, and says so."""
    from transformers import AutoTokenizer

    prompt = LLM_PROMPT + "</s>"
    ids = AutoTokenizer.from_pretrained(source)(prompt)["input_ids"]
    assert ids[-1] == 1  # `</s>`, the end token and og's pad
    report = _export(source, "onnx", tmp_path / "out", "--prompt", prompt)
    runner = report["runner"]
    assert runner["checked"] and runner["passed"] and runner["tokens_equal"], runner
    assert runner["prompt_ids"] == ids[:-1], runner
    assert json.loads((tmp_path / "out" / "genai_config.json").read_text())["model"]["pad_token_id"] == 1
