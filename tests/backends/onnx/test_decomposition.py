"""One retrace for an ONNX export of a program that writes its inputs in place
(`backends/onnx/decomposition.py`, `patch_torch_onnx_decompose_once`): the capture functionalizes
with torch.onnx's own decomposition table, and the conversion takes that program as it is. The
graph must be the one the two retraces made (the same ops, attributes, weights and interface; only
intermediate value names differ, each retrace renumbering its nodes), checked against eager in ONNX
Runtime; a program the mark does not fit is decomposed by torch.onnx as before; and the torch.onnx
internals the backend reads (torch 2.13.0) must still be there."""

from __future__ import annotations

import collections
import contextlib
import inspect

import pytest
import torch

pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

from hfexport import OnnxConfig, OnnxExporter, record_of  # noqa: E402
from hfexport.backends.onnx.decomposition import (  # noqa: E402
    decomposed_for_onnx, decomposition_table, is_decomposed_for, onnx_registry)
from hfexport.builtins import load_workarounds  # noqa: E402
from hfexport.exporter import HfExporter  # noqa: E402
from hfexport.presets import build_preset  # noqa: E402
from hfexport.workarounds import PATCHES  # noqa: E402
from tests.harness import onnx_graph, without  # noqa: E402

load_workarounds("onnx")


@contextlib.contextmanager
def counted_retraces():
    """Count `ExportedProgram.run_decompositions` calls in the block (`calls["n"]`)."""
    calls = collections.Counter()
    original = torch.export.ExportedProgram.run_decompositions

    def run_decompositions(self, *args, **kwargs):
        calls["n"] += 1
        return original(self, *args, **kwargs)

    torch.export.ExportedProgram.run_decompositions = run_decompositions
    try:
        yield calls
    finally:
        torch.export.ExportedProgram.run_decompositions = original


def _static_decode(preset: str, *, validate: bool = False):
    """`preset`'s static-cache decode (multi-token, cache 32) exported to ONNX through the public
    API, with the number of retraces it took: `(ONNXProgram, retraces)`."""
    from transformers import GenerationConfig

    model, inputs = build_preset(preset)
    generation = GenerationConfig(cache_implementation="static", max_cache_len=32)
    with counted_retraces() as calls:
        programs = OnnxExporter().export_for_generation(model, inputs, OnnxConfig(dynamic=True, validate=validate),
                                                        generation_config=generation, multi_token_decode=True)
    assert list(programs) == ["decode"]
    return programs["decode"], calls["n"]


@contextlib.contextmanager
def as_before():
    """The export as it was: the capture functionalizes with no decomposition, torch.onnx decomposes."""
    with without(PATCHES, "patch_torch_onnx_decompose_once"), \
            pytest.MonkeyPatch.context() as patch:
        patch.setattr(OnnxExporter, "_functionalize", HfExporter._functionalize)
        yield


def _record(program) -> dict:
    """The record less what differs between any two exports (seconds, the patches reached) and what
    validation adds (the export as before is not validated, to save time)."""
    record = record_of(program)
    summary = {k: v for k, v in record.summary().items()
               if k not in ("patches", "export_seconds", "stage_seconds", "validation", "ort_session")}
    summary["config"] = {k: v for k, v in summary["config"].items() if k != "validate"}
    return {**summary, "symbol_ranges": record.symbol_ranges, "input_dtypes": record.input_dtypes,
            "input_keys": record.input_keys}


@pytest.mark.slow
def test_a_static_cache_decode_is_retraced_once():
    _, retraces = _static_decode("llama")
    assert retraces == 1
    with without(PATCHES, "patch_torch_onnx_decompose_once"):
        _, retraces = _static_decode("llama")
    assert retraces == 2  # the capture's decomposition, then torch.onnx's again


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["llama", "gemma2", "qwen3"])
def test_the_graph_and_record_are_those_the_two_retraces_made(preset):
    # gemma2: sliding and full layers, soft-capped logits; qwen3: q/k norms
    once, _ = _static_decode(preset, validate=True)  # and against eager in ONNX Runtime
    with as_before():
        twice, retraces = _static_decode(preset)
    assert retraces == 2
    assert onnx_graph(once) == onnx_graph(twice)
    assert _record(once) == _record(twice)
    assert "patch_torch_onnx_decompose_once" in record_of(once).details["patches"]


class _WritesItsInput(torch.nn.Module):
    def forward(self, cache, index, x):
        cache.index_copy_(1, index, torch.nn.functional.gelu(x, approximate="tanh"))
        return cache.sum(dim=1)


def _writing_program() -> torch.export.ExportedProgram:
    inputs = (torch.zeros(2, 6, 4), torch.tensor([1, 3]), torch.randn(2, 2, 4))
    return torch.export.export(_WritesItsInput(), inputs)


