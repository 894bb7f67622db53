"""`generation/suppress.py`: the decode loop's `suppress_tokens`/`begin_suppress_tokens` give
transformers' processors' scores, without the `torch.isin` over the vocabulary those run each step
(12-43 ms a call on Whisper's 51,864 ids, which made hfexport's Whisper decode 3-5x slower than its
graphs: `bench/speech.py`)."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from hfexport.generation.loop import _logits_processors
from hfexport.generation.suppress import SuppressTokens, SuppressTokensAtBegin


@pytest.mark.parametrize("vocab", [128, 51864, 51865])
def test_the_same_scores_as_transformers(vocab):
    generator = torch.Generator().manual_seed(vocab)
    tokens = sorted(set(torch.randint(0, vocab, (90,), generator=generator).tolist())) + [vocab + 5, -1]
    begin = [220 % vocab, vocab - 1]
    for length in (2, 3, 7):
        ids = torch.zeros(1, length, dtype=torch.long)
        scores = torch.randn(1, vocab, generator=generator)
        torch.testing.assert_close(SuppressTokens(tokens)(ids, scores.clone()),
                                   SuppressTokensLogitsProcessor(tokens)(ids, scores), rtol=0, atol=0)
        torch.testing.assert_close(SuppressTokensAtBegin(begin, 3)(ids, scores.clone()),
                                   SuppressTokensAtBeginLogitsProcessor(begin, 3)(ids, scores), rtol=0, atol=0)


def test_a_whisper_step_runs_no_isin(monkeypatch):
    """The processors of a Whisper generation config, over the first and a later step, never call
    `torch.isin` nor copy the scores (the costs this module removes)."""
    config = GenerationConfig(suppress_tokens=list(range(0, 50000, 500)), begin_suppress_tokens=[220, 50256],
                              eos_token_id=50256, max_new_tokens=8)
    processors = _logits_processors(config, [50256])

    def refuse(*args, **kwargs):
        raise AssertionError("torch.isin was called in a decode step")

    monkeypatch.setattr(torch, "isin", refuse)
    first_scores, later_scores = torch.zeros(1, 51864), torch.zeros(1, 51864)
    first = processors(torch.zeros(1, 1, dtype=torch.long), first_scores)
    later = processors(torch.zeros(1, 4, dtype=torch.long), later_scores)
    assert first.data_ptr() == first_scores.data_ptr() and later.data_ptr() == later_scores.data_ptr()
    assert torch.isinf(first[0, [0, 500, 220, 50256]]).all() and torch.isinf(later[0, [0, 500]]).all()
    assert not torch.isinf(later[0, [220, 50256]]).any() and int(torch.isinf(later).sum()) == 100
