"""What the export job asks of a runtime's own LLM runner, and what it answers
(`RuntimePackage.run`): greedy tokens of a packaged export folder, run by the vendor's
runner (onnxruntime-genai, OpenVINO GenAI's `LLMPipeline`, ExecuTorch's `TextLLMRunner`), for
`generation.runner_check` to compare with eager `generate`."""

from __future__ import annotations

import dataclasses

__all__ = ["RunnerRequest", "RunnerTokens", "RunnerUnavailable"]


@dataclasses.dataclass(frozen=True)
class RunnerRequest:
    """Greedy generation asked of a vendor runner.

    Args:
        prompt_ids: the prompt's token ids, one sequence, special tokens included as the model's
            tokenizer put them (the runner adds none of its own).
        max_new_tokens: how many tokens to generate at most.
        eos_token_ids: the ids that end generation early (the token itself is returned), as
            eager `generate` stops at the model's `eos_token_id`; empty: none.
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    eos_token_ids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class RunnerTokens:
    """What a vendor runner generated: the new token ids (not the prompt) and which runner, with
    its version (`"onnxruntime-genai 0.18.0"`)."""

    tokens: tuple[int, ...]
    runner: str


class RunnerUnavailable(Exception):
    """The folder cannot be run by its runtime's LLM runner here: the runner's package is not
    installed (`missing=True`), or the folder is not the runner's package (the components)."""

    def __init__(self, why: str, *, missing: bool = False):
        super().__init__(why)
        self.why = why
        self.missing = missing
