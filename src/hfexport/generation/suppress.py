"""`suppress_tokens` and `begin_suppress_tokens` (Whisper's generation config) as the decode loop applies
them: the scores of the listed ids set to minus infinity, as transformers' processors set them.

NOTE: why not transformers' `SuppressTokensLogitsProcessor` and `SuppressTokensAtBeginLogitsProcessor`
(read at transformers 5.24): both build `torch.isin(torch.arange(vocab), tokens)` on every call, the
second even at the steps it leaves alone. On Whisper's 51,864 ids `torch.isin` takes the sort-based path,
12 ms a call on one thread and 43 ms on two on this 2-CPU machine, so a decode step paid 25-90 ms in them
against the 5-20 ms of the step's graph (`bench/speech.py`, bench/RESULTS.md). Here the ids are a tensor
made once and the scores are written by index, in place: a copy of 51,864 scores (`clone`, `where`) is a
parallel region of torch's intra-op threads, 7.7 ms (clone) and 15 ms (where) on 2 threads when another
process holds one of the 2 CPUs, 0.01 ms on one thread. The loop hands the processors this step's
scores, which nothing reads after them (`output_logits` keeps a copy taken before).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SuppressTokens", "SuppressTokensAtBegin"]


class SuppressTokens:
    """Set the scores of `suppress_tokens` to minus infinity at every step (in place; returns them)."""

    def __init__(self, suppress_tokens: Any):
        self.tokens = torch.tensor(list(suppress_tokens), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # as isin over the vocabulary's ids: an id outside it (negative, or past it) suppresses nothing
        tokens = self.tokens[(self.tokens >= 0) & (self.tokens < scores.shape[-1])]
        return scores.index_fill_(-1, tokens, -float("inf"))


class SuppressTokensAtBegin(SuppressTokens):
    """Set the scores of `begin_suppress_tokens` to minus infinity at the step whose input is
    `begin_index` tokens long (the first new token), and leave the other steps alone."""

    def __init__(self, begin_suppress_tokens: Any, begin_index: int):
        super().__init__(begin_suppress_tokens)
        self.begin_index = begin_index

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] != self.begin_index:
            return scores
        return super().__call__(input_ids, scores)
