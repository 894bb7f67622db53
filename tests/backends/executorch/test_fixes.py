"""ExecuTorch's workarounds, each on a minimal module: sym_min without one, Qwen2-VL's patch
embedding as a Linear, and the XNNPACK quantizer's integer scalars."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch")

from hfexport import DynamoConfig, DynamoExporter, ExecutorchConfig, ExecutorchExporter, record_of, validate  # noqa: E402
from hfexport.backends.executorch import patches  # noqa: E402,F401 - registers the fix taken out below
from hfexport.errors import ConversionError, QuantizationError  # noqa: E402
from hfexport.runner import runner_for  # noqa: E402
from hfexport.models import qwen2_vl  # noqa: E402,F401
from hfexport.quantization import patches as quantization_patches  # noqa: E402,F401
from hfexport.workarounds import FX_NODE_FIXES, PATCHES  # noqa: E402
from tests.harness import without  # noqa: E402

pytestmark = pytest.mark.slow  # every test lowers to ExecuTorch or runs the PT2E quantizer


class _Shortest(torch.nn.Module):
    """Both inputs cut to the shorter one's length: `torch.sym_min` of two symbolic sizes."""

    def forward(self, a, b):
        length = torch.sym_min(a.shape[0], b.shape[0])
        return (a[:length] + b[:length],)


def test_sym_min_runs_in_executorch_at_other_sizes():
    """`torch.sym_min` of two symbolic sizes reaches the edge program as the Python function, which
    `to_executorch` maps to ExecuTorch's prim op. The edge verifier refused it (AssertionError, no
    message) while hfexport lowered with ExecuTorch's IR checks on, and a fix retargeted it; the
    checks are off now (`edge_check.py`), and the program gives eager's rows at other sizes."""
    from executorch.runtime import Runtime

    module, inputs = _Shortest(), {"a": torch.randn(5, 4), "b": torch.randn(3, 4)}
    program = ExecutorchExporter().export(module, inputs, config=ExecutorchConfig(dynamic=True))
    method = Runtime.get().load_program(program.buffer).load_method("forward")
    g = torch.Generator().manual_seed(0)
    for rows in ((7, 2), (2, 9), (4, 4)):
        a, b = (torch.randn(n, 4, generator=g) for n in rows)
        (got,), (want,) = method.execute([a, b]), module(a, b)
        assert got.shape == want.shape == (min(rows), 4) and torch.equal(got, want)


class _PatchEmbedding(torch.nn.Module):
    """Qwen2-VL's patch embedding (a Conv3d whose kernel is one 2 x 4 x 4 patch), as the tiny preset has it."""

    def __init__(self):
        super().__init__()
        from transformers.models.qwen2_vl.modeling_qwen2_vl import PatchEmbed

        self.embed = PatchEmbed(patch_size=4, temporal_patch_size=2, in_channels=3, embed_dim=32)

    def forward(self, hidden_states):
        return (self.embed(hidden_states),)


def test_the_patch_embedding_runs_as_a_linear():
    """Without the patch the Conv3d is left to the portable kernel, which takes 3-D or 4-D input only
    (error 0x12 at run time)."""
    module = _PatchEmbedding().eval()
    inputs = {"hidden_states": torch.randn(24, 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(0))}
    config = ExecutorchConfig(dynamic=True)
    report = validate(ExecutorchExporter().export(module, inputs, config=config), module, inputs)
    assert report.passed, report.to_table()
    with without(PATCHES, "patch_qwen2_vl_patch_embed"):
        report = validate(ExecutorchExporter().export(module, inputs, config=config), module, inputs)
    assert not report.passed and "0x12" in (report.cases[0].error or "")  # still needed


class _IndexedByArange(torch.nn.Module):
    """Columns picked by `arange(n) + 0`, the integer add of transformers' mask and position code."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return (self.proj(x)[:, torch.arange(4) + 0],)


def test_the_xnnpack_quantizer_keeps_integer_scalars_integer():
    """A quantize-stage patch: swapped in only around the PT2E quantizer, the same for the
    `torch.export` and ExecuTorch formats (the former is the faster to show it)."""
    from hfexport.quantization import PT2EQuantizer

    module, inputs = _IndexedByArange().eval(), {"x": torch.randn(2, 8)}
    config = DynamoConfig(quantizer=PT2EQuantizer("int8-dynamic"))
    DynamoExporter().export(module, inputs, config=config)
    with without(PATCHES, "patch_xnnpack_quantizer_integer_scalars"), \
            pytest.raises(QuantizationError, match="tensors used as indices must be long"):
        DynamoExporter().export(module, inputs, config=config)  # still needed


def _delegated_weight_pointers(model: torch.nn.Module, inputs: tuple) -> set[int]:
    """The storage addresses of the weights XNNPACK's `preprocess` is given, lowering `model` with
    hfexport's ExecuTorch patches applied."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.exir import to_edge_transform_and_lower

    from hfexport.workarounds import applied_patches

    seen: set[int] = set()
    original = XnnpackBackend.preprocess

    def preprocess(edge_program, compile_specs):
        seen.update(t.untyped_storage().data_ptr() for t in edge_program.state_dict.values())
        return original(edge_program, compile_specs)

    XnnpackBackend.preprocess = staticmethod(preprocess)
    try:
        with applied_patches("executorch"):
            to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])
    finally:
        XnnpackBackend.preprocess = original
    return seen


