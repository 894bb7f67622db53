"""Each runtime's LLM package, opened by the vendor's own runner in a fresh process, gives eager's
greedy tokens: Llama, Qwen3, Gemma-3 (a sliding window shorter than the prompt) and Phi-3 ×
onnxruntime-genai's `Generator`, OpenVINO GenAI's `LLMPipeline` and ExecuTorch's `TextLLMRunner`.

Each model is a tiny random preset with the offline BPE tokenizer (`harness.tiny_bpe_tokenizer`),
saved as transformers saves one and exported by the CLI's job with the CLI's flags:
`-f onnx --generate --multi-token-decode --static-cache 64`, `-f openvino --generate`,
`-f executorch --generate --static-cache 64`. One export per (model, runtime), shared by the
module's tests. Where a runtime cannot serve an architecture, the folder says so (the manifest's
reason) and the test asserts that instead of the runner's tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.harness import both_llm_runners, tiny_bpe_tokenizer

pytestmark = pytest.mark.slow  # 12 exports, each run in a fresh process

NEW_TOKENS = 12
CACHE = 64
#: 8 tokens of the tiny tokenizer: longer than Gemma-3's window (the preset's `sliding_window=4`)
PROMPT = "once upon a time there was a model"
MODELS = ["llama", "qwen3", "gemma3_text", "phi3"]
#: runtime -> (the modules its export and vendor runner import, the export's CLI flags as job options)
RUNTIMES = {
    "onnx": (("onnxscript", "onnxruntime", "onnxruntime_genai"), {"static_cache": CACHE, "multi_token_decode": True}),
    "openvino": (("openvino", "openvino_genai", "openvino_tokenizers"), {}),
    "executorch": (("executorch",), {"static_cache": CACHE}),
}

#: onnxruntime-genai's `Generator` on the folder, greedy, fed token ids (`genai_config.json` names the graph).
_GENAI = """
import json, sys
import onnxruntime_genai as og
folder, ids, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
model = og.Model(folder)
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=len(ids) + new, min_length=len(ids) + new)
generator = og.Generator(model, params)
generator.append_tokens([ids])
tokens = []
while not generator.is_done():
    generator.generate_next_token()
    tokens.append(int(generator.get_next_tokens()[0]))
print("RESULT " + json.dumps(tokens))
"""

#: OpenVINO GenAI's `LLMPipeline` on the folder, greedy, fed token ids, with the precisions the manifest records.
_LLM_PIPELINE = """
import json, sys
import numpy as np
import openvino as ov
import openvino_genai as ov_genai
folder, ids, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
properties = json.load(open(folder + "/manifest.json"))["openvino_genai"]["properties"]
pipe = ov_genai.LLMPipeline(folder, "CPU", **properties)
config = ov_genai.GenerationConfig()
config.max_new_tokens = config.min_new_tokens = new
config.do_sample = False
prompt = ov_genai.TokenizedInputs(ov.Tensor(np.array([ids], np.int64)), ov.Tensor(np.ones((1, len(ids)), np.int64)))
print("RESULT " + json.dumps([int(t) for t in pipe.generate(prompt, config).tokens[0]]))
"""

_VENDOR_SCRIPTS = {"onnx": _GENAI, "openvino": _LLM_PIPELINE}

#: (model, runtime) whose vendor runner cannot serve the model: what the manifest's reason says.
#: LLMPipeline 2026.4.1's default PagedAttention attends past Gemma-3's window (`openvino/genai.py`).
REFUSED = {("gemma3_text", "openvino"): "a sliding window of 4 tokens"}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """`sources(name)`: the preset saved with the tiny tokenizer (vocabulary resized to it), its
    eager model, the prompt's ids and eager `generate`'s greedy tokens; made once per model."""
    from hfexport.presets import build_preset

    made = {}

    def get(name: str):
        if name not in made:
            tokenizer = tiny_bpe_tokenizer()
            model, _ = build_preset(name, vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=1)
            folder = tmp_path_factory.mktemp(f"source-{name}")
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            ids = tokenizer(PROMPT, return_tensors="pt").input_ids
            with torch.no_grad():
                eager = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                       min_new_tokens=NEW_TOKENS, do_sample=False)[0, ids.shape[1]:].tolist()
            made[name] = folder, tokenizer, ids, eager
        return made[name]

    return get


@pytest.fixture(scope="module")
def package(request, sources, tmp_path_factory):
    """One (model, runtime) package exported from the saved model by the CLI's job, with the
    window's facts: `(runtime, folder, manifest, tokenizer, ids, eager tokens)`."""
    from hfexport import AutoExportConfig
    from hfexport.job import export_to_folder

    name, runtime = request.param
    modules, options = RUNTIMES[runtime]
    for module in modules:
        pytest.importorskip(module)
    source, tokenizer, ids, eager = sources(name)
    window = json.loads((source / "config.json").read_text()).get("sliding_window")
    assert window is None or ids.shape[1] > window, "the prompt must be longer than the window"
    folder = tmp_path_factory.mktemp(f"package-{name}-{runtime}") / "out"
    config = AutoExportConfig.from_dict({"export_format": runtime, "dynamic": True})
    result = export_to_folder(str(source), config, folder, generate=True, prompt=PROMPT, **options)
    return (name, runtime), folder, result.manifest, tokenizer, ids, eager


