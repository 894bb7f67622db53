"""`linear` and `matmul` keep a batch of one dynamic (models/batched_matmul.py): minimal modules
traced at batch 1 whose batch torch 2.13's decompositions bound to 1..2 without the patches."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.errors import CaptureError
from hfexport.models import batched_matmul  # noqa: F401 - registers the patches taken out below
from hfexport.models import view_or_copy  # noqa: F401
from hfexport.workarounds import PATCHES
from tests.harness import without

#: What the capture says when the batch traced at 1 came out bounded to 1..2.
BOUNDED_BATCH = r"axis 0 \(batch; traced at 1; allowed 1\.\.2\)"


class _LastPositionHead(torch.nn.Module):
    """An LM head with a bias on the last position only (`hidden_states[:, -1:]`, what generate's
    `logits_to_keep=1` does; Phi's and GPT-J's heads have a bias)."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(8, 16)

    def forward(self, inputs_embeds):
        return (self.head(inputs_embeds[:, -1:]),)


class _RotaryFrequencies(torch.nn.Module):
    """A rotary embedding's `inv_freq[None, :, None].expand(batch, -1, 1) @ positions`."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.arange(4, dtype=torch.float32))

    def forward(self, position_ids):
        frequencies = self.inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
        return (frequencies @ position_ids[:, None, :].float(),)


def _takes_batch_three(module: torch.nn.Module, name: str, sample: torch.Tensor, other: torch.Tensor) -> None:
    program = DynamoExporter().export(module, {name: sample}, config=DynamoConfig(dynamic=True))
    torch.testing.assert_close(program.module()(**{name: other})[0], module(other)[0])


def test_a_linear_with_bias_on_a_strided_slice_keeps_a_batch_of_one():
    """Phi's and GPT-J's generation prefill (traced at batch 1) came out bounded to 1..2 without it."""
    module = _LastPositionHead().eval()
    sample, other = torch.randn(1, 5, 8), torch.randn(3, 4, 8)
    _takes_batch_three(module, "inputs_embeds", sample, other)
    with without(PATCHES, "patch_torch_linear_strided_input"), pytest.raises(CaptureError, match=BOUNDED_BATCH):
        _takes_batch_three(module, "inputs_embeds", sample, other)  # still needed


def test_a_batched_matmul_of_an_expanded_operand_keeps_a_batch_of_one():
    """torch 2.13's `aten.matmul` decomposition still guards on the batch (both patches out: 1..2).
    `patch_torch_tensor_reshape` alone also avoids the guard, by copying both operands where
    `patch_torch_matmul_batched` calls `bmm` on them as they are, so the latter is taken out under
    the former here (with the reshape patch in place it makes no difference to the batch)."""
    module = _RotaryFrequencies()
    sample, other = torch.arange(5)[None], torch.arange(12).view(3, 4)
    _takes_batch_three(module, "position_ids", sample, other)
    with without(PATCHES, "patch_torch_tensor_reshape"):
        _takes_batch_three(module, "position_ids", sample, other)
        with without(PATCHES, "patch_torch_matmul_batched"), pytest.raises(CaptureError, match=BOUNDED_BATCH):
            _takes_batch_three(module, "position_ids", sample, other)  # the upstream guard is still there
    with without(PATCHES, "patch_torch_matmul_batched"):
        _takes_batch_three(module, "position_ids", sample, other)  # redundant with the reshape patch
