"""The ONNX optimizer's pattern matching in time linear in the graph (`patch_onnxscript_pattern_match`,
backends/onnx/patches.py): the rewriter tries every rule on every node, in each of the export's four
optimizer runs, and onnxscript 0.7.2's matcher worked before it looked at the node's op: for a
multi-output pattern (its default rules' SlicesSplit: `Slice(x), Slice(x)` -> `Split(x)`) it listed
every node of the graph on each try, for any other it set up a match first. The patched matcher
fails a node that is not the pattern's first op at once and tries as a multi-output pattern's other
outputs only the consumers of the value its output nodes share. The graph must be the one
upstream's matching makes (ops, wiring, weights, interface); the tries grow with the graph, not its
square, and a single-output rule's match is set up only on its own op; and the onnxscript internals
the patch reads must still be there."""

from __future__ import annotations

import collections
import contextlib
import inspect
import random

import pytest
import torch

rewriter = pytest.importorskip("onnxscript.rewriter")
_matcher = pytest.importorskip("onnxscript.rewriter._matcher")
pytest.importorskip("onnxruntime")

import onnx_ir as ir  # noqa: E402

from hfexport import OnnxConfig, OnnxExporter, record_of  # noqa: E402
from hfexport.builtins import load_workarounds  # noqa: E402
from hfexport.workarounds import PATCHES, applied_patches  # noqa: E402
from tests.harness import onnx_graph, without  # noqa: E402

load_workarounds("onnx")
PATCH = "patch_onnxscript_pattern_match"
#: a Llama of other sizes than the tiny preset's, drawn once: (layers, head dim, kv heads)
_DRAW = random.Random(5333)
VARIATION = (_DRAW.randint(2, 3), _DRAW.choice([8, 16, 32]), _DRAW.choice([1, 2, 4]))


@contextlib.contextmanager
def counted_tries():
    """Count the node combinations the matcher tries for multi-output patterns (`tries["n"]`) and
    the matches it sets up for single-output ones (`tries["single"]`)."""
    tries = collections.Counter()
    multi, single = _matcher.SimplePatternMatcher._multi_match, _matcher.SimplePatternMatcher._match_single_output_node

    def _multi_match(self, candidate, check_removable):
        tries["n"] += 1
        return multi(self, candidate, check_removable)

    def _match_single_output_node(self, *args, **kwargs):
        tries["single"] += 1
        return single(self, *args, **kwargs)

    _matcher.SimplePatternMatcher._multi_match = _multi_match
    _matcher.SimplePatternMatcher._match_single_output_node = _match_single_output_node
    try:
        yield tries
    finally:
        _matcher.SimplePatternMatcher._multi_match = multi
        _matcher.SimplePatternMatcher._match_single_output_node = single


def _halves_model(pairs: int, *, duplicate: bool = False, branch: bool = False, second_first: bool = False
                  ) -> ir.Model:
    """`pairs` values each split into halves by two Slices (what a rotary embedding's
    rotate_half does); `duplicate`: one more second-half Slice of the first value; `branch`: an If
    whose branch slices the first value (a node of another graph, never paired with the outer ones);
    `second_first`: each second half sliced before the first."""
    import onnx
    from onnx import TensorProto, helper

    def const(name, values):
        return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)

    nodes, outputs = [], []
    for i in range(pairs):
        nodes.append(helper.make_node("Relu" if i % 2 else "Sigmoid", ["X"], [f"x{i}"]))
        halves = [helper.make_node("Slice", [f"x{i}", "zero", "half", "last"], [f"a{i}"]),
                  helper.make_node("Slice", [f"x{i}", "half", "end", "last"], [f"b{i}"])]
        nodes += halves[::-1] if second_first else halves
        nodes.append(helper.make_node("Sub", [f"a{i}", f"b{i}"], [f"y{i}"]))  # rotate_half's halves, used
        outputs.append(f"y{i}")
    if duplicate:
        nodes.append(helper.make_node("Slice", ["x0", "half", "end", "last"], ["b0_again"]))
        nodes.append(helper.make_node("Neg", ["b0_again"], ["again"]))
        outputs.append("again")
    if branch:
        inner = helper.make_graph([helper.make_node("Slice", ["x0", "half", "end", "last"], ["inner"])], "then", [],
                                  [helper.make_tensor_value_info("inner", TensorProto.FLOAT, [2, 4])])
        other = helper.make_graph([helper.make_node("Slice", ["x0", "zero", "half", "last"], ["other"])], "else", [],
                                  [helper.make_tensor_value_info("other", TensorProto.FLOAT, [2, 4])])
        nodes.append(helper.make_node("If", ["flag"], ["chosen"], then_branch=inner, else_branch=other))
        outputs.append("chosen")
    graph = helper.make_graph(
        nodes, "halves",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 4]) for name in outputs],
        initializer=[const("zero", [0]), const("half", [4]), const("end", [8]), const("last", [-1])])
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    return ir.serde.deserialize_model(proto)


