"""The export job's calibration data: the chosen prompts (`quantization.calibration`) tokenized
with the loaded model's tokenizer into the export sample's inputs (`loading.sample_inputs_for`).
It sits with the job because it reads what loading gave; the quantizers only receive samples."""

from __future__ import annotations

import os
from typing import Any

from ..loading import sample_inputs_for
from ..quantization.calibration import chosen_prompts

__all__ = ["calibration_for", "prompt_samples"]


def prompt_samples(model: Any, tokenizer: Any, prompts: list[str]) -> tuple[list[dict[str, Any]], int]:
    """`(samples, skipped)`: each prompt tokenized into the export sample's inputs
    (`loading.sample_inputs_for`), and how many prompts gave no token (a tokenizer without their
    characters), which are left out: a zero-length input is no activation range."""
    samples = [sample_inputs_for(model, tokenizer, prompt) for prompt in prompts]
    kept = [sample for sample in samples if sample["input_ids"].shape[-1] > 0]
    return kept, len(samples) - len(kept)


def calibration_for(choice: Any, loaded: Any, generate: bool) -> tuple[Any, dict[str, Any]]:
    """`(calibration, record)` for a quantizer that runs on data: the chosen prompts tokenized
    with the model's tokenizer, and what the report says of them (`source`, `samples`).

    A generation export captures each component's inputs on each of these prompts
    (`generation.calibration.captured_calibration`). A model without a tokenizer calibrates on its
    sample inputs (a generation export: each component on its captured inputs), and refuses a
    calibration file rather than drop it."""
    given = choice.calibration_data
    if loaded.tokenizer is None:
        if given is not None:
            raise ValueError(f"--calibration-data {given}: the model has no tokenizer to read prompts with "
                             f"({loaded.tokenizer_missing}); export from a folder or hub id that holds one")
        source = ("each generation component's own captured inputs (the sample prompt)" if generate else "the sample "
                  "inputs") + f" (the model has no tokenizer: {loaded.tokenizer_missing})"
        return [loaded.inputs], {"source": source, "samples": 1}
    source = os.fspath(given) if given is not None else "built-in prompts (hfexport.quantization.calibration)"
    samples, skipped = prompt_samples(loaded.model, loaded.tokenizer, chosen_prompts(given, choice.num_samples))
    if not samples:
        raise ValueError(f"calibration: the tokenizer makes no token of any prompt of {source}; give prompts in "
                         "the model's language (--calibration-data)")
    return samples, {"source": source, "samples": len(samples), "skipped_without_tokens": skipped}
