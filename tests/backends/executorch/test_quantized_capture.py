"""The quantized ExecuTorch capture takes the inputs the first capture takes.

An FX-stage quantizer re-exports `program.module()`. torch 2.13 leaves the program's guards out of
that module (its `_guards_fn`) when a caller's file path holds "executorch" or "torchao"
(`torch/export/_unlift.py`, `_ok_to_generate_guards_fn`), and `ExecutorchExporter` is such a
caller: a size the model fixed with a Python check (Whisper's encoder takes exactly
`2 * max_source_positions` frames) came back symbolic, and XNNPACK refused the convolution's
unsqueeze ("reshape only supports 1 dynamic dimension"); two lengths a check ties came back two.
`patch_torch_export_guards_fn` keeps the guards while the quantizer runs; the quantize step refuses
a program whose input shapes differ from the capture's (`steps._check_kept_shapes`).
"""

from __future__ import annotations

import threading

import pytest
import torch

from hfexport.capture.dynamic import shape_differences
from hfexport.quantization import patches as quantization_patches  # noqa: F401 - registers the patch
from hfexport.workarounds import PATCHES
from tests.harness import require_backend, without


class Frames(torch.nn.Module):
    """Whisper's encoder front in small: a Python check pins the frames, a stride-2 conv halves them,
    a positional table of the halved length is added."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv1d(8, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv1d(32, 32, 3, stride=2, padding=1)
        self.positions = torch.nn.Embedding(16, 32)
        self.out = torch.nn.Linear(32, 32)

    def forward(self, input_features):
        if input_features.shape[-1] != 32:
            raise ValueError("Frames takes 32 frames")
        hidden = torch.nn.functional.gelu(self.conv1(input_features))
        hidden = torch.nn.functional.gelu(self.conv2(hidden)).permute(0, 2, 1)
        return self.out(hidden + self.positions.weight)


class Tied(torch.nn.Module):
    """Two inputs whose lengths only a Python check ties (no graph op relates them)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, input_features, attention_mask):
        if input_features.shape[1] != attention_mask.shape[1]:
            raise ValueError("one mask entry per frame")
        return self.proj(input_features).sum(1) + attention_mask.sum(1, keepdim=True)


def test_torch_drops_the_guards_of_module_for_a_caller_under_executorch():
    """The upstream behaviour `patch_torch_export_guards_fn` works around: the day it changes, this
    fails (and the patch can go)."""
    program = torch.export.export(Frames().eval(), (), {"input_features": torch.randn(2, 8, 32)},
                                  dynamic_shapes={"input_features": {0: torch.export.Dim.AUTO,
                                                                     2: torch.export.Dim.AUTO}})
    assert program._guards_code == ["L['input_features'].size()[2] == 32"]
    got: dict[str, torch.nn.Module] = {}
    for caller in ("/work/caller.py", "/site-packages/executorch/caller.py"):
        # in a thread of its own: the rule reads every frame of the stack, and this file's path holds "executorch"
        scope = {"program": program}
        code = compile("module = program.module()", caller, "exec")
        thread = threading.Thread(target=exec, args=(code, scope))
        thread.start()
        thread.join()
        got[caller] = scope["module"]
    assert hasattr(got["/work/caller.py"], "_guards_fn")
    assert not hasattr(got["/site-packages/executorch/caller.py"], "_guards_fn")


@pytest.mark.parametrize(("after", "found"), [
    ([("s7", 8, 32), ("s7", "s9")], None),  # renamed symbols only
    ([("s7", 8, "s8"), ("s7", "s9")], "input_features, axis 2: 32 in the capture, s8 now"),
    ([("s7", 8, 32), ("s7", "s7")], "axes sharing a size"),
    ([("s7", 8, 32), ("s8", "s9")], "axes sharing a size"),
])
def test_shape_differences(after, found):
    differences = shape_differences(["input_features", "mask"], [("s0", 8, 32), ("s0", "s1")], after)
    assert (found is None and differences == []) or any(found in d for d in differences), differences


def _exported(module: torch.nn.Module, inputs: dict[str, torch.Tensor], scheme: str | None):
    from hfexport import ExecutorchConfig
    from hfexport.auto import AutoHfExporter
    from hfexport.quantizers import quantizer_for

    require_backend("executorch")
    pytest.importorskip("torchao")
    config = ExecutorchConfig(dynamic=True, quantizer=scheme and quantizer_for("executorch", scheme))
    return AutoHfExporter.from_config(config).export(module, inputs, config)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["int8-dynamic", "int8-dynamic-int4-weights"])
def test_a_size_the_model_fixes_stays_fixed_in_the_quantized_program(scheme):
    """The program takes what the fp32 one takes and runs close to eager at a batch of 1 and of 3;
    without the patch the frames came out symbolic, which the quantize step refuses (the conversion
    failed in XNNPACK before it did)."""
    from hfexport.capture.record import record_of
    from hfexport.errors import QuantizationError
    from hfexport.runner import runner_for

    torch.manual_seed(0)
    model, inputs = Frames().eval(), {"input_features": torch.randn(1, 8, 32)}
    artifact = _exported(model, inputs, scheme)
    record = record_of(artifact)
    assert record.input_shapes == record_of(_exported(model, inputs, None)).input_shapes
    assert record.input_shapes[0][1:] == (8, 32)
    assert record.details["quantization"]["delegated_quantized_matmuls"] > 0, record.details["quantization"]
    for batch in (1, 3):
        features = torch.randn(batch, 8, 32)
        got = runner_for(artifact, record).run([features])[0]
        with torch.no_grad():
            want = model(features)
        cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
        assert got.shape == want.shape and cosine >= 0.99, (batch, float(cosine))  # measured 0.99998, 0.998 (8da4w)
    assert "patch_torch_export_guards_fn" in record.details["patches"]
    with without(PATCHES, "patch_torch_export_guards_fn"), \
            pytest.raises(QuantizationError, match="input_features, axis 2: 32 in the capture, s[0-9]+ now"):
        _exported(model, inputs, scheme)  # still needed


@pytest.mark.parametrize("scheme", ["int8-dynamic", "int8-dynamic-int4-weights"])
def test_a_tie_a_python_check_makes_stays_in_the_quantized_program(scheme):
    """Two lengths a Python check ties: one symbol in the capture and in the quantized program;
    without the patch two, a program that would take inputs the model refuses, refused."""
    from hfexport.capture.record import record_of
    from hfexport.errors import QuantizationError

    inputs = {"input_features": torch.randn(2, 6, 32), "attention_mask": torch.ones(2, 6)}
    shapes = record_of(_exported(Tied().eval(), inputs, scheme)).input_shapes
    assert shapes[0][1] == shapes[1][1] and isinstance(shapes[0][1], str), shapes
    with without(PATCHES, "patch_torch_export_guards_fn"), \
            pytest.raises(QuantizationError, match="other input shapes than the captured one: axes sharing a size") \
            as caught:
        _exported(Tied().eval(), inputs, scheme)
    assert "dynamic_shapes" in caught.value.remedy
