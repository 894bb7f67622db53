"""`reshape` / `contiguous` decide view-or-copy without a guard (models/view_or_copy.py): minimal
modules traced at 2 query tokens that refuse 1 without the patches."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.models.view_or_copy import view_is_possible
from hfexport.workarounds import PATCHES
from tests.harness import without

HEADS, HEAD_DIM = 4, 8


class _ReshapesATransposedQuery(torch.nn.Module):
    """BLOOM's attention: heads split off, transposed, then folded into the batch."""

    def forward(self, hidden_states):
        batch, query, _ = hidden_states.shape
        heads = hidden_states.view(batch, query, HEADS, HEAD_DIM).transpose(1, 2)
        return (heads.reshape(batch * HEADS, -1, HEAD_DIM) * 2,)


class _TransposesBackContiguous(torch.nn.Module):
    """Eager attention's output: `[b, h, q, d]` transposed and made contiguous (Gemma-2, GPT-2)."""

    def forward(self, hidden_states):
        batch, query, _ = hidden_states.shape
        heads = (hidden_states.view(batch, HEADS, query, HEAD_DIM) * 2).transpose(1, 2).contiguous()
        return (heads.view(batch, query, HEADS * HEAD_DIM),)


class _FlattensSplitHeads(torch.nn.Module):
    """Falcon's `_split_heads`: heads carved out of a fused projection, then flattened back."""

    def forward(self, hidden_states):
        batch, query, _ = hidden_states.shape
        qkv = hidden_states.view(batch, query, 1, HEADS + 2, HEAD_DIM)  # one key/value group: the heads, k, v
        return (qkv[:, :, :, :-2].flatten(2, 3) * 2,)


def _runs_one_token(module: torch.nn.Module) -> None:
    width = (HEADS + 2) * HEAD_DIM if isinstance(module, _FlattensSplitHeads) else HEADS * HEAD_DIM
    program = DynamoExporter().export(module, {"hidden_states": torch.randn(2, 2, width)},
                                      config=DynamoConfig(dynamic=True))
    one = torch.randn(2, 1, width)
    torch.testing.assert_close(program.module()(hidden_states=one)[0], module(one)[0])


@pytest.mark.parametrize(("module", "patch"), [
    (_ReshapesATransposedQuery, "patch_torch_tensor_reshape"),
    (_TransposesBackContiguous, "patch_torch_tensor_contiguous"),
    (_FlattensSplitHeads, "patch_torch_tensor_flatten"),
], ids=["reshape", "contiguous", "flatten"])
def test_a_program_traced_at_two_tokens_takes_one(module, patch):
    _runs_one_token(module())
    with without(PATCHES, patch), pytest.raises(Exception, match="Guard failed"):  # still needed
        _runs_one_token(module())


def test_view_is_possible_decides_without_guessing():
    assert view_is_possible([2, 3, 4], [12, 4, 1], [6, 4]) is True  # contiguous
    assert view_is_possible([2, 4, 3], [12, 1, 4], [2, 12]) is False  # transposed last dims
    assert view_is_possible([], [], [1]) is True


class _AlibiScoresViewedPerHead(torch.nn.Module):
    """BLOOM's attention scores: `alibi.baddbmm(q, k^T)` over `(batch * heads)`, viewed back per
    head as `view(batch, heads, q, -1)`."""

    def forward(self, inputs_embeds, attention_mask):
        batch, query, _ = inputs_embeds.shape
        heads = inputs_embeds.reshape(batch, query, 2, 4).transpose(1, 2).reshape(batch * 2, query, 4)
        alibi = attention_mask.cumsum(-1)[:, None, :].repeat(2, 1, 1).float()  # (batch * heads, 1, kv)
        scores = alibi.baddbmm(heads, heads.transpose(1, 2))
        return (scores.view(batch, 2, query, -1).softmax(-1),)


@pytest.mark.slow
def test_a_views_trailing_size_is_planned_at_its_own_bound_in_executorch():
    """BLOOM on ExecuTorch planned its scores at 4096 x 4096 for the -1 of `view(b, h, q, -1)`
    (8 TB, refused); the minimal module below planned 4 TB without the patch."""
    pytest.importorskip("executorch")
    from hfexport import ExecutorchConfig, ExecutorchExporter, validate
    from hfexport.errors import ExportError

    module = _AlibiScoresViewedPerHead()
    inputs = {"inputs_embeds": torch.randn(2, 5, 8), "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    program = ExecutorchExporter().export(module, inputs, config=ExecutorchConfig(dynamic=True))
    report = validate(program, module, inputs)
    assert report.passed and "resized" in [case.label for case in report.cases], report.to_table()
    with without(PATCHES, "patch_torch_tensor_view_trailing_size"), pytest.raises(ExportError, match="memory plan"):
        ExecutorchExporter().export(module, inputs, config=ExecutorchConfig(dynamic=True))
