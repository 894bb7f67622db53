"""Patches and FX fixes for the ONNX backend.

ATen ops torch.onnx does not translate get a translation in `translations.py`; the workarounds
every format needs are in `hfexport/models/` (`hfexport patches --format onnx` lists them).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from ...workarounds import register_patch
from .decomposition import is_decomposed_for

__all__ = ["patch_torch_onnx_decompose_once", "patch_onnxscript_pattern_match", "patch_onnxscript_torchlib_domains"]


@register_patch(
    ("onnx",),
    "torch.onnx._internal.exporter._fx_passes.decompose_with_registry",
    reason="torch.onnx retraces every program it converts with run_decompositions; a program that writes "
    "its inputs in place (a static cache) was already retraced at capture to functionalize it, so it was "
    "retraced twice (4 + 6 s on an 8-layer Llama). The ONNX exporter now functionalizes it with torch.onnx's "
    "own decomposition table (decomposition.decomposed_for_onnx), and torch.onnx takes a program so "
    "decomposed for its registry as it is; the ONNX graph is the same. Remove once torch.onnx can be "
    "given a program it need not decompose",
    upstream="torch 2.13.0 torch/onnx/_internal/exporter/_core.py _prepare_exported_program_for_export "
    "(decompose_with_registry on every program, decomposed or not)",
    seen_with={"torch": "2.13.0"},
    remove_when="torch>2.13.0",
)
def patch_torch_onnx_decompose_once(original):
    """`decompose_with_registry` that returns a program `decomposed_for_onnx` made for this
    registry's table unchanged, and decomposes any other."""
    @functools.wraps(original)
    def decompose_with_registry(exported_program, registry):
        if is_decomposed_for(exported_program, registry):
            return exported_program
        return original(exported_program, registry)

    return decompose_with_registry


@register_patch(
    ("onnx",),
    "onnxscript._framework_apis.torch_2_11.get_torchlib_ops",
    reason="torch.onnx builds its operator registry from onnxscript's torchlib once per process, and "
    "onnxscript reads each function's domain from its `function_ir`, which for the 497 traced functions "
    "parses the function's source into ONNX IR on every access (0.3-0.5 s of every ONNX export, for a "
    "field that is the function's opset's domain). The traced functions' domain is read from their "
    "opset while the registry's list is made; the list is the same (every domain equal, tested)",
    upstream="onnxscript 0.7.2 onnxscript/_framework_apis/torch_2_5.py get_torchlib_ops "
    "(`overload_func.function_ir.domain`) and onnxscript/_internal/values.py TracedOnnxFunction.function_ir "
    "(not cached)",
    seen_with={"onnxscript": "0.7.2"},
    remove_when="onnxscript>0.7.2",
)
def patch_onnxscript_torchlib_domains(original):
    """`get_torchlib_ops` with a traced function's `function_ir` standing for its opset's domain alone
    while the list is made (the only field of it read there)."""
    import types

    from onnxscript._internal.values import TracedOnnxFunction

    @functools.wraps(original)
    def get_torchlib_ops():
        parsed = TracedOnnxFunction.__dict__["function_ir"]
        TracedOnnxFunction.function_ir = property(lambda self: types.SimpleNamespace(domain=self.opset.domain))
        try:
            return original()
        finally:
            TracedOnnxFunction.function_ir = parsed

    return get_torchlib_ops


