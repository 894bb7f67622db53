"""transformers' linear-attention cache layer at the prefill (models/linear_attention.py)."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.presets import build_preset
from hfexport.workarounds import PATCHES
from hfexport.utils import decompose_for_generation
from tests.harness import without


def _prefill_of_a_short_prompt() -> None:
    model, inputs = build_preset("mamba2")
    module, kwargs = decompose_for_generation(model, inputs)["prefill"]  # traced on 8 tokens, kernel 4
    program = DynamoExporter().export(module, kwargs, config=DynamoConfig(dynamic=True))
    short = {**kwargs, "input_ids": kwargs["input_ids"][:, :2]}
    short = {k: v[:, :2] if k == "attention_mask" else v for k, v in short.items()}
    got = program.module()(**{k: v for k, v in short.items()})
    with torch.no_grad():
        want = module(**short)
    torch.testing.assert_close(got.logits, want.logits)


def test_a_prefill_traced_on_a_long_prompt_takes_one_shorter_than_the_conv_kernel():
    _prefill_of_a_short_prompt()
    with without(PATCHES, "patch_transformers_linear_attention_conv_state"), pytest.raises(Exception, match="Guard failed"):
        _prefill_of_a_short_prompt()