def test_the_lowering_shares_the_weights_of_the_program_it_copies():
    """ExecuTorch's lowering deep-copies each partition's program before XNNPACK preprocesses it
    (executorch 1.4.1): without the patch every delegated weight is copied once more (1x of the
    weights for the whole lowering, anonymous for a checkpoint's mapped weights)."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    inputs = (torch.randn(2, 64),)
    assert weights <= _delegated_weight_pointers(model, inputs)
    with without(PATCHES, "patch_lowering_shares_weights"):
        assert not weights & _delegated_weight_pointers(model, inputs)


def _filed_by_reference(program) -> list:
    """The `.ptd` pieces of `program` that are views of weights (not copies): `_WeightBytes`."""
    from hfexport.backends.executorch.compat import data_payloads

    return [piece for cord in data_payloads(program).values() for piece in cord._buffers
            if isinstance(piece, patches._WeightBytes)]


def test_the_ptd_is_written_from_the_weights_themselves(tmp_path):
    """XNNPACK files each constant it serializes as bytes(...) of its storage, held until the
    `.ptd` is written (executorch 1.4.1): without the patch every delegated weight is copied. With
    it, a weight over a page is filed as a view of the model's own tensor, and the program,
    validated in memory and loaded from its files, matches eager."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 8)).eval()
    inputs = {"input": torch.randn(2, 256)}
    config = ExecutorchConfig(dynamic=True, external_weights=True)
    exporter = ExecutorchExporter()
    program = exporter.export(model, inputs, config=config)
    by_reference = _filed_by_reference(program)
    # every weight and the first bias (8 KiB); the second bias (32 bytes, under a page) is copied
    assert ({piece._raw.data_ptr() for piece in by_reference}
            == {t.data_ptr() for t in (model[0].weight, model[0].bias, model[2].weight)})
    report = validate(program, model, inputs, atol=1e-5)
    assert report.passed, report.to_table()
    files = exporter.save(program, tmp_path)
    with torch.no_grad():
        expected = model(inputs["input"])
    loaded = runner_for(exporter.load(files), record_of(program))
    assert (loaded.run(record_of(program).artifact_inputs(inputs))[0] - expected).abs().max() < 1e-5
    with without(PATCHES, "patch_lowering_shares_weights"):
        assert not _filed_by_reference(exporter.export(model, inputs, config=config))


class _CacheReadThroughCopies(torch.nn.Module):
    """BLOOM's decode in small: the updated key cache returned, and read through identity copies
    by an op XNNPACK does not take (BLOOM's `baddbmm`; `cumsum` here)."""

    def forward(self, past, new):
        keys = torch.cat([past, new.transpose(1, 2)], dim=-2)
        return keys, keys.clone().clone().cumsum(-1)


def test_identity_copies_between_a_partition_and_the_portable_ops_are_dropped():
    """XNNPACK removed the copies inside its partition, which then listed the cache twice among its
    outputs: "Output node 'aten_cat_default' is already in the inputs" (executorch 1.4.1), BLOOM's
    decode on ExecuTorch. Dropped before partitioning, the program lowers and equals eager."""
    from hfexport.backends.executorch import exporter

    module = _CacheReadThroughCopies()
    inputs = {"past": torch.randn(1, 2, 4, 8), "new": torch.randn(1, 3, 2, 8)}
    program = ExecutorchExporter().export(module, inputs, config=ExecutorchConfig(dynamic=True))
    report = validate(program, module, inputs)
    assert report.passed, report.to_table()
    with pytest.MonkeyPatch.context() as patch, pytest.raises(ConversionError, match="already in the inputs"):
        patch.setattr(exporter, "drop_identity_copies", lambda: (lambda graph_module: None))
        ExecutorchExporter().export(module, inputs, config=ExecutorchConfig(dynamic=True))  # still needed


class _NormBetweenLinears(torch.nn.Module):
    """Transformers' Llama RMSNorm between two linears: its mean is over the last dim of [1, tokens, hidden]."""

    def __init__(self):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        self.a, self.norm, self.b = torch.nn.Linear(32, 32), LlamaRMSNorm(32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return (self.b(self.norm(self.a(x))),)


def test_an_rmsnorm_mean_runs_inside_the_xnnpack_partition():
    """One XNNPACK partition with the fix, two without (the mean left to the portable kernel
    between them); the program matches eager at other token counts too."""
    torch.manual_seed(0)
    module, inputs = _NormBetweenLinears().eval(), {"x": torch.randn(1, 5, 32)}
    config = ExecutorchConfig(dynamic=True, dynamic_shapes={"x": {1: torch.export.Dim("tokens", min=1, max=64)}})
    program = ExecutorchExporter().export(module, inputs, config=config)
    record = record_of(program)
    assert "fix_mean_last_dim_as_global_pooling" in record.details["fx_fixes"]
    assert record.details["delegation"]["delegates"] == 1, record.details["delegation"]
    report = validate(program, module, inputs)
    assert report.passed and any(case.label != "sample" for case in report.cases), report.to_table()
    with without(FX_NODE_FIXES, "fix_mean_last_dim_as_global_pooling"):
        unfixed = ExecutorchExporter().export(module, inputs, config=config)
    assert record_of(unfixed).details["delegation"]["delegates"] == 2  # still needed
