"""The greedy fast path (`generation/greedy.py`) on the sessions whose attention mask grows each
step: ONNX Runtime's GroupQueryAttention package and OpenVINO's stateful model (issue 43). On
drawn prompts (lengths and ids), new-token counts and models (key/value heads: Llama's 2 of 4,
Qwen3's 2 of 4 with its own head size, Phi-3's 4 of 4 with a fused QKV), the fast path must run
(`GenerationResult.fast_path`) and give eager `generate`'s tokens, and the generic loop the same
ones; the state it leaves (`past`, `fed`) is what the generic loop leaves, so a chat's next turn
continues on it.

The LLM packages are the session fixture `llm_package`'s (shared with `test_llm_package.py`).
"""

from __future__ import annotations

import random

import pytest
import torch

from hfexport import GenerationRunner
from hfexport.generation.loop import _State

pytestmark = pytest.mark.slow  # LLM package exports (shared), generation in their runtimes

DRAW = random.Random(43)
#: (model, runtime, prompt length, new tokens), drawn: the packages' cache holds 64 tokens
CASES = [(model, runtime, DRAW.randint(1, 24), DRAW.randint(2, 30))
         for runtime in ("onnx", "openvino") for model in ("llama", "qwen3", "phi3")]


def _eager(model, ids: torch.Tensor, new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize(("name", "runtime", "length", "new_tokens"), CASES,
                         ids=[f"{m}-{r}-prompt{p}-new{n}" for m, r, p, n in CASES])
def test_the_fast_path_gives_eagers_tokens_where_the_mask_grows(llm_package, name, runtime, length, new_tokens):
    package = llm_package(name, runtime)
    vocab = package.model.config.vocab_size
    ids = torch.randint(2, vocab, (1, length), generator=torch.Generator().manual_seed(length * 100 + new_tokens))
    runner = GenerationRunner.load(package.folder)
    fast = runner.generate(ids, max_new_tokens=new_tokens, eos_token_id=None)
    runner.use_fast_path = False
    generic = runner.generate(ids, max_new_tokens=new_tokens, eos_token_id=None)
    assert fast.fast_path and not generic.fast_path
    assert fast.tokens == generic.tokens == _eager(package.model, ids, new_tokens), (name, runtime, length)


@pytest.mark.parametrize("runtime", ["onnx", "openvino"])
def test_the_fast_path_leaves_the_state_the_generic_loop_continues(llm_package, runtime):
    """After the bound steps, a generic step on the same state (a chat's next turn) gives eager's
    next token: the cache, its write counters and the session's bindings are where they belong."""
    package = llm_package("llama", runtime)
    runner = GenerationRunner.load(package.folder)
    ids = package.ids
    config = runner.generation_config(max_new_tokens=6, eos_token_id=None)
    state = _State(runner, ids, None, {})
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
