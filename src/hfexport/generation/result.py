"""`GenerationResult`, what a generation gives back, whichever engine ran it (`loop.py`'s or the
runtime's own, `engine.py`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["GenerationResult", "as_token_list"]


@dataclasses.dataclass
class GenerationResult:
    """What `GenerationRunner.generate` produced, and how fast."""

    tokens: list[int]  # the new tokens (an encoder-decoder's decoder start token not included)
    prompt: list[int]
    time_to_first_token_s: float
    tokens_per_s: float  # decode steps after the first token, per second (nan with one token)
    logits: list[torch.Tensor] | None = None  # per step, the last position's logits (`output_logits=True`)
    stopped_at_eos: bool = False  # the last token is an end token (else `max_new_tokens` ran out)
    fast_path: bool = False  # the decode steps after the first token ran `greedy.GreedySteps`
    #: what generated: the runtime's own engine ("onnxruntime-genai 0.18.0", `engine.py`) or hfexport's loop
    engine: str = "hfexport"
    #: why hfexport's loop ran where the runtime's engine was not asked against (engine="auto"), else None
    engine_reason: str | None = None
    #: the text, or what decodes it at first use (`text`): loading a tokenizer imports transformers'
    #: tokenizer classes, seconds a caller of token ids in and out does not need
    _text: Callable[[], str | None] | str | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def text(self) -> str | None:
        """The new tokens decoded by the export's tokenizer (special tokens skipped), None without one."""
        if callable(self._text):
            self._text = self._text()
        return self._text

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-able dict (per-step logits left out)."""
        out = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
               if field.name not in ("logits", "_text")}
        return {**out, "text": self.text}


def as_token_list(value: Any) -> list[int]:
    """Token ids as a list: None is none, an int is one (a generation config's `eos_token_id`)."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]