@register_patch(
    ("onnx",),
    "onnxscript.rewriter._matcher.SimplePatternMatcher.match",
    reason="onnxscript's matcher is tried by the rewriter on every node of the graph for every rule, in each of "
    "the export's four optimizer runs, and works before it looks at the node's op: for a pattern with several "
    "output nodes (its default rules' SlicesSplit: Slice(x), Slice(x) -> Split(x)) it lists every node of the "
    "graph on each try, the graph's size squared (SmolLM2-135M's ONNX export, 30 layers: ~40 of its 110 s), "
    "and for any other it sets up a match first (1.1 million tries, ~8 s of the same export once the first "
    "was fixed). A node that is not the pattern's first op now fails at once, with the failure upstream "
    "returns there; a multi-output pattern's other output nodes must consume the value the first one "
    "consumes where the pattern says so (a pattern value binds one graph value), so they are looked for "
    "among that value's consumers; a pattern whose output nodes share no input is matched as before. The "
    "graph is the same (tests/backends/onnx/test_pattern_match.py)",
    upstream="onnxscript 0.7.2 onnxscript/rewriter/_matcher.py SimplePatternMatcher.match (the multi-output "
    "branch builds op_to_nodes from the whole graph on every call; the single-output one checks the op in "
    "_match_node, after _init_match)",
    seen_with={"onnxscript": "0.7.2"},
    remove_when="onnxscript>0.7.2",
)
def patch_onnxscript_pattern_match(original):
    """`SimplePatternMatcher.match` failing at once a node that is not the pattern's (first) output
    op, and trying as a multi-output pattern's other output nodes only the consumers of a value the
    first output node shares with them (`_sharing_candidates`)."""
    import onnx_ir as ir
    from onnxscript.rewriter import _basics

    @functools.wraps(original)
    def match(self, model, graph_or_function, node, *, verbose=0, remove_nodes=True, tracer=None):
        first = self.pattern.output_nodes[0] if self.pattern.output_nodes else None
        if first is None:  # a pattern whose output is one of its inputs: upstream's own path
            return original(self, model, graph_or_function, node, verbose=verbose, remove_nodes=remove_nodes,
                            tracer=tracer)
        if tracer is None and not first.op.matches(node.op_type):
            # the rewriter tries every rule on every node, and upstream's first check of the node
            # (`NodePattern.matches`, 0.7.2) fails here, with this reason; traced, upstream's own path
            # runs, for its failure records
            return _basics.MatchResult().fail(f"OpType mismatch: expected {first.op}, got {node.op_type}.", node)
        if self.pattern.has_single_output_node:
            return original(self, model, graph_or_function, node, verbose=verbose, remove_nodes=remove_nodes,
                            tracer=tracer)
        if tracer is None and not first.domain.matches(node.domain):
            return _basics.MatchResult().fail(f"Domain mismatch: expected {first.domain}, got {node.domain}.", node)
        graph = graph_or_function if isinstance(graph_or_function, ir.Graph) else graph_or_function.graph
        others = _sharing_candidates(self.pattern.output_nodes, node, graph)
        if others is None:
            return original(self, model, graph_or_function, node, verbose=verbose, remove_nodes=remove_nodes,
                            tracer=tracer)
        # NOTE: upstream's multi-output loop (onnxscript 0.7.2 `SimplePatternMatcher.match`) over the
        # narrowed candidates, with the matcher's private state set as it sets it
        self._tracer = tracer
        self._graph = graph
        match = None
        for combination in itertools.product([node], *others):
            self._init_match(verbose)
            match = self._multi_match(combination, check_removable=remove_nodes)
            if match:
                return match
        return _basics.MatchResult().fail("No match found.") if match is None else match

    return match


def _sharing_candidates(pattern_nodes: Any, node: Any, graph: Any) -> list[list[Any]] | None:
    """For each output node of a pattern after the first, the nodes of `graph` that can match it
    when `node` matches the first: those of its op consuming, at the pattern's input position, the
    value `node` consumes where the first pattern node takes the same pattern value, in the order
    they took it (the graph's order, as upstream tries them, unless a rewrite added a consumer
    later: then a match upstream finds second may be found first). None when a pattern node shares
    no such value with the first (or `node` lacks it): every node of its op is then a candidate, as
    upstream tries."""
    from onnxscript.rewriter import _pattern_ir

    first = pattern_nodes[0]
    candidates = []
    for pattern_node in pattern_nodes[1:]:
        op = pattern_node.op_identifier()
        shared = next(((q, p) for p, value in enumerate(pattern_node.inputs)
                       for q, first_value in enumerate(first.inputs)
                       if value is not None and value is first_value
                       and not isinstance(value, _pattern_ir.AnyValue)), None)
        if op is None or shared is None:
            return None
        q, p = shared
        value = node.inputs[q] if q < len(node.inputs) else None
        if value is None:
            return None
        consumers = {use.node: None for use in value.uses()
                     if use.idx == p and use.node.graph is graph and use.node.op_identifier() == op}
        candidates.append(list(consumers))
    return candidates