def _rewritten(model: ir.Model) -> tuple[dict, int]:
    """`model` rewritten by onnxscript's default rules (SlicesSplit among them) under the ONNX
    export's patches, and the combinations the matcher tried."""
    with counted_tries() as tries, applied_patches("onnx"):
        rewriter.rewrite(model)
    return onnx_graph(ir.serde.serialize_model(model)), tries["n"]


@pytest.mark.parametrize("case", [dict(pairs=1), dict(pairs=6), dict(pairs=3, duplicate=True),
                                  dict(pairs=2, branch=True), dict(pairs=3, second_first=True),
                                  dict(pairs=2, second_first=True, duplicate=True, branch=True)])
def test_the_rewritten_graph_is_the_one_upstream_matching_makes(case):
    patched, tries = _rewritten(_halves_model(**case))
    with without(PATCHES, "patch_onnxscript_pattern_match"):
        upstream, upstream_tries = _rewritten(_halves_model(**case))
    # the same graph. In onnxscript 0.7.2 a Slice's first candidate partner is the earliest Slice of
    # its input: itself when the first half comes first, which SlicesSplit's check refuses (the
    # Slices stay: an export's rotary embeddings), the second half when it comes first (a Split).
    # The patch tries the consumers in the order they took the value: the graph's, unless a rewrite
    # added one later
    assert patched == upstream
    splits = sum(op[1] == "Split" for op in patched["ops"])
    assert splits == (case["pairs"] if case.get("second_first") else 0)
    assert tries <= upstream_tries


def test_the_tries_grow_with_the_graph_not_its_square():
    tries = {pairs: _rewritten(_halves_model(pairs))[1] for pairs in (4, 16)}
    assert tries[16] <= 4 * tries[4] + 4  # linear: a Slice's partner is among its value's two consumers
    with without(PATCHES, "patch_onnxscript_pattern_match"):  # still needed
        upstream = {pairs: _rewritten(_halves_model(pairs))[1] for pairs in (4, 16)}
    assert upstream[16] >= 12 * upstream[4]  # every node tried against every Slice


def _decode(num_layers: int, head_dim: int, kv_heads: int):
    """A Llama's LLM decode graph (ONNX Runtime's fusions, its GroupQueryAttention) through the public
    API, and the combinations the matcher tried. Not validated here: the graph is compared with the
    one upstream's matching makes, and every ONNX export of the suite, this patch on, is run against
    eager in ONNX Runtime."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
                         num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=head_dim,
                         max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(3, 96, (1, 5)), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
    with counted_tries() as tries:
        programs = OnnxExporter().export_for_generation(model, inputs, OnnxConfig(dynamic=True, validate=False))
    return programs["decode"], tries


@pytest.mark.slow
def test_a_drawn_llama_decode_is_the_graph_upstream_matching_makes():
    patched, tries = _decode(*VARIATION)
    with without(PATCHES, "patch_onnxscript_pattern_match"):
        upstream, upstream_tries = _decode(*VARIATION)
    assert onnx_graph(patched) == onnx_graph(upstream), VARIATION
    assert PATCH in record_of(patched).details["patches"]
    assert record_of(patched).details["ort_fusions"]["group_query_attention"]
    assert 0 < tries["n"] < upstream_tries["n"]
    # single-output rules: a match set up only where the node is the rule's op (a few in a hundred)
    assert 0 < tries["single"] < upstream_tries["single"] / 10, (tries, upstream_tries)


def test_the_onnxscript_internals_read_from_0_7_2_are_there():
    source = inspect.getsource(_matcher.SimplePatternMatcher.match)
    assert "op_to_nodes" in source and "itertools.product(*candidates)" in source  # what the patch replaces
    assert list(inspect.signature(_matcher.SimplePatternMatcher._multi_match).parameters) == [
        "self", "candidate", "check_removable"]
    assert callable(_matcher.SimplePatternMatcher._init_match)
    assert list(inspect.signature(_matcher.SimplePatternMatcher._match_single_output_node).parameters) == [
        "self", "model", "graph_or_function", "node", "check_removable"]
    # upstream's first check of a node is its op, then its domain, each failing with the reason the patch gives
    from onnxscript.rewriter import _pattern_ir

    checks = inspect.getsource(_pattern_ir.NodePattern.matches)
    assert checks.index("self.op.matches(node.op_type)") < checks.index("self.domain.matches(node.domain)")
    assert 'f"OpType mismatch: expected {self.op}, got {node.op_type}."' in checks
    assert list(inspect.signature(_matcher.SimplePatternMatcher.match).parameters) == [
        "self", "model", "graph_or_function", "node", "verbose", "remove_nodes", "tracer"]
    x = next(iter(_halves_model(1).graph)).outputs[0]
    assert sorted((use.node.op_type, use.idx) for use in x.uses()) == [("Slice", 0), ("Slice", 0)]
