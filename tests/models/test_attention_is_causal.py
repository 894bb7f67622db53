"""transformers' SDPA integration without a mask at a symbolic query length of one (models/attention.py)."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.errors import CaptureError
from hfexport.models import attention  # noqa: F401 - registers the patch taken out below
from hfexport.workarounds import PATCHES
from tests.harness import without


class _CausalDecodeStep(torch.nn.Module):
    """transformers' `sdpa` attention, causal and without a mask, one query over a longer cache
    (Qwen2-VL's decode step): the masked-SDPA patch leaves this case to transformers' own function."""

    is_causal = True

    def forward(self, query, key):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        out, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](self, query, key, key, None)
        return (out,)


def _takes_another_batch() -> None:
    module = _CausalDecodeStep()
    program = DynamoExporter().export(module, {"query": torch.randn(1, 2, 1, 8), "key": torch.randn(1, 2, 5, 8)},
                                      config=DynamoConfig(dynamic=True))
    query, key = torch.randn(3, 2, 1, 8), torch.randn(3, 2, 6, 8)
    torch.testing.assert_close(program.module()(query=query, key=key)[0], module(query, key)[0])


def test_a_symbolic_is_causal_is_decided_at_trace_time():
    """transformers' `q_length > 1 and attention_mask is None and is_causal` is a SymBool when the
    query length's sample is 1, and SDPA takes only a bool."""
    _takes_another_batch()
    with without(PATCHES, "patch_sdpa_symbolic_is_causal"), \
            pytest.raises(CaptureError, match="'is_causal' must be bool, not SymBool"):
        _takes_another_batch()  # still needed
