"""The runner check's eager side (`job.runner_check._compared`): a runner's greedy tokens are held
to eager `generate()`'s, found in one forward over the prompt and the runner's tokens where each is
eager's pick after those before it, and from `generate()` itself otherwise (a different token, a
logits processor in the generation config, a run that ends where `generate()` would not). Drawn
models, prompt lengths and token budgets; no runtime needed: the runner's tokens are given."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from hfexport.folder.contents import merged_generation_config
from hfexport.folder.package import RunnerRequest, RunnerTokens
from hfexport.job import runner_check
from hfexport.job.runner_check import _compared, _eager_picks_each
from tests.harness import tiny_decoder

_DRAW = random.Random(5361)
#: (model type, head dim, kv heads, prompt length, new tokens)
VARIATIONS = [("llama", 8, 2, 5, 16)] + [
    (_DRAW.choice(["llama", "qwen3", "mistral", "gemma2", "phi3"]), _DRAW.choice([8, 16]), _DRAW.choice([1, 2, 4]),
     _DRAW.randint(1, 12), _DRAW.randint(1, 20)) for _ in range(4)]


def _model(model_type: str, head_dim: int, kv_heads: int):
    window = {"sliding_window": 4} if model_type in ("mistral", "gemma2") else {}  # within the prompt and its tokens
    return tiny_decoder(model_type, head_dim=head_dim, kv_heads=kv_heads, seed=3, **window)[0]


def _generated(model, ids, new_tokens, generation_config):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             generation_config=generation_config)
    return tuple(out[0, ids.shape[1]:].tolist())


@pytest.mark.parametrize("variation", VARIATIONS, ids=str)
def test_one_forward_finds_generates_tokens_and_nothing_else(variation):
    from transformers import GenerationConfig

    model_type, head_dim, kv_heads, prompt, new_tokens = variation
    model = _model(model_type, head_dim, kv_heads)
    ids = torch.randint(3, 96, (1, prompt), generator=torch.Generator().manual_seed(prompt))
    for eos in ((), (2,)):
        model.generation_config.eos_token_id = list(eos) or None  # generate() fills an unset one from it
        config = copy.deepcopy(model.generation_config)
        request = RunnerRequest(tuple(ids[0].tolist()), new_tokens, eos)
        tokens = _generated(model, ids, new_tokens, config)
        assert _eager_picks_each(tokens, ids, request, model, config), (eos, tokens)
        wrong = (*tokens[:-1], (tokens[-1] + 1) % 96)
        assert not _eager_picks_each(wrong, ids, request, model, config)
        if len(tokens) > 1 and tokens[-1] not in eos:  # a runner stopping short of the budget, without an end token
            assert not _eager_picks_each(tokens[:-1], ids, request, model, config)
    # a run ending at an end token generate() picks: the request's end token set to the third pick
    model.generation_config.eos_token_id = None
    tokens = _generated(model, ids, new_tokens, GenerationConfig())
    if len(tokens) >= 3 and tokens[2] not in tokens[:2]:
        config = GenerationConfig(eos_token_id=tokens[2])
        assert _generated(model, ids, new_tokens, config) == tokens[:3]
        assert _eager_picks_each(tokens[:3], ids, RunnerRequest(tuple(ids[0].tolist()), new_tokens, (tokens[2],)),
                                 model, config)


def test_a_logits_processor_or_extra_inputs_take_generate(monkeypatch):
    """Where greedy's pick may be off the argmax (a repetition penalty, a minimum length, suppressed
    tokens, beam search), the prompt carries inputs beside its ids, the model is an encoder-decoder
    or its forward fails on the ids, `generate()` itself is the reference."""
    from transformers import GenerationConfig

    model = _model("llama", 8, 2)
    model.generation_config.eos_token_id = None
    ids = torch.tensor([[5, 9, 14, 3]])
    plain = GenerationConfig()
    tokens = _generated(model, ids, 6, plain)
    request = RunnerRequest(tuple(ids[0].tolist()), 6, ())
    assert _eager_picks_each(tokens, ids, request, model, plain)
    for field, value in (("repetition_penalty", 1.3), ("min_new_tokens", 3), ("suppress_tokens", [7]),
                         ("no_repeat_ngram_size", 2), ("num_beams", 2), ("prompt_lookup_num_tokens", 3),
                         ("a_processor_of_a_later_transformers", 0.5)):  # an allowlist: what it does not know goes
        assert not _eager_picks_each(tokens, ids, request, model, GenerationConfig(**{field: value}))
    with_image = RunnerRequest(tuple(ids[0].tolist()), 6, (), inputs={"pixel_values": torch.zeros(1, 3, 4, 4)})
    assert not _eager_picks_each(tokens, ids, with_image, model, plain)
    # a forward that wants more than ids (it fails), or an encoder-decoder: generate() decides
    monkeypatch.setattr(model, "forward", lambda **kwargs: (_ for _ in ()).throw(ValueError("decoder_input_ids")))
    assert not _eager_picks_each(tokens, ids, request, model, plain)
    monkeypatch.undo()
    assert _eager_picks_each(tokens, ids, request, model, plain)
    monkeypatch.setattr(model.config, "is_encoder_decoder", True)
    assert not _eager_picks_each(tokens, ids, request, model, plain)


def test_the_check_runs_generate_only_where_the_forward_differs(monkeypatch, tmp_path):
    """Equal tokens pass without `generate()`; a differing token refuses with `generate()`'s tokens
    as the expected ones."""
    from transformers import GenerationConfig

    model = _model("qwen3", 8, 2)
    model.generation_config.eos_token_id = None
    ids = torch.tensor([[5, 9, 14, 3, 44]])
    config = GenerationConfig()
    tokens = _generated(model, ids, 8, config)
    request = RunnerRequest(tuple(ids[0].tolist()), 8, ())
    calls = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(1) or generate(*a, **k))
    monkeypatch.setattr(runner_check, "read_manifest", lambda *a, **k: {})
    entry = _compared(RunnerTokens(tokens, "runner"), request, tmp_path, model, config, None)
    assert entry["passed"] and entry["tokens_equal"] and entry["against"] == "eager generate()" and not calls
    # the export job's merged config (a static cache, the model's special tokens) takes the one forward too
    merged = merged_generation_config(model, GenerationConfig(cache_implementation="static", max_cache_len=64))
    assert _compared(RunnerTokens(tokens, "runner"), request, tmp_path, model, merged, None)["passed"] and not calls
    wrong = (*tokens[:3], (tokens[3] + 1) % 96, *tokens[4:])
    entry = _compared(RunnerTokens(wrong, "runner"), request, tmp_path, model, config, None)
    assert not entry["passed"] and entry["expected"] == list(tokens) and calls == [1]
