"""transformers' SDPA integration under dynamic shapes (models/attention.py)."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.workarounds import PATCHES
from tests.harness import without


class _CrossAttention(torch.nn.Module):
    """transformers' `sdpa` attention, not causal and without a mask (a decoder's cross-attention)."""

    is_causal = False

    def forward(self, query, key):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        out, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](self, query, key, key, None)
        return (out,)


def _runs_one_query(module: torch.nn.Module) -> None:
    keys = torch.randn(1, 2, 5, 8)
    program = DynamoExporter().export(module, {"query": torch.randn(1, 2, 3, 8), "key": keys},
                                      config=DynamoConfig(dynamic=True))
    query = torch.randn(1, 2, 1, 8)
    torch.testing.assert_close(program.module()(query=query, key=keys)[0], module(query, keys)[0])


def test_unmasked_cross_attention_takes_one_query_token():
    """A one-graph Whisper's decoder refused a single token: transformers evaluates `q_length > 1`
    to and it with is_causal=False."""
    _runs_one_query(_CrossAttention())
    with without(PATCHES, "patch_transformers_sdpa_with_mask"), pytest.raises(Exception, match="Guard failed"):
        _runs_one_query(_CrossAttention())
