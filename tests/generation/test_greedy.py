"""The greedy fast path (`generation/greedy.py`) on the sessions whose attention mask grows each
step: ONNX Runtime's GroupQueryAttention package and OpenVINO's stateful model (issue 43). On
drawn prompts (lengths and ids), new-token counts and models (the Llama, Qwen3 and Phi-3 presets,
2 key/value heads of 4; and a Llama whose key/value heads are drawn, 1 or 4, with a drawn head
size), the fast path must run (`GenerationResult.fast_path`) and give eager `generate`'s tokens,
and the generic loop the same ones; the state it leaves (`past`, `fed`) is what the generic loop
leaves, so a chat's next turn continues on it.

The presets' LLM packages are the session fixture `llm_package`'s (shared with
`test_llm_package.py`); the drawn Llama is exported here, once per runtime.
"""

from __future__ import annotations

import random

import pytest
import torch

from hfexport import GenerationRunner
from hfexport.generation.loop import DecodeState

from .exports import LLM_RUNTIMES, export_llm_package

pytestmark = pytest.mark.slow  # LLM package exports (shared), generation in their runtimes

RUNTIMES = ("onnx", "openvino")
DRAW = random.Random(43)
#: the drawn Llama: key/value heads of its 4 heads (multi-query or full multi-head) and head size
DRAWN_LLAMA = {"num_key_value_heads": DRAW.choice([1, 4]), "head_dim": DRAW.choice([8, 16])}
#: (model, runtime, prompt length, new tokens), drawn: the packages' cache holds 64 tokens
CASES = [(model, runtime, DRAW.randint(1, 24), DRAW.randint(2, 30))
         for runtime in RUNTIMES for model in ("llama", "qwen3", "phi3", "drawn-llama")]


@pytest.fixture(scope="module")
def drawn_llama(tmp_path_factory):
    """`drawn_llama(runtime)`: the LLM package of the Llama preset with `DRAWN_LLAMA`'s heads."""
    made = {}

    def get(runtime: str):
        for module in LLM_RUNTIMES[runtime][0]:
            pytest.importorskip(module)
        if runtime not in made:
            made[runtime] = export_llm_package("llama", runtime, tmp_path_factory.mktemp(f"drawn-llama-{runtime}"),
                                               **DRAWN_LLAMA)
        return made[runtime]

    return get


def _eager(model, ids: torch.Tensor, new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize(("name", "runtime", "length", "new_tokens"), CASES,
                         ids=[f"{m}-{r}-prompt{p}-new{n}" for m, r, p, n in CASES])
def test_the_fast_path_gives_eagers_tokens_where_the_mask_grows(llm_package, drawn_llama, name, runtime, length,
                                                                 new_tokens):
    package = drawn_llama(runtime) if name == "drawn-llama" else llm_package(name, runtime)
    if name == "drawn-llama":
        assert package.model.config.num_key_value_heads == DRAWN_LLAMA["num_key_value_heads"], DRAWN_LLAMA
    vocab = package.model.config.vocab_size
    ids = torch.randint(2, vocab, (1, length), generator=torch.Generator().manual_seed(length * 100 + new_tokens))
    runner = GenerationRunner.load(package.folder, engine="hfexport")
    fast = runner.generate(ids, max_new_tokens=new_tokens, eos_token_id=None)
    runner.use_fast_path = False
    generic = runner.generate(ids, max_new_tokens=new_tokens, eos_token_id=None)
    assert fast.fast_path and not generic.fast_path
    assert fast.tokens == generic.tokens == _eager(package.model, ids, new_tokens), (name, runtime, length, DRAWN_LLAMA)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_fast_path_leaves_the_state_the_generic_loop_continues(llm_package, runtime):
    """After the bound steps, a generic step on the same state (a chat's next turn) gives eager's
    next token: the cache, its write counters and the session's bindings are where they belong."""
    package = llm_package("llama", runtime)
    runner = GenerationRunner.load(package.folder, engine="hfexport")
    ids = package.ids
    config = runner.generation_config(max_new_tokens=6, eos_token_id=None)
    state = DecodeState(runner, ids, None, {})
    first = runner._generate_on(state, ids, ids, config)
    assert first.fast_path
    assert state.past == ids.shape[1] + 5 and state.fed == ids[0].tolist() + first.tokens[:-1]
    eager = _eager(package.model, ids, 9)
    assert first.tokens == eager[:6]
    sequence = torch.cat([ids, torch.tensor([first.tokens])], dim=1)
    runner.use_fast_path = False  # the generic step on the state the fast one left
    second = runner._generate_on(state, torch.tensor([first.tokens[-1:]]), sequence, config.__class__(
        **{**config.to_dict(), "max_new_tokens": 3}))
    assert second.tokens == eager[6:9]


def test_token_ids_in_and_out_build_no_model_config_or_tokenizer(llm_package, tmp_path):
    """A runner opened on an LLM package and generating from token ids never builds the model's
    config or the tokenizer (transformers imports a model's configuration module and tokenizer
    classes for them: seconds of a cold `generate`, bench/RESULTS.md); `.text` and `.config` build
    them at first use from the folder's checked files, so a tokenizer file changed after `load` is
    refused then, naming it."""
    import json
    import shutil
    import subprocess
    import sys

    package = llm_package("llama", "onnx")
    folder = tmp_path / "package"
    shutil.copytree(package.folder, folder)
    ids = package.ids[0].tolist()
    script = f"""
import json, sys
from hfexport import GenerationRunner
runner = GenerationRunner.load({str(folder)!r}, engine="hfexport")
result = runner.generate({ids}, max_new_tokens=4, eos_token_id=None)
built = [m for m in ("transformers.models.llama.configuration_llama", "transformers.tokenization_utils_tokenizers",
                     "transformers.tokenization_utils_base") if m in sys.modules]
print(json.dumps({{"tokens": result.tokens, "built": built, "text": result.text,
                  "config": type(runner.export.config).__name__}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["tokens"] == package.eager(4)
    assert out["built"] == []
    assert out["text"] == package.tokenizer.decode(out["tokens"], skip_special_tokens=True)
    assert out["config"] == "LlamaConfig"

    from hfexport import GenerationRunner
    from hfexport.errors import ExportFolderError

    runner = GenerationRunner.load(folder, engine="hfexport")
    result = runner.generate(package.ids, max_new_tokens=2, eos_token_id=None)
    (folder / "tokenizer.json").write_text((folder / "tokenizer.json").read_text().replace('"<s>"', '"<x>"', 1))
    with pytest.raises(ExportFolderError, match="tokenizer.json"):
        result.text