def _vendor_tokens(runtime: str, folder, ids: list[int]) -> list[int]:
    """The greedy tokens of the runtime's vendor runner (`_VENDOR_SCRIPTS`) on `folder`, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _VENDOR_SCRIPTS[runtime], str(folder), json.dumps(ids),
                           str(NEW_TOKENS)], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def _packages(refused: bool) -> list:
    """The (model, runtime) cases the vendor runner serves, or those it refuses (`REFUSED`), as
    indirect parameters of the module-scoped `package` fixture: one export each, whichever test asks."""
    cases = [(m, r) for m in MODELS for r in RUNTIMES if ((m, r) in REFUSED) == refused]
    return [pytest.param(case, id=f"{case[0]}-{case[1]}") for case in cases]


@pytest.mark.parametrize("package", _packages(refused=False), indirect=True, scope="module")
def test_the_vendor_runner_generates_eagers_tokens(package):
    """Greedy, past the window on every step for Gemma-3: the vendor's runner on the folder gives
    the token ids of eager `generate` (ExecuTorch's `TextLLMRunner` takes text and stops at an EOS
    id: its pieces are eager's tokens decoded one by one, up to the first EOS)."""
    (name, runtime), folder, manifest, tokenizer, ids, eager = package
    if runtime == "executorch":
        got = both_llm_runners(folder, PROMPT, ids[0].tolist(), NEW_TOKENS)
        assert got["ours"] == eager
        stop = next((i + 1 for i, token in enumerate(eager) if token == tokenizer.eos_token_id), NEW_TOKENS)
        assert got["pieces"] == [tokenizer.decode([token]) for token in eager][:stop]
        return
    entry = manifest["onnxruntime_genai" if runtime == "onnx" else "openvino_genai"]
    assert entry.get("config") or entry.get("llm_pipeline"), entry
    assert _vendor_tokens(runtime, folder, ids[0].tolist()) == eager


@pytest.mark.parametrize("package", _packages(refused=True), indirect=True, scope="module")
def test_a_refused_package_is_components_that_say_why(package):
    """Where the vendor runner would give wrong tokens, the folder is no package of it: the
    manifest and the report say why, and `hfexport generate`'s runner gives eager's tokens."""
    from hfexport import GenerationRunner

    (name, runtime), folder, manifest, _, ids, eager = package
    entry = manifest["openvino_genai"]
    assert entry["llm_pipeline"] is False and REFUSED[name, runtime] in entry["why"], entry
    assert json.loads((folder / "report.json").read_text())["openvino_genai"] == entry
    assert not (folder / "openvino_model.xml").exists() and not (folder / "openvino_tokenizer.xml").exists()
    got = GenerationRunner.load(folder).generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    assert got.tokens == eager