def test_the_conversion_decomposes_a_program_the_mark_does_not_fit():
    registry = onnx_registry(18)
    program = _writing_program()
    assert not is_decomposed_for(program, registry)  # torch.export's program: not decomposed
    decomposed = decomposed_for_onnx(program, registry)
    assert is_decomposed_for(decomposed, registry)
    assert decomposed.graph_signature.user_inputs_to_mutate  # functionalized: the write is in the signature
    assert not any(node.target is torch.ops.aten.index_copy_.default for node in decomposed.graph.nodes)
    # a registry that translates one more op decomposes one op less: another table, so decomposed again
    other = type(registry).from_torchlib(opset_version=18)
    assert is_decomposed_for(decomposed, other)  # built the same way: the same table
    decomposed_op = next(op for op in decomposition_table(registry) if isinstance(op, torch._ops.OpOverload))
    other.register_op(decomposed_op, lambda *args: None)
    assert not is_decomposed_for(decomposed, other)
    seen = []
    patched = PATCHES.get("patch_torch_onnx_decompose_once").factory(lambda p, r: seen.append(p) or p)
    assert patched(decomposed, registry) is decomposed and not seen
    patched(decomposed, other)
    patched(program, registry)
    assert seen == [decomposed, program]


def test_an_fx_quantizer_sees_the_program_torch_export_wrote():
    from hfexport.quantization.pt2e import PT2EQuantizer

    program = _writing_program()
    config = OnnxConfig(quantizer=PT2EQuantizer("int8-dynamic"))
    functional = OnnxExporter()._functionalize(program, True, config)
    assert not is_decomposed_for(functional, onnx_registry(18))
    assert is_decomposed_for(OnnxExporter()._functionalize(program, True, OnnxConfig()), onnx_registry(18))


def test_the_torch_onnx_internals_read_from_torch_2_13_are_there():
    from torch.onnx._internal.exporter import _compat, _constants, _core, _decomp, _fx_passes, _registration

    assert callable(_decomp.get_onnx_implemented_overloads) and callable(_decomp.create_onnx_friendly_decomposition_table)
    assert isinstance(_constants.TORCHLIB_OPSET, int)
    assert {"registry", "input_names", "output_names", "optimize", "opset_version"} <= set(
        inspect.signature(_core.export).parameters)
    assert list(inspect.signature(_fx_passes.decompose_with_registry).parameters) == ["exported_program", "registry"]
    # the patched function is the one the conversion calls, through its module
    assert "_fx_passes.decompose_with_registry(" in inspect.getsource(_core._prepare_exported_program_for_export)
    # torch.onnx.export builds its registry as `onnx_registry` does, then calls `_core.export` with it
    compat = inspect.getsource(_compat.export_compat)
    assert "from_torchlib(" in compat and "register_op(torch_op, onnx_op, is_complex=False)" in compat
    assert "_core.export(" in compat
    assert hasattr(_registration.ONNXRegistry, "register_op")


def _torchlib_list_and_parses() -> tuple[list[tuple], int]:
    """onnxscript's torchlib list as torch.onnx builds its registry from it, under the ONNX export's
    patches (`applied_patches("onnx")`), and how many function sources were parsed meanwhile."""
    from onnxscript._framework_apis import torch_2_11
    from onnxscript._internal import ast_utils
    from onnxscript.function_libs.torch_lib import ops  # noqa: F401 - its import compiles the scripted ones

    from hfexport.workarounds import applied_patches

    parses = collections.Counter()
    parse = ast_utils.get_src_and_ast

    def counted(*args, **kwargs):
        parses["n"] += 1
        return parse(*args, **kwargs)

    ast_utils.get_src_and_ast = counted
    try:
        with applied_patches("onnx"):
            metas = torch_2_11.get_torchlib_ops()
    finally:
        ast_utils.get_src_and_ast = parse
    return [(m.qualified_name, m.function, m.domain, m.name, m.is_complex) for m in metas], parses["n"]


def test_the_registrys_torchlib_list_is_the_same_without_parsing_the_traced_functions():
    """`patch_onnxscript_torchlib_domains`: onnxscript 0.7.2's `get_torchlib_ops` parsed each traced
    function's source for its domain alone (`function_ir`, 497 of them); patched, the list names the
    same functions with the same domains and nothing is parsed, and `function_ir` parses again after."""
    from onnxscript._internal.values import TracedOnnxFunction

    listed, parses = _torchlib_list_and_parses()
    with without(PATCHES, "patch_onnxscript_torchlib_domains"):  # still needed
        upstream, upstream_parses = _torchlib_list_and_parses()
    assert listed == upstream
    assert parses == 0 and upstream_parses >= 400
    traced = next(m[1] for m in listed if isinstance(m[1], TracedOnnxFunction))
    assert traced.function_ir.domain == traced.opset.domain and hasattr(traced.function_ir, "to_function_proto")
