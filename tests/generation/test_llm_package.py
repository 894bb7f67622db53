"""Each runtime's LLM package, opened by the vendor's own runner in a fresh process, gives eager's
greedy tokens: Llama, Qwen3, Gemma-3 (a sliding window shorter than the prompt) and Phi-3 ×
onnxruntime-genai's `Generator`, OpenVINO GenAI's `LLMPipeline` and ExecuTorch's `TextLLMRunner`.

Each model is a tiny random preset saved with the offline BPE tokenizer and exported by the CLI's
job with the CLI's flags (`exports.export_llm_package`, one export per (model, runtime), shared
through the session fixture `llm_package`). Where a runtime cannot serve an architecture, the
folder says so (the manifest's reason) and the test asserts that instead of the runner's tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.harness import both_llm_runners, genai_tokens_in_a_new_process

from .exports import LLM_PROMPT, LLM_RUNTIMES

pytestmark = pytest.mark.slow  # 12 exports, each run in a fresh process

NEW_TOKENS = 12
MODELS = ["llama", "qwen3", "gemma3_text", "phi3"]

#: (model, runtime) whose vendor runner cannot serve the model: what the manifest's reason says.
#: LLMPipeline 2026.4.1's default PagedAttention attends past Gemma-3's window (`backends/openvino/genai.py`).
REFUSED = {("gemma3_text", "openvino"): "a sliding window of 4 tokens"}

#: OpenVINO GenAI's `LLMPipeline` on the folder, greedy, fed token ids, with the precisions the manifest records.
_LLM_PIPELINE = """
import json, sys
import numpy as np
import openvino as ov
import openvino_genai as ov_genai
folder, ids, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
properties = json.load(open(folder + "/manifest.json"))["runtime_package"]["settings"]["properties"]
pipe = ov_genai.LLMPipeline(folder, "CPU", **properties)
config = ov_genai.GenerationConfig()
config.max_new_tokens = config.min_new_tokens = new
config.do_sample = False
prompt = ov_genai.TokenizedInputs(ov.Tensor(np.array([ids], np.int64)), ov.Tensor(np.ones((1, len(ids)), np.int64)))
print("RESULT " + json.dumps([int(t) for t in pipe.generate(prompt, config).tokens[0]]))
"""



def _cases(refused: bool) -> list:
    """The (model, runtime) cases the vendor runner serves, or those it refuses (`REFUSED`)."""
    cases = [(m, r) for m in MODELS for r in LLM_RUNTIMES if ((m, r) in REFUSED) == refused]
    return [pytest.param(*case, id=f"{case[0]}-{case[1]}") for case in cases]


def _vendor_tokens(runtime: str, folder, ids: list[int]) -> list[int]:
    """The greedy tokens of the runtime's vendor runner on `folder`, in a fresh process: onnxruntime-genai's
    `Generator` (`harness.genai_tokens_in_a_new_process`) or `_LLM_PIPELINE`."""
    if runtime == "onnx":
        return genai_tokens_in_a_new_process(folder, ids, NEW_TOKENS)
    done = subprocess.run([sys.executable, "-c", _LLM_PIPELINE, str(folder), json.dumps(ids),
                           str(NEW_TOKENS)], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.parametrize(("name", "runtime"), _cases(refused=False))
def test_the_vendor_runner_generates_eagers_tokens(llm_package, name, runtime):
    """Greedy, past the window on every step for Gemma-3: the vendor's runner on the folder gives
    the token ids of eager `generate` (ExecuTorch's `TextLLMRunner` takes text and stops at an EOS
    id: its pieces are eager's tokens decoded one by one, up to the first EOS)."""
    package = llm_package(name, runtime)
    window = getattr(package.model.config, "sliding_window", None)
    assert window is None or package.ids.shape[1] > window, "the prompt must be longer than the window"
    eager, ids = package.eager(NEW_TOKENS), package.ids[0].tolist()
    if runtime == "executorch":
        got = both_llm_runners(package.folder, LLM_PROMPT, ids, NEW_TOKENS)
        assert got["ours"] == eager
        eos = package.tokenizer.eos_token_id
        stop = next((i + 1 for i, token in enumerate(eager) if token == eos), NEW_TOKENS)
        assert got["pieces"] == [package.tokenizer.decode([token]) for token in eager][:stop]
        return
    entry = package.manifest["runtime_package"]
    assert entry["ready"] and entry["runner"] == {"onnx": "onnxruntime-genai", "openvino": "LLMPipeline"}[runtime], entry
    assert set(entry["files"]) <= set(package.manifest["files"]), entry
    assert _vendor_tokens(runtime, package.folder, ids) == eager


@pytest.mark.parametrize(("name", "runtime"), _cases(refused=True))
def test_a_refused_package_is_components_that_say_why(llm_package, name, runtime):
    """Where the vendor runner would give wrong tokens, the folder is no package of it: the
    manifest and the report say why, and `hfexport generate`'s runner gives eager's tokens."""
    from hfexport import GenerationRunner

    package = llm_package(name, runtime)
    entry = package.manifest["runtime_package"]
    assert entry["runner"] == "LLMPipeline" and entry["ready"] is False and REFUSED[name, runtime] in entry["why"], entry
    assert json.loads((package.folder / "report.json").read_text())["runtime_package"] == entry
    assert not (package.folder / "openvino_model.xml").exists()
    assert not (package.folder / "openvino_tokenizer.xml").exists()
    got = GenerationRunner.load(package.folder).generate(package.ids, max_new_tokens=NEW_TOKENS,
                                                          min_new_tokens=NEW_TOKENS)
    assert got.tokens == package.eager(NEW_TOKENS)
