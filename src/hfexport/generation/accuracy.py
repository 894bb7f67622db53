"""How close a saved generation export stays to fp32 eager `generate`, over many tokens.

A per-output cosine on one sample says little about a quantized LLM: what its users see is
whether the tokens stay the ones the fp32 model picks. `greedy_agreement` runs eager `generate`
greedily for `new_tokens`, then feeds the export the same tokens (teacher forcing,
`GenerationRunner.score`) and compares step by step: the share of steps whose greedy token is
eager's (`agreement`) and the cosine of each step's logits with eager's. Teacher forcing keeps
one near-tie from counting as a miss at every later step.

`default_min_agreement` is the floor the export job holds a quantized generation export to.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

__all__ = ["AccuracyReport", "greedy_agreement", "default_min_agreement", "DEFAULT_TOKENS"]

#: Steps compared by default (fewer when a static cache holds fewer after the prompt).
DEFAULT_TOKENS = 64


@dataclasses.dataclass
class AccuracyReport:
    """The export's greedy tokens and logits against fp32 eager, step by step."""

    tokens: int  # steps compared
    agreement: float  # share of steps whose greedy token is eager's
    min_cosine: float  # the lowest per-step logits cosine
    mean_cosine: float
    first_difference: int | None  # the first step whose greedy token differs, if any
    min_agreement: float | None = None  # the floor it was held to

    @property
    def passed(self) -> bool:
        """Whether the agreement reaches the floor (no floor: passed)."""
        return self.min_agreement is None or self.agreement >= self.min_agreement

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-able dict (with `passed`)."""
        return {**dataclasses.asdict(self), "passed": self.passed}


def default_min_agreement(quantize: Any) -> float | None:
    """The agreement floor of a quantized export: 0.75 for int4 weights, 0.9 for int8 schemes;
    `None` (no floor) unquantized. Measured on random-weight tiny models, whose logits are nearly
    tied (real checkpoints agree more): int8 0.98-1.0, int4 0.85-1.0."""
    if not quantize:
        return None
    scheme = quantize if isinstance(quantize, str) else getattr(quantize, "scheme", "")
    return 0.75 if "int4" in scheme else 0.9


def greedy_agreement(directory: str | Path, model: torch.nn.Module, prompt: dict[str, Any], *,
                     generation_config: Any = None, new_tokens: int = DEFAULT_TOKENS,
                     min_agreement: float | None = None) -> AccuracyReport:
    """Compare the generation export in `directory` with `model` (fp32 eager) over `new_tokens`
    greedy steps after `prompt` (its first sequence); see the module docstring."""
    from .loop import GenerationRunner

    runner = GenerationRunner.load(directory)
    ids = prompt["input_ids"][:1]
    encoder = model.config.is_encoder_decoder
    if runner.max_cache_len and not encoder:  # a static cache, or an OpenVINO state bounded at its length
        new_tokens = max(1, min(new_tokens, int(runner.max_cache_len) - ids.shape[1]))
    extra = {k: v[:1] for k, v in prompt.items() if k not in ("input_ids", "attention_mask") and isinstance(v, torch.Tensor)}
    with torch.no_grad():
        out = model.generate(input_ids=ids, **extra, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, generation_config=generation_config, output_logits=True,
                             return_dict_in_generate=True)
    start = 1 if encoder else ids.shape[1]
    tokens = out.sequences[0, start:].tolist()
    want = [step[0].float() for step in out.logits]
    got = runner.score(ids, tokens, **extra)
    same = [int(g.argmax()) == token for g, token in zip(got, tokens)]
    cosines = [float(torch.nn.functional.cosine_similarity(g.double(), w.double(), dim=0)) for g, w in zip(got, want)]
    return AccuracyReport(tokens=len(tokens), agreement=sum(same) / len(same), min_cosine=min(cosines),
                          mean_cosine=sum(cosines) / len(cosines),
                          first_difference=next((i for i, ok in enumerate(same) if not ok), None),
                          min_agreement=min_agreement)
