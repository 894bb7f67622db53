"""`patch_xnnpack_idle_passes`: an XNNPACK delegate pass with nothing to rewrite in a partition
returns it unchanged instead of retracing it. The lowered program must be byte for byte what the
unpatched lowering writes, where the passes are idle (a decoder's ops) and where each has work
(convolution, batch norm, PReLU, padding, upsampling, relu, a wide concatenation, a dynamically
quantized decoder's q/dq nodes), at drawn sizes; each pass must still run where its ops are; and
the patterns the pattern-matching passes look for must contain the op the patch checks."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("executorch")

from hfexport.backends.executorch.patches import _IDLE_UNLESS, _op_names  # noqa: E402
from hfexport.workarounds import PATCHES, applied_patches  # noqa: E402
from tests.harness import without  # noqa: E402

DRAW = random.Random(43)


class Decoderish(torch.nn.Module):
    """What a decoder's partitions hold: linears, a softmax attention, a rotary concatenation, SiLU."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.up = torch.nn.Linear(hidden, 2 * hidden)
        self.down = torch.nn.Linear(2 * hidden, hidden)

    def forward(self, x):
        batch, length, hidden = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, hidden // self.heads).unbind(2)
        half = q.shape[-1] // 2
        q = torch.cat([-q[..., half:], q[..., :half]], dim=-1)
        scores = torch.softmax(q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2), dim=-1)
        x = x + (scores @ v.transpose(1, 2)).transpose(1, 2).reshape(batch, length, hidden)
        return x + self.down(F.silu(self.up(x)))


class Convish(torch.nn.Module):
    """One op for each pass the patch can skip."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(channels)
        self.prelu = torch.nn.PReLU(channels)
        self.conv1d = torch.nn.Conv1d(channels, channels, 3)
        self.alone = torch.nn.BatchNorm2d(channels)  # after no convolution: decomposed, not fused
        for norm in (self.norm, self.alone):
            with torch.no_grad():
                norm.running_mean.uniform_(-1, 1)
                norm.running_var.uniform_(0.5, 2)

    def forward(self, x):
        x = F.relu(self.norm(self.conv(x)))
        x = self.alone(torch.softmax(self.prelu(F.pad(x, (1, 1, 1, 1))), dim=-1))
        x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        wide = torch.cat([x[:, :, i::7] for i in range(7)], dim=2)
        flat = wide.flatten(2)
        return F.hardtanh(self.conv1d(flat))


def _quantized(module: torch.nn.Module, args: tuple) -> torch.export.ExportedProgram:
    """`module` quantized with XNNPACK's dynamic int8 PT2E recipe (q/dq nodes around its linears)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    prepared = prepare_pt2e(torch.export.export(module.eval(), args).module(), quantizer)
    prepared(*args)
    return torch.export.export(convert_pt2e(prepared), args)


def _lowered(module: torch.nn.Module, args: tuple, quantize: bool = False) -> bytes:
    """The `.pte` bytes of `module` lowered to XNNPACK under ExecuTorch's registered patches (this
    one among them unless the caller took it out)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    program = _quantized(module, args) if quantize else torch.export.export(module.eval(), args)
    with applied_patches("executorch"):
        return to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch().buffer


@pytest.mark.slow
def test_the_lowered_program_is_the_unpatched_one_byte_for_byte():
    """(The 8-layer Llama's LLM program, exported by the CLI with and without the patch, is the same
    file too: bench/RESULTS.md.)"""
    hidden, heads, length = DRAW.choice([32, 48, 64]), DRAW.choice([2, 4]), DRAW.randrange(2, 9)
    channels, size = DRAW.choice([4, 8]), DRAW.randrange(6, 12)
    torch.manual_seed(DRAW.randrange(1000))
    decoder, conv = Decoderish(hidden, heads), Convish(channels)
    cases = [(decoder, (torch.randn(1, length, hidden),), False), (conv, (torch.randn(1, 3, size, size),), False),
             (decoder, (torch.randn(1, length, hidden),), True)]
    for module, args, quantize in cases:
        patched = _lowered(module, args, quantize)
        with without(PATCHES, "patch_xnnpack_idle_passes"):
            assert _lowered(module, args, quantize) == patched


@pytest.mark.slow
def test_each_pass_still_rewrites_where_its_ops_are():
    """The convolution model's partitions hold an op of each skippable pass but two (PReLU, q/dq):
    none of those is skipped there (the patched `call` reaches the original); on the decoder's all
    but those whose ops a decoder has (softmax, cat) are; a quantized decoder's q/dq nodes reach
    PropagateCustomMetaPass. Still needed: without the patch, ExecuTorch runs every one of them on
    the decoder's partitions (each a retrace and a new program)."""
    from executorch.backends.xnnpack import _passes

    reached: dict[str, int] = {}
    originals = {name: getattr(_passes, name).call for name in _IDLE_UNLESS}

    def counting(name):
        def call(self, graph_module, *args, **kwargs):
            reached[name] = reached.get(name, 0) + 1
            return originals[name](self, graph_module, *args, **kwargs)
        call.__qualname__ = f"{name}.call"  # the patch tells the pass by its method's owner
        return call

    def passes_run(module, args, quantize=False) -> set[str]:
        reached.clear()
        _lowered(module, args, quantize)
        return set(reached)

    for name in _IDLE_UNLESS:  # counted under the patch: the patch wraps what it finds
        setattr(getattr(_passes, name), "call", counting(name))
    try:
        on_conv = passes_run(Convish(4), (torch.randn(1, 3, 8, 8),))
        on_decoder = passes_run(Decoderish(32, 2), (torch.randn(1, 4, 32),))
        on_quantized = passes_run(Decoderish(32, 2), (torch.randn(1, 4, 32),), quantize=True)
        with without(PATCHES, "patch_xnnpack_idle_passes"):
            unpatched = passes_run(Decoderish(32, 2), (torch.randn(1, 4, 32),))
    finally:
        for name, call in originals.items():
            setattr(getattr(_passes, name), "call", call)
    # NOTE: executorch 1.4.1's XNNPACK partitioner takes PReLU decomposed (gt, mul, where), so
    # PReLUReshapePass finds no `_prelu_kernel` in a partition here, patched or not
    assert on_conv == set(_IDLE_UNLESS) - {"PReLUReshapePass", "PropagateCustomMetaPass"}
    assert on_decoder == {"ConvertToSDPAPass", "DecomposeConcatenate"}
    assert "PropagateCustomMetaPass" in on_quantized
    assert unpatched == set(_IDLE_UNLESS)


@pytest.mark.slow
def test_the_pattern_passes_check_an_op_every_pattern_holds():
    """ConvertToUpsampleBilinear2d and ConvertToSDPAPass match subgraph patterns: the op the patch
    checks for is in each of them, so a graph without it has no match (executorch 1.4.1)."""
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa

    for name, patterns in (("ConvertToUpsampleBilinear2d", list(bilinear_2d.get_graphs_dict())),
                           ("ConvertToSDPAPass", list(sdpa.get_graphs()))):
        assert patterns
        for pattern in patterns:
            assert not _op_names(pattern).isdisjoint(_IDLE_UNLESS[name]), name
